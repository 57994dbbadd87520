"""The kernel log: ``<root>/dev/kmsg`` in the kernel's record format (what its records say about
the GPUs: gpufacts/kernel.py).

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
    the patterns gpufacts/kernel.py ``findings`` names."""
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


_DRIVER_BANNER = "NVRM: loading NVIDIA UNIX"


def since_driver_load(messages: list[str]) -> list[str]:
    """The messages from the last time the nvidia module announced itself ("NVRM: loading NVIDIA
    UNIX ...") on; all of them when it never did. Earlier events belong to an earlier load."""
    starts = [i for i, msg in enumerate(messages) if msg.startswith(_DRIVER_BANNER)]
    return messages[starts[-1]:] if starts else messages
