"""What the kernel log says about the GPUs (issue 44 item 3): the patterns of the NVIDIA driver's
records, each a kind of finding, and the Xid records judged by the one Xid table
(podvm_gpu/gpufacts/xids.py). host/kmsg.py reads the log and parses its records; this module reads what
they mean, as gpufacts/finding.py's one finding type:

- ``level``: ``fail`` when the GPU cannot be used until it is reset (or the VM replaced): a fatal
  kind (:data:`FATAL_KINDS`), or an Xid the table calls fatal (its code, or for NVLink 5 codes
  144-150 the record's own ``Fatal``), then ``action`` is ``reset``; else ``warn``.
- ``kind``: ``xid``, ``fell-off-bus``, ``gsp-firmware``, ``bar``, ``needs-reset``,
  ``open-module-unsupported``, ``needs-open-module``, ``unsupported-pci-id``,
  ``bound-elsewhere``, ``api-mismatch``, ``lockdown``, ``no-device``, ``cc-not-enabled``,
  ``lkca-stubs``, ``swiotlb-full``, ``dma-mapping``, ``early-client``, ``cannot-attach``,
  ``decompress-failed``.
- ``what``: one line naming the facts (Xid code and PCI address, versions, ...); ``evidence``:
  the joined kernel message, quoted as it was; ``code``: the Xid code for ``xid``; ``gpu``: the
  PCI address the record names, when it names one.
"""

from __future__ import annotations

import re

from podvm_gpu.gpufacts import xids
from podvm_gpu.gpufacts.finding import FAIL, NONE, RESET, WARN, Finding, finding
from podvm_gpu.host.kmsg import join_nvrm


def describe(found: Finding) -> str:
    """A kernel finding in one line, the record quoted: ``<what> (kernel: "<record>")``."""
    return f'{found.what} (kernel: "{found.evidence}")'


_BUS = re.compile(r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?")


def _bus(pci: str | None) -> str | None:
    """The PCI address a record names, when what it names is one (a pattern's ``pci``)."""
    pci = (pci or "").rstrip(".")
    return pci if _BUS.fullmatch(pci) else None


def is_fatal(kind: str, code: int | None, message: str) -> bool:
    """Whether a record of ``kind`` (Xid ``code``) leaves the GPU unusable until it is reset."""
    return kind in FATAL_KINDS or kind == "xid" and xids.fatal(code, message)


# The kinds after which a GPU stays unusable until it is reset; an Xid is by the one Xid table
# (podvm_gpu/gpufacts/xids.py, NVIDIA's Xid catalog: 13, 31, 43, 45, ... are errors of one application
# and only become warnings; NVLink 5's 144-150 are fatal when their record says so).
FATAL_KINDS = frozenset({"fell-off-bus", "needs-reset", "gsp-firmware", "bar", "early-client"})
# The words every reason about a driver an early client re-initialised carries (issue 46 item 2;
# the kernel's line above, or NVML seeing fewer GPUs than /proc/driver/nvidia/gpus:
# podvm_gpu/gpufacts/early_client.py).
EARLY_CLIENT = ("the driver was re-initialised by an early client (a GPU client opened the "
                "GPUs before nvidia-persistenced; NVML then lists fewer GPUs than the driver "
                "attached)")
# The driver loaded but cannot attach (initialise) a GPU: every NVML client then fails ("No
# devices were found", "nvidia-persistenced failed to initialize"), so the log, not the client,
# names the cause. Most specific first; ``cannot-attach`` (RmInitAdapter failed) is the rest.
ATTACH_KINDS = ("needs-open-module", "cc-not-enabled", "lkca-stubs", "swiotlb-full", "dma-mapping", "cannot-attach")
# Every pattern below needs one of these words (lowercase) in the message.
_KEYWORDS = ("nvrm", "xid", "firmware", "bar", "reset", "lockdown", "fallen", "nvidia", "gsp",
             "libspdm", "swiotlb", "decompression failed")


class _Lazy:
    """A regular expression compiled on its first search: a CPU VM's log (and most of any log)
    never reaches one, and compiling all of them costs milliseconds at every start-up."""

    __slots__ = ("source", "flags", "needs", "_compiled")

    def __init__(self, source: str, flags: int = 0, needs: tuple[str, ...] = ()):
        self.source = source
        self.flags = flags
        # lowercase words one of which every match contains: a message without them is not
        # searched, so the banner and the usual lines compile nothing (about 20 ms a boot)
        self.needs = needs
        self._compiled: re.Pattern | None = None

    def may_match(self, lower: str) -> bool:
        """False when ``lower`` (the message, lowercased) cannot match: it lacks every need."""
        return not self.needs or any(word in lower for word in self.needs)

    def search(self, text: str) -> re.Match | None:
        if self._compiled is None:
            self._compiled = re.compile(self.source, self.flags)
        return self._compiled.search(text)


# Every gap between two parts of a pattern is bounded ({0,200}): an unbounded one makes the
# search quadratic on a long message that repeats the first part (a hostile or broken log).
XID_PATTERN = _Lazy(r"Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]{1,16})\): (?P<code>\d{1,5})",
                    needs=("xid (pci:",))
_PATTERNS: list[tuple[str, _Lazy, str]] = [
    ("xid", XID_PATTERN, "Xid {code} on GPU {pci}"),
    ("fell-off-bus", _Lazy(r"GPU (?:at PCI:)?(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:"
                                r"[0-9A-Fa-f]{2}(?:\.[0-7])?):.{0,200}fallen off the bus", re.I,
                           ("fallen off the bus",)),
     "GPU {pci} has fallen off the bus"),
    ("fell-off-bus", _Lazy(r"fallen off the bus", re.I, ("fallen off the bus",)),
     "a GPU has fallen off the bus"),
    ("gsp-firmware", _Lazy(r"(?P<path>(?<!\S)\S{0,200}gsp\S{0,200}\.bin)\b.{0,200}"
                                r"(?:not found|failed|missing)", re.I, ("gsp",)),
     "GSP firmware missing ({path})"),
    ("gsp-firmware", _Lazy(r"firmware.{0,200}(?:not found|failed|missing)|No firmware image "
                                r"found", re.I, ("firmware",)),
     "GSP firmware missing"),
    ("bar", _Lazy(r"BAR\s{0,3}\d{1,2}.{0,200}(?:not assigned|invalid|is 0M)|I/O region "
                       r"assigned to your NVIDIA device is invalid", re.I, ("bar", "i/o region")),
     "a PCI BAR of the GPU was not assigned by the VM"),
    ("needs-reset", _Lazy(r"(?:needs|requires?) (?:a )?(?:GPU )?reset|reset required", re.I,
                          ("reset",)),
     "a GPU needs a reset before the driver can take it"),
    ("open-module-unsupported", _Lazy(
        r"GPU (?P<pci>\S{1,32}) \(PCI ID: (?P<id>[0-9A-Fa-f:]{1,16})\).{0,200}not supported by "
        r"open\s+nvidia\.ko", re.I, ("(pci id:",)),
     "the open kernel module does not support GPU {pci} (PCI ID {id}); it needs the proprietary one"),
    # The proprietary module on a GPU only the open one drives (Blackwell; from R615 Turing+),
    # then "RmInitAdapter failed! (0x22:0x56:884)": field logs of 580.105.08; the words exist in
    # the proprietary build only (docs/compatibility.md). Joined records or one with ``\x0a``.
    ("needs-open-module", _Lazy(
        r"(?:GPU (?P<pci>[0-9A-Fa-f:.]{7,16}) \(PCI ID: (?P<id>[0-9A-Fa-f:]{1,16})\).{0,200}?)?"
        r"requires use of the NVIDIA open kernel modules", re.I, ("requires use of the nvidia open",)),
     "GPU {pci} (PCI ID {id}) requires NVIDIA's open kernel module; the proprietary one is loaded "
     "and attaches no such GPU: install the open module"),
    ("unsupported-pci-id", _Lazy(
        r"GPU (?P<pci>\S{1,32}) \(PCI ID: (?P<id>[0-9A-Fa-f:]{1,16})\).{0,200}not supported by "
        r"the\s+NVIDIA (?P<version>\S{1,32}) driver release", re.I, ("(pci id:",)),
     "the installed driver {version} does not support GPU {pci} (PCI ID {id})"),
    ("bound-elsewhere", _Lazy(r"GPU (?P<pci>\S{1,32}) is already bound to (?P<driver>[\w-]{1,32})",
                                   re.I, (" is already bound to ",)),
     "GPU {pci} is already bound to {driver}"),
    ("api-mismatch", _Lazy(
        r"API mismatch: the client has the version (?P<client>\S{1,32}?),? but\s+this kernel "
        r"module has the version (?P<kernel>[0-9.]{1,32}?)\.?\s", re.I, ("api mismatch: ",)),
     "user-space driver {client} does not match kernel module {kernel}"),
    ("lockdown", _Lazy(r"Lockdown: .{0,200}(?:unsigned module|module loading)", re.I,
                       ("lockdown: ",)),
     "kernel lockdown restricts unsigned module loading"),
    # 535.261.03 (Debian 12), proprietary and open module alike, when no GPU is there for it:
    # the module's init fails (modprobe: "No such device") after this line.
    ("no-device", _Lazy(r"^NVRM: No NVIDIA GPU found\.?$", 0, ("nvrm: no nvidia gpu found",)),
     "the nvidia module found no NVIDIA GPU to drive"),
    # A TDX or SEV-SNP guest given a GPU whose CC (or protected-PCIe) mode the host did not set:
    # "NVRM: confComputeConstructEngine_IMPL: GPU confidential compute capability is not
    # enabled.", then "osInitNvMapping: *** Cannot attach gpu" and "RmInitAdapter failed!
    # (0x22:0x3f:744)" (canonical/tdx#414 = NVIDIA/nvtrust#124, NVIDIA/gpu-operator#1851).
    ("cc-not-enabled", _Lazy(r"confComputeConstructEngine_IMPL:.{0,200}confidential compute "
                             r"capability is not enabled", re.I, ("confidential compute capab",)),
     "the host has not enabled confidential computing on the GPU (its CC or protected-PCIe mode "
     "is off) while this guest is confidential: set the mode on the host and reset the GPU"),
    # The open module's SPDM needs the kernel's crypto (LKCA); built without it, it has stubs and
    # CC mode fails: "libspdm_check_crypto_backend: Error - libspdm expects LKCA but found
    # stubs!" (aleph-im/aleph-vm#1271; the open module's internal_crypt_lib.h).
    ("lkca-stubs", _Lazy(r"libspdm expects LKCA but found stubs", re.I, ("lkca",)),
     "the nvidia module was built without the kernel crypto API (LKCA) that CC mode needs"),
    # A confidential guest's DMA goes through swiotlb bounce buffers; when they run out the
    # driver cannot map: "swiotlb buffer is full (sz: 524288 bytes), total 262144 (slots), used
    # 1044 (slots)" then "NVRM: ...: Failed to create a DMA mapping!" (canonical/tdx#292).
    ("swiotlb-full", _Lazy(r"swiotlb buffer is full \(sz: (?P<size>\d{1,12}) bytes\), total "
                           r"(?P<total>\d{1,12}) \(slots\), used (?P<used>\d{1,12})", re.I,
                           ("swiotlb buffer is full",)),
     "the swiotlb bounce buffer is full (a {size}-byte mapping refused; {used} of {total} slots "
     "used)"),
    ("dma-mapping", _Lazy(r"Failed to create a DMA mapping", re.I, ("dma mapping",)),
     "the driver could not create a DMA mapping"),
    # A GPU client (an NVML program, nvidia-drm's load) opened the GPUs before nvidia-persistenced
    # in a confidential multi-GPU guest: the driver loads and re-initialises, logs this assertion
    # and NVML then lists fewer GPUs than /proc/driver/nvidia/gpus (NVIDIA/nvtrust#109: "only 1
    # GPU shows up in nvidia-smi, while all have entries in /proc/driver/nvidia/gpus/*/information";
    # persistenced "needs to be the first entity to load the GPU kernel driver").
    ("early-client", _Lazy(r"pVGpu != NULL @ objvgpu\.c:\d{1,6}", 0, ("objvgpu.c",)),
     EARLY_CLIENT),
    ("cannot-attach", _Lazy(r"(?:GPU (?P<pci>[0-9A-Fa-f:.]{7,16}): )?RmInitAdapter failed! "
                            r"\((?P<code>0x[0-9A-Fa-f]{1,8}:0x[0-9A-Fa-f]{1,8}:\d{1,6})\)", 0,
                            ("rminitadapter failed",)),
     "the driver cannot attach GPU {pci} (RmInitAdapter failed {code})"),
    # The kernel's in-kernel module decompression (CONFIG_MODULE_DECOMPRESS=y) refused the file:
    # "xz decompression failed with status 6" (kernel/module/decompress.c; ublue-os/akmods#318,
    # NixOS/nixpkgs#549398); modprobe only says "Invalid argument", which an unknown module
    # parameter also gives, so this line decides.
    ("decompress-failed", _Lazy(r"(?P<algo>xz|zstd|gzip)? ?decompression failed with status "
                                r"(?P<status>-?\d{1,4})", re.I, ("decompression failed",)),
     "the kernel could not decompress the module (status {status})"),
]


# Every kind a Finding can have, in pattern order.
KINDS = tuple(dict.fromkeys(kind for kind, _pattern, _template in _PATTERNS))


def xid_records(messages: list[str]) -> list[tuple[str, int]]:
    """``(pci, code)`` of every Xid record in the kernel log, oldest first, repeats included,
    follow-ons of an Xid already seen left out (:func:`podvm_gpu.xids.counted_code`).

    Args:
        messages: records as :func:`read_kernel_log` returns them.

    ``pci`` is as the driver prints it, ``0000:01:00`` (domain:bus:device, no function). Unlike
    :func:`findings`, a repeated Xid counts each time (the metrics count them).
    """
    return [(pci, code) for pci, code, _fatal in xid_events(messages)]


def xid_events(messages: list[str]) -> list[tuple[str, int, bool]]:
    """``(pci, code, fatal)`` of every Xid record counted (as :func:`xid_records`), ``fatal``
    by the Xid table (podvm_gpu/gpufacts/xids.py: the code, or an NVLink 5 record's own word)."""
    return [(pci, code, fatal) for _usec, pci, code, fatal in _xids(
        (msg, None) for msg in messages)]


def timed_xids(records: list[tuple[int, str, int | None]]) -> list[tuple[int | None, str, int]]:
    """``(usec, pci, code)`` of every Xid record of :func:`read_timed_records`, oldest first,
    repeats included, follow-ons of an Xid already seen left out (as :func:`xid_records`, with
    the record's time)."""
    return [(usec, pci, code) for usec, pci, code, _fatal in _xids(
        (msg, usec) for _level, msg, usec in records)]


def _xids(pairs) -> list[tuple[int | None, str, int, bool]]:
    seen: set[int] = set()
    found = []
    for msg, usec in pairs:
        if "Xid" in msg:
            m = XID_PATTERN.search(msg)
            if m:
                code = xids.counted_code(int(m.group("code")), msg, seen)
                if code is not None:
                    found.append((usec, m.group("pci").lower(), code, xids.fatal(code, msg)))
    return found


def findings(messages: list[str], xids_seen: set[int] | None = None) -> list[Finding]:
    """The GPU-related problems in the (joined) kernel log, oldest first, without duplicates.

    Normal lines (taint notices, "module verification failed" on an unsigned but accepted module)
    yield nothing: the log explains a failure, it does not create one (contract section 9).
    An Xid record that says it was ``caused by previous Xid N`` of an Xid seen before it (in
    ``messages``, or in ``xids_seen``: the codes of earlier records, which this call adds to;
    the watcher judges one record at a time) is that Xid's follow-on, no finding of its own.
    """
    found: list[Finding] = []
    seen: set[str] = set()
    codes_seen = set() if xids_seen is None else xids_seen
    for msg in join_nvrm(messages):
        lower = msg.lower()
        if not any(word in lower for word in _KEYWORDS):
            continue  # most of a kernel log is about other devices: skip the patterns
        if "module verification failed" in msg or "taints kernel" in msg:
            continue
        for kind, pattern, template in _PATTERNS:
            m = pattern.search(msg) if pattern.may_match(lower) else None
            if not m:
                continue
            fields = {k: (v or "?").rstrip(".") for k, v in m.groupdict().items()}
            summary = template.format(**fields)
            code = int(fields["code"]) if kind == "xid" else None
            if code is not None:
                if xids.counted_code(code, msg, codes_seen) is None:
                    break  # a follow-on of an Xid already judged
                said = xids.label(code, msg) if code not in xids.WARN_XIDS else None
                if said:
                    summary = summary.replace(f"Xid {code}", f"Xid {code} ({said})")
            if summary not in seen:
                seen.add(summary)
                fatal = is_fatal(kind, code, msg)
                found.append(finding(FAIL if fatal else WARN, summary, action=RESET if fatal else NONE,
                                     gpu=_bus(m.groupdict().get("pci")), kind=kind, evidence=msg.strip(),
                                     code=code))
            break
    return found


