"""The daemons the watcher looks after (issue 34): nvidia-persistenced, nv-fabricmanager and
NVLSM, read as check and the metrics read them (their pid files and ``/proc/<pid>/comm``)."""

from __future__ import annotations

import os
import time

from podvm_gpu.watch.verdicts import FATAL, WARN, Verdict

TRIES = 3  # restarts of nvidia-persistenced on a VM whose GPUs are not confidential
BACK_S = 10.0  # how long a restarted daemon has to name itself in its pid file


def running(root) -> dict[str, int]:
    """The daemons the boot may have started that run now: name -> pid (their pid files and
    ``/proc/<pid>/comm`` under ``root``, as check and the metrics read them)."""
    from podvm_gpu import readers

    pids = {}
    for name, pid_file, comm in (
            ("nvidia-persistenced", readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM),
            ("nv-fabricmanager", readers.FABRICMANAGER_PID, readers.FABRICMANAGER_COMM),
            ("nvlsm", readers.NVLSM_PID, readers.NVLSM_COMM)):
        pid = readers.daemon_pid(root, pid_file, comm)
        if pid is not None:
            pids[name] = pid
    return pids


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
            back = restart_persistenced(root, runner, config, stopping)
            if back is not None:
                pids[name] = back
                out.append(Verdict(WARN, None, f"{said}; started again (pid {back})"))
                continue
            said += f"; not back after {TRIES} starts"
        elif confidential:
            said += " in a confidential guest"
        out.append(Verdict(FATAL, None, said))
    return out


def restart_persistenced(root, runner, config, stopping) -> int | None:
    """Start nvidia-persistenced again as the boot starts it (host/daemons.py); its pid once it
    names itself, or None after the bounded tries."""
    from podvm_gpu import readers
    from podvm_gpu.errors import CommandError
    from podvm_gpu.host.daemons import start_daemon

    log_path = root.resolve("/run/podvm-gpu/nvidia-persistenced.log", follow_last=False)
    for _ in range(TRIES):
        try:
            if os.path.lexists(log_path):
                os.unlink(log_path)
            start_daemon(runner, ["nvidia-persistenced", *config.persistenced.args], log_path)
        except (CommandError, OSError, KeyError):
            continue
        end = time.monotonic() + BACK_S
        while time.monotonic() < end and not stopping.is_set():
            pid = readers.daemon_pid(root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM)
            if pid is not None:
                return pid
            time.sleep(0.2)
    return None
