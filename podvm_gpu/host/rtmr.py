"""TDX RTMR3 and the event logs that explain it: the register, CoCo's attestation-agent log
(AAEL), the firmware's CC event log (CCEL), and the replay that ties them (issue 37).

Facts this module is written to (read from the sources, not run on TDX; docs/interface.md 3.14):

* Linux 6.16's tdx-guest driver exposes ``/sys/class/misc/tdx_guest/measurements/rtmr3:sha384``
  (root, mode 0644). Reading it gives the register's 48 bytes; one ``write`` of exactly 48 bytes
  at offset 0 extends it to SHA-384(old || data); any other write is EINVAL. The kernel keeps no
  log of it. RTMR3 starts as 48 zero bytes.
* CoCo's attestation-agent (guest-components v0.15.0 and later) keeps its runtime log at
  ``/run/attestation-agent/eventlog``: TCG2 records (``TCG_PCR_EVENT2``), one after the other,
  each of type EV_EVENT_TAG (6) with one SHA-384 digest; the record's index is the CC
  measurement register (4: RTMR3). The event is the tagged event
  ``u32le 0x4141454c || u32le len(text) || text`` with text ``<domain> <operation> <content>``,
  and the digest is SHA-384 of the tagged event: the same 48 bytes are extended into RTMR3.
* The firmware's log, ``/sys/firmware/acpi/tables/data/CCEL``, is a TCG2 crypto-agile log: a
  first record in the SHA-1 format (the Spec ID event), then ``TCG_PCR_EVENT2`` records, then
  padding. Its index 4 records were extended into RTMR3 (EV_NO_ACTION records never are).

Everything reads and writes under a :class:`~podvm_gpu.host.fs.Root`; the register itself is
reached through :class:`Register`, the seam tests replace (a Python fake in unit tests,
tests/fake_rtmr's LD_PRELOAD shim for the scenario worlds). Standard library only; hashlib and
struct are imported when a log is built or read, never on the CPU fast path.
"""

from __future__ import annotations

import os

RTMR3_PATH = "/sys/class/misc/tdx_guest/measurements/rtmr3:sha384"
CCEL_PATH = "/sys/firmware/acpi/tables/data/CCEL"
EVENTLOG_PATH = "/run/attestation-agent/eventlog"
# AA's crash-recovery file beside its log (guest-components): never created here
WAL_NAME = ".wal_event_entry"
RTMR3_INDEX = 4  # the CC measurement-register index of RTMR3 (AA's PCR 17 maps there)
EV_NO_ACTION, EV_EVENT_TAG = 3, 6
TAG = 0x4141454C  # "AAEL" as u32le: its bytes on disk are LEAA
SHA384_ALG, SHA384_SIZE = 0x000C, 48
# TCG algorithm id -> digest size, for reading the records of a log that carries several banks
_DIGEST_SIZES = {0x0004: 20, 0x000B: 32, 0x000C: 48, 0x000D: 64, 0x0012: 32}
LOG_LIMIT = 16 << 20  # the most of a log read (the CCEL table is a few hundred KiB at most)


UNBOUND_REASON = (f"no {RTMR3_PATH} (a kernel before 6.16, not a TDX guest, or a TDX guest "
                  "under a paravisor)")


def present(root) -> bool:
    """Whether ``rtmr3:sha384`` exists under the root (a :class:`~podvm_gpu.host.fs.Root`): one
    ``stat``, all a VM without it pays on the CPU fast path."""
    return os.path.exists(root.path.rstrip("/") + RTMR3_PATH)


def binding_record(state: str, result: str | None = None, reason: str | None = None,
                   appended: bool = False, digest: str | None = None) -> dict:
    """The status' ``binding`` record (docs/status.schema.json; podvm_gpu/steps/cc/bind.py's
    states ``bound``, ``unbound``, ``broken``, ``off``)."""
    return {"state": state, "result": result, "appended": appended, "digest": digest,
            "reason": reason, "eventlog": EVENTLOG_PATH if state == "bound" else None}


class LogError(ValueError):
    """A log that cannot be read as TCG2 records; the message says where and why."""


class Record:
    """One TCG2 record of a log.

    Attributes:
        index: the CC measurement-register index (4: RTMR3).
        type: the TCG event type (6: EV_EVENT_TAG; 3: EV_NO_ACTION).
        digest: its SHA-384 digest (48 bytes), or None when the record carries none.
        event: the event's bytes.
        offset: where the record starts in its file, bytes.
    """

    __slots__ = ("index", "type", "digest", "event", "offset")

    def __init__(self, index: int, type_: int, digest: bytes | None, event: bytes, offset: int):
        self.index, self.type, self.digest, self.event, self.offset = \
            index, type_, digest, event, offset

    def text(self) -> str | None:
        """The AAEL text (``<domain> <operation> <content>``) of a tagged event, else None."""
        import struct

        if self.type != EV_EVENT_TAG or len(self.event) < 8:
            return None
        tag, size = struct.unpack_from("<II", self.event)
        if tag != TAG or size != len(self.event) - 8:
            return None
        try:
            return self.event[8:].decode("utf-8")
        except UnicodeDecodeError:
            return None


def tagged_event(domain: str, operation: str, content: str) -> bytes:
    """The AAEL tagged event: ``u32le 0x4141454c || u32le len(text) || text`` (UTF-8).

    Raises:
        ValueError: a domain or operation that is empty or holds white space, or a content
            with a line break (the AAEL specification's rules).
    """
    import struct

    for name, part in (("domain", domain), ("operation", operation)):
        if not part or any(c.isspace() for c in part):
            raise ValueError(f"an AAEL {name} must be non-empty without white space: {part!r}")
    if "\n" in content or "\r" in content:
        raise ValueError("an AAEL content must not hold a line break")
    text = f"{domain} {operation} {content}".encode("utf-8")
    return struct.pack("<II", TAG, len(text)) + text


def digest(event: bytes) -> bytes:
    """SHA-384 of a tagged event: the record's digest and what is extended into RTMR3."""
    import hashlib

    return hashlib.sha384(event).digest()


def entry(event: bytes, index: int = RTMR3_INDEX) -> bytes:
    """The AAEL record of a tagged event: u32le index || u32le 6 (EV_EVENT_TAG) || u32le 1 ||
    u16le 0x000C (SHA-384) || digest || u32le len(event) || event."""
    import struct

    return (struct.pack("<IIIH", index, EV_EVENT_TAG, 1, SHA384_ALG) + digest(event) +
            struct.pack("<I", len(event)) + event)


def extended(old: bytes, data: bytes) -> bytes:
    """What a register holding ``old`` holds after extending it with ``data``:
    SHA-384(old || data)."""
    import hashlib

    return hashlib.sha384(old + data).digest()


def cut_log(path: str, size: int) -> None:
    """Truncate the event log at host ``path`` to ``size`` bytes and fsync it (an entry taken
    back, or the crash window's records cut off); a link at ``path`` is refused.

    Raises:
        OSError: it cannot be opened (``ELOOP`` for a link), truncated or synced.
    """
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_records(data: bytes, spec_header: bool, name: str) -> list[Record]:
    """The TCG2 records of a log.

    Args:
        data: the log's bytes.
        spec_header: the log starts with the SHA-1 format Spec ID event (the CCEL); AA's log
            does not.
        name: the log's path, for the error.

    Returns:
        The records in order. A CCEL ends at its padding: a record whose index and type are
        both 0xFFFFFFFF or both 0, or the end of the data.

    Raises:
        LogError: a record cut short or with a digest of an unknown algorithm (AA's log: any
            bytes after its last whole record too).
    """
    import struct

    records: list[Record] = []
    at = 0
    size = len(data)
    if spec_header:
        if size < 32:
            raise LogError(f"{name}: shorter than its Spec ID event")
        (length,) = struct.unpack_from("<I", data, 28)
        at = 32 + length
        if at > size:
            raise LogError(f"{name}: its Spec ID event runs past the end")
    while at < size:
        start = at
        if size - at < 12:
            if spec_header:
                break
            raise LogError(f"{name}: a record cut short at byte {start}")
        index, type_, count = struct.unpack_from("<III", data, at)
        if spec_header and ((index, type_) == (0xFFFFFFFF, 0xFFFFFFFF) or
                            (index, type_) == (0, 0)):
            break  # the table's padding
        found, at = _digests(data, at + 12, count, start, name)
        if size - at < 4:
            raise LogError(f"{name}: the record at byte {start} is cut short")
        (length,) = struct.unpack_from("<I", data, at)
        at += 4
        if size - at < length:
            raise LogError(f"{name}: the record at byte {start} is cut short")
        records.append(Record(index, type_, found, data[at:at + length], start))
        at += length
    return records


def _digests(data: bytes, at: int, count: int, start: int, name: str) -> tuple[bytes | None, int]:
    """The SHA-384 digest (None when the record has none) of the ``count`` digests at byte
    ``at`` of the record that starts at byte ``start``, and the byte after them.

    Raises:
        LogError: a digest cut short or of an unknown algorithm (``name``: the log's path).
    """
    import struct

    size = len(data)
    found = None
    for _ in range(count):
        if size - at < 2:
            raise LogError(f"{name}: the record at byte {start} is cut short")
        (alg,) = struct.unpack_from("<H", data, at)
        width = _DIGEST_SIZES.get(alg)
        if width is None:
            raise LogError(f"{name}: the record at byte {start} has a digest of unknown "
                           f"algorithm 0x{alg:04x}")
        if size - at - 2 < width:
            raise LogError(f"{name}: the record at byte {start} is cut short")
        if alg == SHA384_ALG:
            found = data[at + 2:at + 2 + width]
        at += 2 + width
    return found, at


def replay(records: list[Record], index: int = RTMR3_INDEX,
           start: bytes = bytes(SHA384_SIZE)) -> bytes:
    """The register ``index`` after extending ``start`` (48 zero bytes: RTMR3's reset value)
    with the SHA-384 digest of every record for it, in order; EV_NO_ACTION records are not
    extended.

    Raises:
        LogError: a record for the register without a SHA-384 digest.
    """
    value = start
    for record in records:
        if record.index != index or record.type == EV_NO_ACTION:
            continue
        if record.digest is None:
            raise LogError(f"the record at byte {record.offset} has no SHA-384 digest")
        value = extended(value, record.digest)
    return value


class Register:
    """The kernel's RTMR3 file under a root: :meth:`read` and :meth:`extend`.

    The seam for tests: anything with the same two methods (tests' FakeRegister enforces the
    kernel's rules in Python).

    Args:
        path: the register's real path (already resolved under the root).
    """

    def __init__(self, path: str):
        self.path = path

    def read(self) -> bytes:
        """The register's 48 bytes.

        Raises:
            OSError: it cannot be read, or did not give 48 bytes (EIO).
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            value = os.pread(fd, SHA384_SIZE + 1, 0)
        finally:
            os.close(fd)
        if len(value) != SHA384_SIZE:
            import errno

            raise OSError(errno.EIO, f"read {len(value)} bytes, not {SHA384_SIZE}", self.path)
        return value

    def extend(self, data: bytes) -> int:
        """One ``write`` of ``data`` (48 bytes) at offset 0 on a fresh descriptor.

        Returns:
            What the write returned (48 when the kernel took it).

        Raises:
            OSError: the open or the write failed (EINVAL for anything but 48 bytes at 0).
        """
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)
