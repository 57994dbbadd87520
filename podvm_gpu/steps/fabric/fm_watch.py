"""Is the fabric manager the fabric wait depends on still there (issue 28)?

NVSentinel#883: on an H100 HGX after maintenance a fabric manager's daemon died and it went
unnoticed for 20 days; here the fabric wait ran to its time-out (100 s of the 240 s budget for
8 GPUs) whenever a forking nv-fabricmanager's first process had exited 0 and its daemon then
died or never ran. The wait now checks the daemon as persistenced's is checked
(podvm_gpu/steps/persistenced.py): its pid file names a pid whose ``/proc/<pid>/comm`` is the daemon's.
"""

from __future__ import annotations

import time

from podvm_gpu.errors import StepFailed, ended_text
from podvm_gpu.host.daemons import Daemon
from podvm_gpu.readers import FABRICMANAGER_COMM, FABRICMANAGER_PID, daemon_pid

# A forking nv-fabricmanager's first process exits 0 once it has forked its daemon, which then
# writes its pid file; a first process that exited 0 gets this long for a live daemon to show up
# in FABRICMANAGER_PID before the wait ends (issue 28; persistenced's STARTED_GRACE_S is 0.5 s:
# the fabric manager's daemon opens its log and the driver's control file first).
FM_STARTED_GRACE_S = 2.0
SETTLE_S = 1.0  # how long a vanished daemon's supervisor gets to record how it ended


class FmWatch:
    """Is the fabric manager the wait depends on still there (issue 28, NVSentinel#883: a fabric
    manager whose daemon died after its first process exited 0 went unnoticed until the wait's
    time-out)? Its pid file and ``/proc/<pid>/comm``, as persistenced's are checked
    (readers.daemon_pid), plus what the supervisor reports (host/daemons.py: the exit systemd
    records, the journal's or the log's last lines).

    Args:
        root: the boot's root; daemon: the daemon the boot started, or None when one was
            already running (``pid``) or the fabric is managed outside the VM (both None).
    """

    def __init__(self, root, daemon: Daemon | None, pid: int | None = None):
        self.root, self.daemon, self.seen_pid = root, daemon, pid
        self.exited_0: float | None = None

    def running(self) -> int | None:
        return daemon_pid(self.root, FABRICMANAGER_PID, FABRICMANAGER_COMM)

    def check(self, last_seen: str) -> None:
        """One look, each poll.

        Raises:
            StepFailed: the started daemon exited non-zero or was killed; or a fabric manager
                that ran (its pid seen live) no longer does; or the first process exited 0 and
                no live daemon showed up within :data:`FM_STARTED_GRACE_S`. The reason names
                the exit where the supervisor reports one and the daemon's last lines.
        """
        daemon = self.daemon
        code = daemon.exit_status() if daemon is not None else None
        if code not in (None, 0):
            raise StepFailed(f"nv-fabricmanager {ended_text(code)}" + self._said()
                             + f"; last seen: {last_seen}")
        if daemon is None and self.seen_pid is None:
            return  # managed outside the VM: nothing of ours to watch
        pid = self.running()
        if pid is not None:
            self.seen_pid, self.exited_0 = pid, None
            return
        if self.seen_pid is not None:
            code = self._settled_exit()
            how = ended_text(code) if code else "is no longer running"
            raise StepFailed(f"nv-fabricmanager (pid {self.seen_pid}) {how} during the fabric "
                             "wait" + self._said() + f"; last seen: {last_seen}")
        if code == 0:
            self.exited_0 = self.exited_0 or time.monotonic()
            if time.monotonic() - self.exited_0 >= FM_STARTED_GRACE_S:
                raise StepFailed(f"nv-fabricmanager exited 0 but no fabric manager runs (no live "
                                 f"pid in {FABRICMANAGER_PID} {FM_STARTED_GRACE_S:g} s later)"
                                 + self._said() + f"; last seen: {last_seen}")

    def _settled_exit(self) -> int | None:
        """The daemon's exit as its supervisor records it, given up to :data:`SETTLE_S` to
        record it (systemd's unit state is read every 0.5 s: host/daemons.py UnitDaemon)."""
        if self.daemon is None:
            return None
        end = time.monotonic() + SETTLE_S
        while True:
            code = self.daemon.exit_status()
            if code is not None or time.monotonic() >= end:
                return code
            time.sleep(0.1)

    def _said(self) -> str:
        said = self.daemon.last_words() if self.daemon is not None else ""
        return f": {said}" if said else ""
