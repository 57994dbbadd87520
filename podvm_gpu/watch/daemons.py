"""The daemons the watcher looks after (issue 34): nvidia-persistenced, nv-fabricmanager and
NVLSM, read as check and the metrics read them (their pid files and ``/proc/<pid>/comm``)."""

from __future__ import annotations

import os
import time

from podvm_gpu.gpufacts.finding import FAIL, WARN, finding

TRIES = 3  # restarts of nvidia-persistenced on a VM whose GPUs are not confidential
BACK_S = 10.0  # how long a restarted daemon has to name itself in its pid file


def running(root) -> dict[str, int]:
    """The daemons the boot may have started that run now: name -> pid (their pid files and
    ``/proc/<pid>/comm`` under ``root``, as check and the metrics read them)."""
    from podvm_gpu import readers

    return readers.running_daemons(root)


def gone(root, pids: dict[str, int], confidential: bool, runner, config, stopping) -> list:
    """A daemon that ran at the watcher's start and is gone: fatal in a confidential guest;
    elsewhere nvidia-persistenced is started again (bounded tries, warned) and is fatal only
    when it does not come back; the fabric manager and NVLSM are fatal (the fabric cannot
    be kept)."""
    now = running(root)
    out = []
    for name, pid in pids.items():
        if name in now:
            continue
        said = f"{name} (pid {pid}) is gone"
        if name == "nvidia-persistenced" and not confidential:
            back, dropped = restart_persistenced(root, runner, config, stopping)
            if back is not None:
                pids[name] = back
                without = f" without {', '.join(dropped)} (not offered)" if dropped else ""
                out.append(finding(WARN, f"{said}; started again (pid {back}){without}"))
                continue
            said += f"; not back after {TRIES} starts"
        elif confidential:
            said += " in a confidential guest"
        out.append(finding(FAIL, said))
    return out


def restart_persistenced(root, runner, config, stopping) -> tuple[int | None, list[str]]:
    """Start nvidia-persistenced again as the boot starts it (the one start of host/daemons.py,
    which drops an option the installed daemon refuses); its pid once it names itself, or None
    after the bounded tries, and the options dropped."""
    from podvm_gpu import readers
    from podvm_gpu.errors import CommandError
    from podvm_gpu.host.daemons import STARTED_GRACE_S, RefusedStart, start_daemon, start_persistenced

    log_path = root.resolve("/run/podvm-gpu/nvidia-persistenced.log", follow_last=False)

    def start(argv: list[str]):
        if os.path.lexists(log_path):
            os.unlink(log_path)
        return start_daemon(runner, argv, log_path)

    def settle(daemon) -> int | None:
        end = time.monotonic() + BACK_S
        while time.monotonic() < end and not stopping.is_set():
            pid = readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM)
            if pid is not None:
                return pid
            if daemon.exited_0_for() >= STARTED_GRACE_S:  # a forking daemon's exits 0 too
                raise RefusedStart("nvidia-persistenced exited 0 without starting",
                                   daemon.last_words())
            time.sleep(0.2)
        return None

    for _ in range(TRIES):
        try:
            pid, dropped = start_persistenced(start, config.persistenced.args, settle,
                                              lambda line: None)
        except (CommandError, OSError, KeyError, RefusedStart):
            continue
        if pid is not None:
            return pid, dropped
    return None, []
