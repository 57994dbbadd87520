"""The agent's lines: one per event in the journal (:class:`Log`, on stderr, which systemd sends
to the journal) and the final state line on the console (:func:`tell_console`, through the
kernel log, which the serial console prints: in a confidential VM nobody can log in, and the
cloud's console log is where an operator looks). Boot and the watcher both say their lines
here.

Imported on every pod VM boot: standard library only.
"""

from __future__ import annotations

import os
import sys

from podvm_gpu.host.fs import Root
from podvm_gpu.model import State, Step, StepResult, shown

KMSG_PATH = "/dev/kmsg"
# syslog facility daemon (3) with level err (3) or notice (5): what /dev/kmsg takes from a
# program (a record without a facility gets "user"); the console prints err even with "quiet".
_KMSG_PRIORITY = {State.FAILED: (3 << 3) | 3, State.READY: (3 << 3) | 5,
                  State.NO_GPU: (3 << 3) | 5}
_KMSG_MAX = 900  # a kernel record holds about 1 KiB


class Log:
    """One line per event on stderr, which systemd sends to the journal.

    Under systemd (``JOURNAL_STREAM`` set) each line starts with a syslog priority prefix
    (``<3>`` error, ``<4>`` warning, ``<6>`` info) that journald turns into the entry's priority;
    in a terminal the prefix is left out.
    """

    ERR, WARNING, INFO = 3, 4, 6

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.prefix = bool(os.environ.get("JOURNAL_STREAM"))

    def __call__(self, priority: int, text: str) -> None:
        label = {3: "error: ", 4: "warning: "}.get(priority, "")
        head = f"<{priority}>" if self.prefix else ""
        try:  # control characters (a config's ESC or NUL) escaped: one line, no terminal codes
            print(f"{head}podvm-gpu: {label}{shown(text)}", file=self.stream, flush=True)
        except (OSError, ValueError):
            pass  # a closed stderr must not fail the boot

    def step(self, step: Step) -> None:
        priority = self.ERR if step.result == StepResult.FAILED else self.INFO
        message = f": {step.message}" if step.message else ""
        self(priority, f"{step.name} {step.result} in {step.duration_s:.3f} s{message}")


def tell_console(root: Root, state: str, reason: str) -> None:
    """Write the final state line to the kernel log (``<root>/dev/kmsg``), which the console
    prints: ``podvm-gpu[PID]: failed: <reason>``.

    Only into a character device (the real kernel log) or a FIFO (tests read one), opened
    without blocking and without following a link; a write to /dev/kmsg never waits for the
    console. Nothing is raised: the line is a courtesy, the status file is the record. The
    kernel log reader (host/kmsg.py) skips records that do not come from the kernel, so the
    agent never reads its own lines back as evidence.
    """
    try:
        fd = os.open(root.resolve(KMSG_PATH, follow_last=False),
                     os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return
    try:
        mode = os.fstat(fd).st_mode
        if (mode & 0o170000) in (0o020000, 0o010000):  # S_IFCHR, S_IFIFO
            text = shown(" ".join(f"podvm-gpu[{os.getpid()}]: {state}: {reason}".split()))
            os.write(fd, f"<{_KMSG_PRIORITY.get(state, 29)}>{text[:_KMSG_MAX]}\n".encode(
                "utf-8", errors="replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
