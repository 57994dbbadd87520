"""The kernel log as it arrives: ``<root>/dev/kmsg`` followed from a sequence number, without
busy polling.

Each line is parsed by :func:`podvm_gpu.host.kmsg.parse_line`, the one parser of the record
format (``<prio>,<seq>,<usec>,<flags>;<message>``; continuation lines starting with a space
dropped; Documentation/ABI/testing/dev-kmsg).
How new records are waited for depends on what the path is:

- the kernel's character device: each ``read(2)`` returns one record, ``EAGAIN`` when there is
  none, ``EPIPE`` when records were overwritten before they were read (the reader goes on with
  the oldest one left); ``poll(2)`` says when one arrives;
- a FIFO (tests): opened read-write, so it never reports end-of-file while no writer has it open;
- a regular file (``--root`` of a scenario world): read from the offset reached; inotify
  (``IN_MODIFY``, through libc) says when it grows; where inotify cannot be had, the file is
  looked at once a second.

Records a program wrote (syslog facility other than kernel) are skipped, as host/kmsg.py skips
them, except that :meth:`KernelLog.read` reports the boot's own final ``ready`` line
(podvm_gpu/journal.py ``tell_console``): that record is the position the boot reached.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import stat

from podvm_gpu.host.fs import Root
from podvm_gpu.host.kmsg import _MAX_MESSAGE, KMSG_PATH, Record, parse_line

_MAX_CHUNK = 64 * 1024  # one read of a growing file (about 1,500 records): bounds the batch
BOOT_READY = re.compile(r"podvm-gpu\[\d{1,10}\]: ready\b")
# inotify(7): IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF
_IN_MASK = 0x2 | 0x4 | 0x800 | 0x400


class KernelLog:
    """The kernel log under ``root``, opened for following.

    Raises:
        OSError: the log cannot be opened (no such file, no permission).
    """

    def __init__(self, root: Root):
        self.path = root.resolve(KMSG_PATH)
        info = os.stat(self.path)
        self.kind = "device" if stat.S_ISCHR(info.st_mode) else \
            "fifo" if stat.S_ISFIFO(info.st_mode) else "file"
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        flags |= os.O_RDWR if self.kind == "fifo" else os.O_RDONLY
        self.fd = os.open(self.path, flags)
        self.lost = 0  # times the kernel said records were overwritten before they were read
        self.more = False  # the last read stopped at its ``most``: records wait, no event will say so
        self._tail = b""
        self._notify = None
        if self.kind == "file":
            self._notify = _inotify(self.path)

    @property
    def event_driven(self) -> bool:
        """False only for a regular file without inotify (then looked at once a second)."""
        return self.kind != "file" or self._notify is not None

    def close(self) -> None:
        for fd in (self.fd, self._notify):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def wait_fd(self) -> int | None:
        """The descriptor whose readability says a record may have arrived (None: look again
        after a second)."""
        return self._notify if self.kind == "file" else self.fd

    def read(self, most: int = 1000) -> list[Record]:
        """The records that arrived since the last call, oldest first, at most about ``most``
        (the rest on the next call), continuation lines dropped."""
        out: list[Record] = []
        size = 8192 if self.kind == "device" else _MAX_CHUNK  # the device: one record a read
        while len(out) < most:
            try:
                chunk = os.read(self.fd, size)
            except OSError as err:
                if err.errno == errno.EPIPE:  # overwritten before we read them: go on
                    self.lost += 1
                    continue
                if err.errno in (errno.EAGAIN, errno.EINTR):
                    break
                raise
            if not chunk:
                break
            lines = (self._tail + chunk).split(b"\n")
            self._tail = lines.pop()[-_MAX_MESSAGE * 2:]  # a line not finished yet
            for line in lines:
                record = parse_line(line.decode("utf-8", errors="replace"))
                if record is not None:
                    out.append(record)
        self.more = len(out) >= most
        return out

    def wait(self, timeout_s: float, extra_fd: int | None = None) -> bool:
        """Block until a record may have arrived, ``extra_fd`` is readable, or ``timeout_s``
        passes (no busy loop). True when something is there to read (at once when the last read
        left records for the next)."""
        if self.more:
            return True
        fd = self.wait_fd()
        ready = wait_readable((fd, extra_fd), timeout_s if fd is not None else min(timeout_s, 1.0))
        if self._notify in ready:
            drain_events(self._notify)
        return bool(ready) or fd is None


def wait_readable(fds, timeout_s: float) -> list[int]:
    """Block until one of ``fds`` (descriptors; None ones are left out) is readable or
    ``timeout_s`` seconds pass, without a busy loop (``poll(2)``); the readable ones."""
    poller = select.poll()
    for fd in fds:
        if fd is not None:
            poller.register(fd, select.POLLIN)
    return [fd for fd, _event in poller.poll(max(0, int(timeout_s * 1000)))]


def drain_events(fd: int) -> None:
    """Read what waits on ``fd`` (a descriptor opened without blocking: inotify's, a wake-up
    pipe's) until nothing is left, so that the next wait on it waits for what comes next."""
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass


def _inotify(path: str) -> int | None:
    """An inotify descriptor watching ``path`` for growth; None when libc has none."""
    import ctypes

    try:  # the program's own symbols include libc's (no ldconfig lookup)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(path), _IN_MASK) < 0:
        os.close(fd)
        return None
    return fd
