"""Step 6, ``persistenced``: start nvidia-persistenced and wait, bounded, until it is ready.

It comes before every NVML client (fabric-manager polling, nvidia-smi, CDI generation): without
it each client initialises and tears down the GPUs again, which is slow and, in confidential-
computing mode, harmful. Ready means its socket exists; running means its pid file names a pid
whose ``/proc/<pid>/comm`` is the daemon's. The wait is ``ready_timeout_s + per_gpu_s * GPUs``
because initialisation time grows with the GPU count; ``per_gpu_s`` unset follows the slowest
architecture present (gpufacts/attach.py: Blackwell 35 s, Hopper and older 15 s). Ready also needs the daemon running: a
socket left by an earlier daemon does not count. The daemon runs in a unit of its own under
systemd (host/daemons.py), so it outlives the boot whatever the boot's outcome; a daemon still
initialising when the wait ends is left running: it is never killed mid-way.
"""

from __future__ import annotations

import os
import time

from podvm_gpu.errors import StepFailed, ended_text
from podvm_gpu.gpufacts import early_client
from podvm_gpu.gpufacts.attach import DEFAULT_RATE_S, AttachMarks, check_fits, rate_for
from podvm_gpu.host import kmsg
from podvm_gpu.host.daemons import STARTED_GRACE_S, Daemon, RefusedStart, start_persistenced
from podvm_gpu.readers import PERSISTENCED_COMM, PERSISTENCED_PID, PERSISTENCED_SOCKET, daemon_pid
from podvm_gpu.row import FAIL, PASS, WARN, Check
from podvm_gpu.steps.context import BootContext

# A stat while there is no socket (then two small reads): the socket is seen within 2 ms, at
# ~1% of a core. The wait is on every GPU boot's critical path, and 10 ms polls lost 5 ms of it
# on average (issue 38).
POLL_S = 0.002
# the kernel log is read for attach marks (gpufacts/attach.py) at most this often during the wait
MARK_POLL_S = 0.5
LOG_PATH = "/run/podvm-gpu/nvidia-persistenced.log"


class Seen:
    """What the daemon's pid file and socket say, and what that means: the one decision that
    boot's wait (:func:`run`) and check's row (:func:`persistenced_row`) both act on.

    Args:
        socket: its socket exists.
        pid: the running daemon's pid (its pid file names a process whose comm is the
            daemon's), or None; or a function of no arguments that reads it, called at most
            once and only when needed: the boot's wait asks :attr:`ready` every 2 ms, and
            while there is no socket the pid file is not read.
    """

    __slots__ = ("socket", "_pid")
    NOT_RUNNING, STARTING, READY = "not running", "starting", "ready"

    def __init__(self, socket: bool, pid):
        self.socket, self._pid = socket, pid

    @property
    def pid(self) -> int | None:
        if callable(self._pid):
            self._pid = self._pid()
        return self._pid

    @property
    def ready(self) -> bool:
        """Running with its socket there (the socket is looked at first)."""
        return self.socket and self.pid is not None

    @property
    def state(self) -> str:
        """:data:`READY` (running, socket there), :data:`STARTING` (running, no socket yet:
        still initialising) or :data:`NOT_RUNNING` (a socket alone, left by an earlier daemon,
        does not count)."""
        if self.pid is None:
            return self.NOT_RUNNING
        return self.READY if self.socket else self.STARTING


def _pid_of(root):
    return daemon_pid(root, PERSISTENCED_PID, PERSISTENCED_COMM)


def look(root) -> Seen:
    """The daemon as the root shows it now (:class:`Seen`; check's row)."""
    return Seen(root.exists(PERSISTENCED_SOCKET), _pid_of(root))


class NotStarted(StepFailed, RefusedStart):
    """The daemon's first process exited 0 but no daemon runs: it refused to start (an option
    it does not know, with nvidia-persistenced 535.171.04). ``said`` is its last words."""


def wait_for(ctx: BootContext, ready, daemon: Daemon | None, what: str, wait_s: float,
             rule: str, running=lambda: None, progress=None, stall_s: float = 0.0) -> None:
    """Poll ``ready()`` until it is true, the daemon exits with an error, or ``wait_s`` passes
    with no progress in the last ``stall_s`` seconds.

    Args:
        ready: a callable that returns True once the daemon is ready.
        daemon: the started daemon (its exit ends the wait at once when non-zero) or None.
        what: the daemon's name for messages; rule: how the wait was computed, for messages.
        running: a callable that returns the daemon's pid from its pid file, or None.
        progress: a callable that returns the ``time.monotonic()`` of the last progress (an
            attach mark, gpufacts/attach.py) or None; with it the wait goes on past ``wait_s``
            while the last progress is less than ``stall_s`` seconds old (cut to the budget).

    Raises:
        NotStarted: the daemon's first process exited 0 and no daemon runs (a forking daemon's
            first process exits 0 only once the daemon has started).
        StepFailed: the daemon exited non-zero (its exit code and last messages: from its
            journal under systemd), or the wait timed out (the wait used; the daemon is left
            running).
    """
    def look() -> bool:
        if ready():
            return True
        code = daemon.exit_status() if daemon is not None else None
        if code == 0 and running() is None and daemon.exited_0_for() >= STARTED_GRACE_S:
            said = daemon.last_words()
            raise NotStarted(f"{what} exited 0 without starting" + (f": {said}" if said else ""),
                             said)
        if code not in (None, 0):
            said = daemon.last_words()
            raise StepFailed(f"{what} {ended_text(code)} during the wait"
                             + (f": {said}" if said else ""))
        return False

    started = time.monotonic()
    waited = ctx.wait(look, wait_s, POLL_S)
    segment = wait_s
    while not waited.held and progress is not None and waited.limit_s >= segment:
        last = progress()  # the wait is "no progress for stall_s", not only a total
        more = (last + stall_s - time.monotonic()) if last is not None else 0.0
        if more <= 0 or ctx.remaining() <= 0:
            break
        segment = more
        waited = ctx.wait(look, segment, POLL_S)
    if waited.held:
        return
    limit = round(time.monotonic() - started, 1) if segment != wait_s else waited.limit_s
    cut = " (cut to the boot budget)" if waited.limit_s < segment else ""
    if segment != wait_s:
        cut += f", then while attach marks kept coming (no progress for {stall_s:g} s ends it)"
    pid = running()
    if pid is not None:
        state = f"left running (pid {pid})"
    elif daemon is not None and daemon.exit_status() is None:
        state = f"left running ({daemon.where})"
    elif daemon is not None:
        said = daemon.last_words()
        state = f"{what} {ended_text(daemon.exit_status())} and no daemon is running" + (
            f": {said}" if said else "")
    else:
        state = "not running"
    raise StepFailed(f"timed out after {limit:g} s waiting for {what} to be ready "
                     f"(wait {rule}{cut}); {state}")


def run(ctx: BootContext) -> str:
    """Start the daemon unless it runs already, then wait for its socket."""
    root = ctx.root
    socket = root.resolve(PERSISTENCED_SOCKET)
    cfg = ctx.config.persistenced
    rate = rate_for(ctx.gpus, cfg.per_gpu_s)
    wait_s = cfg.ready_timeout_s + rate.attach_s
    rule = f"{cfg.ready_timeout_s:g} s + {rate.per_gpu_s:g} s x {ctx.gpu_count} GPU(s)" + (
        "" if rate.explicit or rate.per_gpu_s == DEFAULT_RATE_S else f", {rate.source}")
    stall_s = cfg.ready_timeout_s + rate.per_gpu_s  # no attach mark for this long ends the wait
    pid = _pid_of(root)
    marks = AttachMarks(rate, kmsg.read_timed_records(root))
    ctx.status.attach = marks.to_dict()
    seen_at = [time.monotonic()]

    def ready() -> bool:
        now = time.monotonic()
        if now - seen_at[0] >= MARK_POLL_S:  # the kernel log's attach marks, twice a second
            seen_at[0] = now
            if marks.update(kmsg.read_timed_records(root), now):
                ctx.status.attach = marks.to_dict()
        return Seen(os.path.exists(socket), lambda: _pid_of(root)).ready

    def settle(daemon: Daemon | None) -> Daemon | None:
        wait_for(ctx, ready, daemon, "nvidia-persistenced", wait_s, rule,
                 running=lambda: _pid_of(root), progress=lambda: marks.last_progress,
                 stall_s=stall_s)
        return daemon

    started = time.monotonic()
    if pid is not None:
        settle(None)  # a daemon found running: its readiness waited for all the same
        early_client.after_persistenced(root)
        return f"already running (pid {pid})"
    # an attach longer than the budget left could only time out: say so now, before the daemon
    # starts (docs/interface.md 3.4, "Attach budget"; issue 46)
    check_fits(rate, ctx.gpus, ctx.remaining(), ctx.config.budget_s)

    # one start with boot and the watcher (host/daemons.py): an option the installed daemon
    # refuses (535.171.04 has no --uvm-persistence-mode) is dropped, warned
    daemon, dropped = start_persistenced(lambda argv: ctx.start_daemon(argv, LOG_PATH),
                                         cfg.args, settle, ctx.warn)
    took = time.monotonic() - started
    early_client.after_persistenced(root)  # issue 46: a driver an early client re-initialised
    without = f", without {', '.join(dropped)} (not offered)" if dropped else ""
    return f"started ({daemon.where}{without}), ready in {took:.2f} s (wait up to {wait_s:g} s)"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the daemon, unless it runs already."""
    if _pid_of(ctx.root) is None:
        return [["nvidia-persistenced", *ctx.config.persistenced.args]]
    return []


# --- podvm-gpu check ----------------------------------------------------------------------

def persistenced_row(facts) -> Check:
    skip = facts.not_reached("persistenced") or facts.needs_driver("persistenced")
    if skip:
        return skip
    seen = look(facts.root)
    if seen.state == Seen.NOT_RUNNING:
        return Check("persistenced", FAIL, "nvidia-persistenced is not running",
                     "boot starts it; see the persistenced step in podvm-gpu status")
    if seen.state == Seen.STARTING:
        return Check("persistenced", WARN, f"running (pid {seen.pid}) but its socket "
                     f"{PERSISTENCED_SOCKET} is missing: still initialising?",
                     "wait, then check again; see the kernel log if it stays so")
    return Check("persistenced", PASS, f"running (pid {seen.pid}), socket present")


VM_ROWS = {"persistenced": persistenced_row}
