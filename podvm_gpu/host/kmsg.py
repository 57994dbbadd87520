"""The kernel log: ``<root>/dev/kmsg`` in the kernel's record format, and what it says about GPUs.

Contract section 9. A record is ``<prio>,<seq>,<usec>,<flags>;<message>``; lines that start with a
space continue the previous record as ``KEY=value`` pairs (Documentation/ABI/testing/dev-kmsg) and
are dropped. :func:`parse_line` is the one parser of the record for every reader of the log: the
log read whole here, once per boot (host/kmsg_once.py), followed by the watcher
(host/kmsg_follow.py). ``/dev/kmsg`` is read without blocking: each ``read()`` returns one record and
``EAGAIN`` ends the log; a plain file (tests, ``--root``) is read to its end. The NVIDIA driver
splits long messages over several ``NVRM:`` records; they are joined into one before they are read.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import stat

from podvm_gpu import xids
from podvm_gpu.host.fs import Root

KMSG_PATH = "/dev/kmsg"
_MAX_BYTES = 4 * 1024 * 1024  # the kernel ring buffer is at most a few MiB
_MAX_READ = 64 * 1024 * 1024  # a device that never ends (not a kernel log) is cut here
_MAX_MESSAGE = 4096  # a kernel record is at most about 1 KiB (PRINTK_MESSAGE_MAX)
_MAX_JOINED = 2048  # a joined NVRM message of the field is a few hundred characters
_MAX_JOIN = 8  # NVRM messages seen in the field span at most 4-5 records


def read_kernel_log(root: Root) -> list[str]:
    """Every message in the kernel log since boot, oldest first, without the record prefix
    (see :func:`read_kernel_records`)."""
    return [message for _level, message in read_kernel_records(root)]


def read_kernel_records(root: Root) -> list[tuple[int, str]]:
    """Every kernel record since boot as ``(level, message)``, oldest first: level is the
    syslog level (0 emerg ... 3 err ... 7 debug); a line without the record prefix gets 6
    (:func:`read_timed_records` without the time)."""
    return [(level, message) for level, message, _usec in read_timed_records(root)]


def read_timed_records(root: Root) -> list[tuple[int, str, int | None]]:
    """Every kernel record since boot as ``(level, message, usec)``: ``usec`` is the record's
    time stamp, microseconds since boot on the kernel's monotonic clock (the third field of the
    record prefix; None for a line without the prefix).

    The newest 4 MiB are kept (the kernel's ring buffer is at most a few MiB; a larger file is
    not a kernel log), and at most 64 MiB are read, so no file or device given as the log can
    hang the boot. Returns an empty list when the log cannot be read (no file, no permission).
    While a :class:`~podvm_gpu.host.kmsg_once.SharedLog` of ``root`` is open (a boot's GPU
    path), its records: the log read once, and after that only what was added to it.
    """
    shared = _SHARED
    if shared is not None and shared.root.path == root.path:
        return shared.timed_records()
    return _read_all(root)


def _read_all(root: Root) -> list[tuple[int, str, int | None]]:
    """:func:`read_timed_records` without a shared reader: the log opened and read to its end."""
    try:
        fd, _info, cut = open_log(root)
    except OSError:
        return []
    try:
        data, dropped = drain(fd)
    finally:
        os.close(fd)
    return kernel_records(data, cut or dropped)


def open_log(root: Root) -> tuple[int, os.stat_result | None, bool]:
    """``<root>/dev/kmsg`` opened without blocking: its descriptor, its ``fstat`` (None when
    that failed), and whether it is a plain file over 4 MiB read from its newest 4 MiB on (the
    first line read may then be the tail of a record).

    Raises:
        OSError: the log cannot be opened (no file, no permission).
    """
    fd = os.open(root.resolve(KMSG_PATH), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        cut = stat.S_ISREG(info.st_mode) and info.st_size > _MAX_BYTES
        if cut:
            os.lseek(fd, info.st_size - _MAX_BYTES, os.SEEK_SET)
    except OSError:
        return fd, None, False
    return fd, info, cut


def drain(fd: int) -> tuple[bytes, bool]:
    """What ``fd`` (the log, opened without blocking) gives until ``EAGAIN`` or its end, and
    whether older bytes were dropped: the newest 4 MiB are kept (the kernel's ring buffer is at
    most a few MiB; more is not a kernel log), at most 64 MiB are read (a device that never
    ends), records overwritten while read (``EPIPE``) are gone on from."""
    kept: collections.deque[bytes] = collections.deque()
    kept_bytes = read_bytes = 0
    dropped = False
    while read_bytes < _MAX_READ:
        try:
            chunk = os.read(fd, 65536)
        except OSError as err:
            if err.errno == errno.EPIPE:  # records overwritten while we read: go on
                continue
            break  # EAGAIN: the end of the live log
        if not chunk:
            break
        kept.append(chunk)
        kept_bytes += len(chunk)
        read_bytes += len(chunk)
        while kept_bytes - len(kept[0]) >= _MAX_BYTES:
            kept_bytes -= len(kept.popleft())
            dropped = True
    return b"".join(kept), dropped


_SHARED = None  # the open podvm_gpu.host.kmsg_once.SharedLog, or None


# The record prefix (Documentation/ABI/testing/dev-kmsg, printk's info_print_ext_header): prio
# (facility << 3 | level), sequence number, microseconds since boot, flags (``-`` or ``c``; a
# kernel with CONFIG_PRINTK_CALLER adds ``,caller=T<pid>`` or ``,caller=C<cpu>`` after them).
_RECORD = re.compile(r"(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]*")


class Record(collections.namedtuple("Record", "seq level message usec kernel")):
    """One record of the kernel log (:func:`parse_line`).

    Attributes:
        seq: its sequence number; level: its syslog level (0 emerg ... 3 err ... 7 debug);
        message: its text, at most 4096 characters; usec: its time stamp, microseconds since
        boot on the kernel's monotonic clock; kernel: whether the kernel wrote it (facility 0).
    """

    __slots__ = ()


def parse_line(line: str) -> Record | None:
    """One line of ``/dev/kmsg`` in the kernel's record format, ``<prio>,<seq>,<usec>,<flags>;
    <message>``: the one parser of the record, for every reader of the log (read whole here,
    once per boot by host/kmsg_once.py, followed by host/kmsg_follow.py). A ``;`` inside the
    message is kept. None for a line without the record prefix (a ``KEY=value`` continuation
    line, or a line that is no record)."""
    head, sep, message = line.partition(";")
    m = _RECORD.fullmatch(head) if sep else None
    if m is None:
        return None
    prio = int(m.group(1))
    return Record(int(m.group(2)), prio & 7, message[:_MAX_MESSAGE], int(m.group(3)),
                  prio >> 3 == 0)


def _timed(line: str) -> tuple[int, str, int | None] | None:
    """``(level, message, usec)`` of one line of the log read here: a kernel record, or a line
    without the record prefix taken as it is (level 6, no time); None for a record a program
    wrote (see :func:`parse_record`)."""
    record = parse_line(line)
    if record is None:
        return 6, line[:_MAX_MESSAGE], None
    return (record.level, record.message, record.usec) if record.kernel else None


def kernel_records(data: bytes, cut: bool = False) -> list[tuple[int, str, int | None]]:
    """The records of ``data`` (lines of the log) as :func:`read_timed_records` returns them:
    continuation lines (starting with a space) and programs' records dropped. ``cut``: the
    first line may be the tail of a record (the log was read from its middle): dropped too."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    found = (_timed(line) for line in lines if line and not line.startswith(" "))
    return [record for record in found if record is not None]


def parse_record(line: str) -> str | None:
    """The message of one kmsg record; a line without the record prefix is taken as it is.

    None for a record a program wrote (its syslog facility is not 0, kernel): /dev/kmsg gives
    every program-written record a facility (``user`` when it names none), so the kernel's own
    messages are told apart, and the agent never reads its own console line back as evidence.
    """
    timed = _timed(line)
    return timed[1] if timed else None


# Messages of the NVIDIA kernel modules: "NVRM: ...", "nvidia: ...", "nvidia-uvm: ...",
# "nvidia 0000:00:04.0: ..." (dev_err), "nvidia-modeset: ...", "nvidia-nvlink: ...", and the
# driver's err-level records without a prefix: the open module's libspdm glue prints
# "libspdm_check_crypto_backend: Error - ..." through nv_printf at level err (aleph-im/aleph-vm#1271).
_NVIDIA_MESSAGE = re.compile(r"(?:NVRM:|nvidia(?:[-_][a-z]+)?[: ]|libspdm_)")


def driver_errors(records: list[tuple[int, str]], most: int = 3) -> list[str]:
    """The error records (level err or worse) the NVIDIA modules printed since the driver last
    announced itself, NVRM messages joined, newest ``most`` of them: what the driver said about
    a failure whatever it was (``RmInitAdapter failed``, an SPDM check in CC mode, ...), beyond
    the patterns :func:`findings` names."""
    starts = [i for i, (_level, m) in enumerate(records) if m.startswith(_DRIVER_BANNER)]
    since = records[starts[-1]:] if starts else records
    errors = [m for level, m in since if level <= 3 and _NVIDIA_MESSAGE.match(m)
              and "taints kernel" not in m and "module verification failed" not in m]
    joined = list(dict.fromkeys(join_nvrm(errors)))
    return [" ".join(m.split())[:300] for m in joined[-most:]]


def join_nvrm(messages: list[str]) -> list[str]:
    """Join the driver's multi-record ``NVRM:`` messages into one message each.

    A message continues on the next ``NVRM:`` record until a record ends a sentence
    (``.``, ``!`` or ``?``), up to 8 records. Other messages pass through unchanged.
    """
    out: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            out.append(("NVRM: " + " ".join(pending))[:_MAX_JOINED])
            pending.clear()

    for msg in messages:
        if not msg.startswith("NVRM:"):
            flush()
            out.append(msg)
            continue
        body = msg[len("NVRM:"):].strip()
        if pending and body.startswith("Xid"):
            flush()
        pending.append(body)
        if body.endswith((".", "!", "?")) or len(pending) >= _MAX_JOIN:
            flush()
    flush()
    return out


# A named tuple rather than a frozen dataclass: ``import dataclasses`` pulls in ``inspect``,
# several milliseconds of start-up for ``podvm-gpu metrics``, which reads the log too.
class Finding(collections.namedtuple("Finding", "kind summary message code", defaults=(None,))):
    """One thing the kernel log says about the GPUs.

    Attributes:
        kind: ``xid``, ``fell-off-bus``, ``gsp-firmware``, ``bar``, ``needs-reset``,
            ``open-module-unsupported``, ``needs-open-module``, ``unsupported-pci-id``, ``bound-elsewhere``,
            ``api-mismatch``, ``lockdown``, ``no-device``, ``cc-not-enabled``, ``lkca-stubs``,
            ``swiotlb-full``, ``dma-mapping``, ``early-client``, ``cannot-attach``,
            ``decompress-failed``.
        summary: one line naming the facts (Xid code and PCI address, versions, ...).
        message: the joined kernel message, quoted as it was.
        code: the Xid code for ``xid``, else None.
    """

    __slots__ = ()

    @property
    def fatal(self) -> bool:
        """True when the GPU cannot be used until it is reset (or the VM replaced): a fatal
        kind, or an Xid the table of podvm_gpu/xids.py calls fatal (its code, or for NVLink 5
        codes 144-150 the record's own ``Fatal``)."""
        return self.kind in FATAL_KINDS or self.kind == "xid" and xids.fatal(self.code,
                                                                             self.message)

    def describe(self) -> str:
        return f'{self.summary} (kernel: "{self.message}")'


# Xid codes after which a GPU stays unusable until it is reset: the one Xid table's
# (podvm_gpu/xids.py, NVIDIA's Xid catalog). Others (13, 31, 43, 45, ...) are errors of one
# application and only become warnings; NVLink 5's 144-150 are fatal when their record says so.
FATAL_XIDS = xids.FATAL_XIDS
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
_DRIVER_BANNER = "NVRM: loading NVIDIA UNIX"
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
    by the Xid table (podvm_gpu/xids.py: the code, or an NVLink 5 record's own word)."""
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
                found.append(Finding(kind, summary, msg.strip(), code))
            break
    return found


def since_driver_load(messages: list[str]) -> list[str]:
    """The messages from the last time the nvidia module announced itself ("NVRM: loading NVIDIA
    UNIX ...") on; all of them when it never did. Earlier events belong to an earlier load."""
    starts = [i for i, msg in enumerate(messages) if msg.startswith(_DRIVER_BANNER)]
    return messages[starts[-1]:] if starts else messages
