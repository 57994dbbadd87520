"""Step 7, ``fabricmanager``: on NVSwitch machines start nv-fabricmanager and wait, bounded, until
every GPU reports fabric State Completed with Status Success.

Without NVSwitches the fabric manager is never started; if the GPUs still report a fabric state
other than not-supported (shared-NVSwitch virtualization: the fabric is managed outside the VM),
the same wait applies. The state comes from the ``Fabric`` block of ``nvidia-smi -q -d FABRIC``.
"""

from __future__ import annotations

import os
import time

from podvm_gpu.context import BootContext
from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.host.fs import ensure_dir
from podvm_gpu.readers import (FABRICMANAGER_COMM, FABRICMANAGER_PID, FabricState, daemon_pid,
                               nvsmi_no_driver, parse_fabric)
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.persistenced import last_message

LOG_PATH = "/run/podvm-gpu/nv-fabricmanager.log"


def query(ctx: BootContext) -> list[FabricState]:
    """Every GPU's fabric state (one ``nvidia-smi -q -d FABRIC`` call).

    Raises:
        CommandError: nvidia-smi failed or timed out.
    """
    return parse_fabric(ctx.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"]).stdout)


def summarize(states: list[FabricState]) -> str:
    """``State X, Status Y on N GPU(s)`` for each distinct pair."""
    pairs: dict[tuple[str, str], int] = {}
    for s in states:
        pairs[(s.state, s.status)] = pairs.get((s.state, s.status), 0) + 1
    return "; ".join(f"State {a}, Status {b} on {n} GPU(s)" for (a, b), n in pairs.items())


def wait_for_fabric(ctx: BootContext, proc, log_path: str) -> list[FabricState]:
    """Poll the fabric state until every GPU is Completed/Success; fail at once when a GPU is
    Completed with another status (unhealthy) or the fabric manager exits with an error."""
    cfg = ctx.config.fabricmanager
    wanted = cfg.ready_timeout_s + cfg.per_gpu_s * ctx.gpu_count
    limit = ctx.wait_limit(wanted)
    end = time.monotonic() + limit
    states: list[FabricState] = []
    while True:
        try:
            states = query(ctx)
        except CommandError as err:
            no_driver = nvsmi_no_driver(err.returncode, err.stdout + err.stderr)
            if no_driver:
                raise StepFailed(no_driver) from err
            if err.timed_out or time.monotonic() >= end:
                raise StepFailed(f"nvidia-smi fabric query failed: {err}") from err
            states = []
        if states and all(s.success for s in states):
            return states
        bad = [s for s in states if s.completed and not s.success]
        if bad:
            raise StepFailed(f"fabric unhealthy: {summarize(bad)}")
        code = proc.poll() if proc is not None else None
        if code not in (None, 0):
            said = last_message(log_path)
            raise StepFailed(f"nv-fabricmanager exited with status {code}"
                             + (f": {said}" if said else ""))
        if time.monotonic() >= end:
            now = summarize(states) if states else "no fabric state reported"
            raise StepFailed(f"timed out after {limit:g} s waiting for the NVLink fabric "
                             f"(wait {cfg.ready_timeout_s:g} s + {cfg.per_gpu_s:g} s x "
                             f"{ctx.gpu_count} GPU(s)): {now}")
        time.sleep(min(cfg.poll_s, max(end - time.monotonic(), 0.01)))


def run(ctx: BootContext) -> str:
    """Start the fabric manager where it belongs and wait for the fabric."""
    root = ctx.root
    if not ctx.nvswitches:
        try:
            states = query(ctx)
        except CommandError as err:
            no_driver = nvsmi_no_driver(err.returncode, err.stdout + err.stderr)
            if no_driver:  # the loaded driver does not answer: every later client fails too
                raise StepFailed(no_driver) from err
            raise Skipped(f"no NVSwitch; fabric state unknown ({err})") from err
        if not any(s.supported for s in states):
            raise Skipped("no NVSwitch, and the GPUs report no NVLink fabric")
        wait_for_fabric(ctx, None, "")
        return f"no NVSwitch in the VM; fabric managed outside it: {summarize(states)} -> ready"
    pid = daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM)
    proc = None
    log_path = root.resolve(LOG_PATH, follow_last=False)
    if pid is None:
        ensure_dir(os.path.dirname(log_path))
        argv = ["nv-fabricmanager"]
        cfg_file = ctx.config.fabricmanager.config_file
        if root.exists(cfg_file):
            argv += ["-c", cfg_file if root.is_host else root.resolve(cfg_file)]
        proc = ctx.runner.spawn(argv, log_path)
    started = time.monotonic()
    states = wait_for_fabric(ctx, proc, log_path)
    how = "started" if proc is not None else f"already running (pid {pid})"
    return (f"{how}; {len(ctx.nvswitches)} NVSwitch(es); fabric Completed/Success on "
            f"{len(states)} GPU(s) in {time.monotonic() - started:.2f} s")
