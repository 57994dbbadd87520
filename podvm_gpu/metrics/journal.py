"""The exporter's lines on stderr (the journal, under its unit): its own trouble only, at most
one line a minute of each kind, and never fatal.

A loop that fails the same way every time (a textfile whose folder is gone, written every
``textfile_interval_s``; accepting while out of file descriptors) would otherwise fill the
journal: 1426 lines in 3 s were seen. And a line that cannot be written (stderr a full disk or a
closed pipe) must not stop the serving: it is dropped. Standard library only.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import suppress

ONE_LINE_EVERY_S = 60.0


class Journal:
    """Lines of the exporter, each kind said at most once per ``every_s``.

    Args:
        every_s: seconds between two lines of one kind.
        clock: ``time.monotonic`` (tests give their own).
    """

    def __init__(self, every_s: float = ONE_LINE_EVERY_S, clock=time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._said: dict[str, float] = {}
        self._lock = threading.Lock()  # the selector, the workers and the textfile loop say

    def say(self, kind: str, line: str) -> bool:
        """Write ``podvm-gpu metrics: <line>`` unless a line of ``kind`` was said less than
        ``every_s`` ago; True when it was written (or tried: see :func:`say`)."""
        with self._lock:
            now = self._clock()
            last = self._said.get(kind)
            if last is not None and now - last < self.every_s:
                return False
            self._said[kind] = now
        say(line)
        return True


def say(line: str) -> None:
    """``podvm-gpu metrics: <line>`` on stderr, best effort: a stderr that cannot take it (a
    full disk, a closed pipe) loses the line, and the exporter goes on."""
    with suppress(OSError, ValueError):
        print(f"podvm-gpu metrics: {line}", file=sys.stderr, flush=True)
