"""Value types shared by boot, status and check: PCI devices, steps, the status document.

Plain classes rather than dataclasses or enums: ``import dataclasses`` pulls in ``inspect`` and
``import enum`` costs about 4 ms, each more than the rest of the CPU fast path, which builds a
Status too. The states and results are plain strings, as status.json holds them.
"""

from __future__ import annotations

import time

NVIDIA_VENDOR_ID = "10de"

# Contract section 3, step 1: compare the top 16 bits of the 24-bit PCI class code exactly.
GPU_CLASSES = frozenset({"0300", "0302"})  # VGA compatible controller, 3D controller
NVSWITCH_CLASS = "0680"  # bridge, other (how NVSwitches enumerate)

# A reason (and a step's message, a warning) is one line for the status file, the unavailable
# spec's env and the console, whatever a tool printed: longer ones are cut.
REASON_MAX = 1000

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f)}


def shown(text: str) -> str:
    """``text`` for a terminal, the journal, the console and a reason: control characters (ESC,
    BEL, NUL, newlines: C0 and DEL) as ``\\xNN``, so a status file or a config key cannot move
    the cursor or clear the screen of the engineer reading it, nor put a NUL in a spec; a lone
    surrogate (a file name's byte that is not UTF-8, as ``os.fsdecode`` gives it: U+DC80-U+DCFF)
    as ``\\xNN`` of the original byte, any other lone surrogate as ``\\uXXXX``, so the text is
    UTF-8 that every reader of status.json and the spec takes (issue 47)."""
    text = text.translate(_CONTROL)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_surrogate(c) if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


def _surrogate(c: str) -> str:
    code = ord(c)
    return f"\\x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff else f"\\u{code:04x}"


def cut_reason(text: str, tail: str = "") -> str:
    """The one cut of a reason (and of a step's message, a warning): ``text`` and ``tail``
    folded to one line (whitespace runs as one space), :func:`shown`, at most
    :data:`REASON_MAX` characters. ``tail`` (what went wrong after the reason was made, with
    its ``; `` joint: ``; cdi: cannot write ...``) is kept whole, up to ``REASON_MAX - 200``
    characters, and ``text`` is cut before it, ending `` ...`` when cut.

    Args:
        text: the reason; tail: the clauses appended to it, or ``""``.
    """
    tail = shown(" ".join(tail.split()))[:REASON_MAX - 200]
    head, room = shown(" ".join(str(text).split())), REASON_MAX - len(tail)
    if len(head) > room:
        head = head[:room - 4].rstrip() + " ..."
    return head + tail


def shown_all(value):
    """``value`` (status.json's document: dicts, lists, strings, numbers) with :func:`shown`
    applied to every string in it, keys included; other values as they are."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown(k) if isinstance(k, str) else k: shown_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown_all(v) for v in value]
    return value


class State:
    """Readiness states of status.json (contract section 4), as the strings the file holds."""

    RUNNING = "running"
    READY = "ready"
    NO_GPU = "no-gpu"
    FAILED = "failed"
    ALL = (RUNNING, READY, NO_GPU, FAILED)
    FINAL = frozenset({READY, NO_GPU, FAILED})


class StepResult:
    """Results of one boot step (contract section 4, ``steps[].result``)."""

    RUNNING = "running"
    OK = "ok"
    SKIPPED = "skipped"
    FAILED = "failed"
    ALL = (RUNNING, OK, SKIPPED, FAILED)


def now_iso() -> str:
    """The current UTC time as ISO 8601 with microseconds and offset, as status.json uses.

    Formatted with ``time`` rather than ``datetime``, which the CPU fast path need not import.
    """
    now = time.time()
    seconds = int(now)
    micros = min(int((now - seconds) * 1_000_000), 999_999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}+00:00"


def classify(vendor_id: str, class_code: str) -> str | None:
    """Classify a PCI function as ``"gpu"``, ``"nvswitch"`` or None (ignored).

    Args:
        vendor_id: 4 hex digits, with or without ``0x`` (``"10de"``).
        class_code: the 24-bit class code as 6 hex digits, with or without ``0x`` (``"030200"``).

    Rule: contract section 3 step 1 (vendor 0x10de; class 0x0300xx/0x0302xx GPU, 0x0680xx
    NVSwitch; everything else, such as the emulated VGA or an NVIDIA audio function, ignored).
    """
    vendor = vendor_id.lower().removeprefix("0x").zfill(4)
    if vendor != NVIDIA_VENDOR_ID:
        return None
    top = class_code.lower().removeprefix("0x").zfill(6)[:4]
    if top in GPU_CLASSES:
        return "gpu"
    if top == NVSWITCH_CLASS:
        return "nvswitch"
    return None


class PciDevice:
    """One NVIDIA PCI function as status.json lists it (contract section 4).

    Attributes:
        pci_address: domain:bus:device.function, e.g. ``0000:00:04.0``.
        vendor_id, device_id: 4 lowercase hex digits without ``0x``.
        class_code: 6 lowercase hex digits without ``0x``.
        driver: the bound kernel driver's name, or None when unbound.
        name: a human name (``H100 PCIe``), the udev hardware database name, or the ids.
    """

    __slots__ = ("pci_address", "vendor_id", "device_id", "class_code", "driver", "name")

    def __init__(self, pci_address: str, vendor_id: str, device_id: str, class_code: str,
                 driver: str | None, name: str):
        self.pci_address = pci_address
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.class_code = class_code
        self.driver = driver
        self.name = name

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PciDevice) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.pci_address)

    def __repr__(self) -> str:
        return f"PciDevice({self.pci_address}, {self.vendor_id}:{self.device_id}, {self.driver})"


class Step:
    """One boot step's record in status.json."""

    def __init__(self, name: str, result: StepResult = StepResult.RUNNING, message: str = ""):
        self.name = name
        self.result = result
        self.started_at = now_iso()
        self.started = time.monotonic()  # for the duration of a step that never returned
        self.duration_s = 0.0
        self.message = message

    def to_dict(self) -> dict:
        return {"name": self.name, "result": self.result, "started_at": self.started_at,
                "duration_s": round(self.duration_s, 6), "message": self.message}


class Status:
    """The status document, version 3 (contract section 4): version 2 and ``binding``."""

    def __init__(self) -> None:
        self.state = State.RUNNING
        self.reason: str | None = None
        self.warnings: list[str] = []
        self.started_at = now_iso()
        self.finished_at: str | None = None
        self.gpus: list[PciDevice] = []
        self.nvswitches: list[PciDevice] = []
        self.driver_version: str | None = None
        self.nvidia_ctk_version: str | None = None  # steps/cdi/toolkit.py, once the cdi step read it
        self.cdi: dict | None = None
        self.fabric = None  # podvm_gpu.steps.fabric.fabric_kind.Fabric (anything with to_dict()), GPU path
        # podvm_gpu.steps.cc.classify.CcAnswers (anything with to_dict()), once the CC step read it
        self.confidential_computing = None
        self.steps: list[Step] = []
        self.attestation: dict | None = None  # podvm_gpu/steps/cc/attest/gate.py's record
        self.initdata: dict | None = None  # podvm_gpu/initdata.py's record, when configured
        self.binding: dict | None = None  # podvm_gpu/steps/cc/bind.py's record, at the end
        # podvm_gpu/steps/cc/identity.py (issue 45): [{index, bus_id, uuid, ueid}] the GPUs the
        # attestation's verdict covers
        self.attested_gpus: list[dict] = []
        # podvm_gpu/gpufacts/attach.py (issue 46): persistenced's rate and the kernel log's
        # attach marks with their intervals, once the persistenced step began
        self.attach: dict | None = None

    def to_dict(self) -> dict:
        return {
            "version": 3,
            "state": self.state,
            "reason": self.reason,
            "warnings": list(self.warnings),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "gpus": [g.to_dict() for g in self.gpus],
            "nvswitches": [s.to_dict() for s in self.nvswitches],
            "driver_version": self.driver_version,
            "nvidia_ctk_version": self.nvidia_ctk_version,
            "cdi": self.cdi,
            "fabric": self.fabric.to_dict() if self.fabric is not None else None,
            "confidential_computing": (self.confidential_computing.to_dict()
                                       if self.confidential_computing is not None else None),
            "steps": [s.to_dict() for s in self.steps],
            "attestation": self.attestation,
            "initdata": self.initdata,
            "binding": self.binding,
            "attested_gpus": list(self.attested_gpus),
            "attach": self.attach,
        }
