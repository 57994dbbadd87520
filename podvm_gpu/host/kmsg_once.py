"""The kernel log read once for a whole boot (issue 38): :class:`SharedLog`, through which every
reader of :mod:`podvm_gpu.host.kmsg` goes while one is open. A module of its own: only the GPU
path needs it, and the CPU fast path never imports it."""

from __future__ import annotations

import collections
import os
import stat

from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root


class SharedLog:
    """One root's kernel log read once for a whole boot (issue 38: seven reads of the same log
    were a boot's largest own cost after Python's start): opened on the first read, each later
    read takes only the records added since (``/dev/kmsg`` gives a reader that stays open the
    next records; a plain file is read on from where it ended), so a step sees the driver's
    records of the modprobe before it. Every reader of the log (:func:`read_timed_records`,
    :func:`read_kernel_records`, :func:`read_kernel_log`) goes through it while it is open.

    The limits of :func:`read_timed_records` hold: the newest 4 MiB of records are kept, and one
    read takes at most 64 MiB. A plain file that was replaced or shortened is read again from its
    start. Safe for the parallel steps' threads (one lock). Use as a context manager, or
    :meth:`open`/:meth:`close`; one is open at a time (a second replaces the first until closed).

    Attributes:
        root: the root whose ``/dev/kmsg`` it reads.
        opens: how often the log was opened (1 for a boot; the tests count it).
    """

    def __init__(self, root: Root):
        import threading  # the GPU path only: a CPU VM's boot never shares a log

        self.root = root
        self.opens = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._regular = False
        self._ident: tuple[int, int] | None = None
        self._pending = b""  # a plain file's last line, not yet ended
        self._cut = False
        self._records: collections.deque = collections.deque()
        self._bytes = 0
        self._previous: SharedLog | None = None

    def open(self) -> "SharedLog":
        self._previous, kmsg._SHARED = kmsg._SHARED, self
        return self

    def close(self) -> None:
        if kmsg._SHARED is self:
            kmsg._SHARED = self._previous
        with self._lock:
            self._drop_fd()

    __enter__ = open

    def __exit__(self, *_exc) -> None:
        self.close()

    def timed_records(self) -> list[tuple[int, str, int | None]]:
        """The records so far, as :func:`read_timed_records` returns them; reads what is new."""
        with self._lock:
            self._read_new()
            records = list(self._records)
            last = self._pending  # a file's line not ended yet
        return records + kmsg.kernel_records(last)

    def _drop_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _reset(self) -> None:
        self._drop_fd()
        self._records.clear()
        self._bytes = 0
        self._pending = b""
        self._cut = False

    def _read_new(self) -> None:
        if self._fd is not None and self._regular and self._replaced():
            self._reset()
        if self._fd is None and not self._open():
            return
        data, dropped = kmsg.drain(self._fd)
        if dropped:  # more than the window is new: what was pending is not continued
            self._pending, self._cut = b"", True
        data = self._pending + data
        if self._regular:
            data, _sep, self._pending = data.rpartition(b"\n") if b"\n" in data else \
                (b"", b"", data)
        for record in kmsg.kernel_records(data, self._cut):
            self._records.append(record)
            self._bytes += len(record[1]) + 1
        if data:
            self._cut = False
        while self._bytes > kmsg._MAX_BYTES and self._records:
            self._bytes -= len(self._records.popleft()[1]) + 1

    def _open(self) -> bool:
        try:
            self._fd, info, self._cut = kmsg.open_log(self.root)
        except OSError:
            return False
        self.opens += 1
        if info is not None:
            self._regular = stat.S_ISREG(info.st_mode)
            self._ident = (info.st_dev, info.st_ino)
        return True

    def _replaced(self) -> bool:
        """Whether the plain file under the path is another one now, or shorter than read."""
        try:
            info = os.stat(self.root.resolve(kmsg.KMSG_PATH))
            return (info.st_dev, info.st_ino) != self._ident or \
                info.st_size < os.lseek(self._fd, 0, os.SEEK_CUR)
        except OSError:
            return False
