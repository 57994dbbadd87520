"""Step 6, ``persistenced``: start nvidia-persistenced and wait, bounded, until it is ready.

It comes before every NVML client (fabric-manager polling, nvidia-smi, CDI generation): without
it each client initialises and tears down the GPUs again, which is slow and, in confidential-
computing mode, harmful. Ready means its socket exists; running means its pid file names a pid
whose ``/proc/<pid>/comm`` is the daemon's. The wait is ``ready_timeout_s + per_gpu_s * GPUs``
because initialisation time grows with the GPU count. Ready also needs the daemon running: a
socket left by an earlier daemon does not count. A daemon still initialising when the wait
ends is left running: it is never killed mid-way.
"""

from __future__ import annotations

import os
import time

from podvm_gpu.context import BootContext
from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import ensure_dir
from podvm_gpu.readers import PERSISTENCED_COMM, PERSISTENCED_PID, PERSISTENCED_SOCKET, daemon_pid

POLL_S = 0.05
LOG_PATH = "/run/podvm-gpu/nvidia-persistenced.log"


def last_message(path: str) -> str:
    """The last non-empty line a spawned daemon printed (its log under /run/podvm-gpu)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def wait_for(ctx: BootContext, ready, proc, log_path: str, what: str, wait_s: float,
             rule: str, running=lambda: None) -> None:
    """Poll ``ready()`` until it is true, the daemon exits with an error, or ``wait_s`` passes.

    Args:
        ready: a callable that returns True once the daemon is ready.
        proc: the spawned Popen (its exit ends the wait at once when non-zero) or None.
        what: the daemon's name for messages; rule: how the wait was computed, for messages.
        running: a callable that returns the daemon's pid from its pid file, or None.

    Raises:
        StepFailed: the daemon exited non-zero (its exit code and last message), or the wait
            timed out (the wait used; the daemon is left running).
    """
    limit = ctx.wait_limit(wait_s)
    end = time.monotonic() + limit
    while True:
        if ready():
            return
        code = proc.poll() if proc is not None else None
        if code not in (None, 0):
            said = last_message(log_path)
            raise StepFailed(f"{what} exited with status {code} during the wait"
                             + (f": {said}" if said else ""))
        if time.monotonic() >= end:
            cut = " (cut to the boot budget)" if limit < wait_s else ""
            pid = running()
            if pid is None and proc is not None and proc.poll() is None:
                pid = proc.pid
            state = (f"left running (pid {pid})" if pid is not None else
                     f"{what} exited {proc.poll()} and no daemon is running" if proc is not None
                     else "not running")
            raise StepFailed(f"timed out after {limit:g} s waiting for {what} to be ready "
                             f"(wait {rule}{cut}); {state}")
        time.sleep(POLL_S)


def run(ctx: BootContext) -> str:
    """Start the daemon unless it runs already, then wait for its socket."""
    root = ctx.root
    socket = root.resolve(PERSISTENCED_SOCKET)
    cfg = ctx.config.persistenced
    wait_s = cfg.ready_timeout_s + cfg.per_gpu_s * ctx.gpu_count
    rule = f"{cfg.ready_timeout_s:g} s + {cfg.per_gpu_s:g} s x {ctx.gpu_count} GPU(s)"
    pid = daemon_pid(root, PERSISTENCED_PID, PERSISTENCED_COMM)
    proc = None
    if pid is None:
        log_path = root.resolve(LOG_PATH, follow_last=False)
        ensure_dir(os.path.dirname(log_path))
        proc = ctx.runner.spawn(["nvidia-persistenced", *cfg.args], log_path)
    else:
        log_path = root.resolve(LOG_PATH, follow_last=False)
    started = time.monotonic()
    def ready() -> bool:
        # the socket alone could be left from an earlier daemon; it must be running too
        return os.path.exists(socket) and daemon_pid(
            root, PERSISTENCED_PID, PERSISTENCED_COMM) is not None

    wait_for(ctx, ready, proc, log_path, "nvidia-persistenced", wait_s, rule,
             running=lambda: daemon_pid(root, PERSISTENCED_PID, PERSISTENCED_COMM))
    took = time.monotonic() - started
    if proc is None:
        return f"already running (pid {pid})"
    return f"started, ready in {took:.2f} s (wait up to {wait_s:g} s)"
