"""A Python fake of the kernel's ``rtmr3:sha384`` (podvm_gpu/host/rtmr.py's Register seam) and
builders of the logs a relying party replays: a synthetic CCEL and AA's log.

The fake keeps the kernel's rules (Linux 6.16, drivers/virt/coco/tdx-guest through tsm-mr):
reads give the 48 bytes; one write of exactly 48 bytes at offset 0 extends the value to
SHA-384(old || data); anything else is EINVAL. Its failure modes stand for what the agent must
survive: ``refuse`` (the write fails, EIO), ``wrong`` (the write returns 48 but the register
holds something else after it).
"""

from __future__ import annotations

import errno
import hashlib
import struct

ZERO = bytes(48)


class FakeRegister:
    """RTMR3 as the kernel keeps it. ``writes`` records every write's length and offset."""

    def __init__(self, value: bytes = ZERO, refuse: bool = False, wrong: bool = False):
        self.value, self.refuse, self.wrong = value, refuse, wrong
        self.writes: list[tuple[int, int]] = []

    def read(self) -> bytes:
        return self.value

    def write(self, data: bytes, offset: int = 0) -> int:
        """The kernel's write handler: 48 bytes at offset 0, else EINVAL."""
        self.writes.append((len(data), offset))
        if len(data) != 48 or offset != 0:
            raise OSError(errno.EINVAL, "Invalid argument")
        if self.refuse:
            raise OSError(errno.EIO, "Input/output error")
        self.value = hashlib.sha384(self.value + bytes(data)).digest()
        if self.wrong:
            self.value = hashlib.sha384(b"someone else" + self.value).digest()
        return 48

    def extend(self, data: bytes) -> int:
        """What podvm_gpu.host.rtmr.Register.extend does: one write at offset 0 of a fresh
        descriptor."""
        return self.write(data, 0)


def record(index: int, type_: int, digest: bytes, event: bytes) -> bytes:
    """A TCG_PCR_EVENT2 with one SHA-384 digest, built field by field (not by the product)."""
    return (struct.pack("<III", index, type_, 1) + struct.pack("<H", 0x000C) + digest +
            struct.pack("<I", len(event)) + event)


def ccel(events: list[tuple[int, int, bytes]], padding: int = 64) -> bytes:
    """A CCEL: the SHA-1 format Spec ID event, TCG_PCR_EVENT2 records of ``(index, type,
    event)`` (digest = SHA-384 of the event), then 0xFF padding as the ACPI table has."""
    spec = (b"Spec ID Event03\x00" + struct.pack("<IBBBB", 0, 0, 2, 0, 2) +
            struct.pack("<I", 1) + struct.pack("<HH", 0x000C, 48) + b"\x00")
    head = struct.pack("<II", 0, 3) + bytes(20) + struct.pack("<I", len(spec)) + spec
    body = b"".join(record(i, t, hashlib.sha384(e).digest(), e) for i, t, e in events)
    return head + body + b"\xff" * padding


def tagged(text: str) -> bytes:
    """The AAEL tagged event of ``text``: u32le 0x4141454c || u32le len || text."""
    raw = text.encode()
    return struct.pack("<II", 0x4141454C, len(raw)) + raw


def aael(texts: list[str]) -> bytes:
    """AA's log of these event texts, each extended into RTMR3 (index 4)."""
    return b"".join(record(4, 6, hashlib.sha384(tagged(t)).digest(), tagged(t)) for t in texts)


def replayed(digests: list[bytes], start: bytes = ZERO) -> bytes:
    value = start
    for d in digests:
        value = hashlib.sha384(value + d).digest()
    return value
