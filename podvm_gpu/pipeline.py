"""The GPU side of ``podvm-gpu boot``: detection through pyudev, then steps 2 to 10 in order.

Each step is recorded in the status file before it starts and after it ends, with its result
and duration. The first failure ends the boot with state ``failed``, a one-line reason that names
the step and the cause (plus what the kernel log says about the GPUs), the unavailable CDI spec
and exit status 1. A budget (``budget_s``) bounds the whole run: every command's timeout and every
wait is cut to it, and an interval timer stops anything that still runs past it.
"""

from __future__ import annotations

import json
import shlex
import signal
import time
import traceback

from podvm_gpu.boot import Log, finish_failed, finish_without_gpu, report
from podvm_gpu.config import Config, load_config, timeouts_for
from podvm_gpu.context import BootContext
from podvm_gpu.errors import CommandError, ConfigError, StepFailed
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.host.udev import discover
from podvm_gpu.model import State, Status, Step, StepResult
from podvm_gpu.status import StatusFile
from podvm_gpu.steps import (Skipped, cc, cdi_step, drivers, fabric, modules, nodes, persistenced,
                             versions)

STEPS = (
    ("drivers", drivers.run),
    ("modules", modules.run),
    ("versions", versions.run),
    ("device-nodes", nodes.run),
    # persistenced before every NVML client: without it each client re-initialises the GPUs
    # (slow, and harmful in confidential-computing mode).
    ("persistenced", persistenced.run),
    ("fabricmanager", fabric.run),
    ("confidential-computing", cc.run),
    ("cdi", cdi_step.run),
)

_ALARM_GRACE_S = 2.0  # after the budget, let the step in flight report its own timeout first


class BudgetExpired(BaseException):
    """Raised by the interval timer when the budget is spent; a BaseException so no step eats it."""


def _on_alarm(signum, frame):
    raise BudgetExpired()


def describe_command_error(err: CommandError) -> str:
    """One line for a failed command: what ran, exit status or ``timed out``, its last message."""
    cmd = " ".join([err.tool, *err.argv[1:3]])
    if err.timed_out:
        return f"{cmd} timed out after {err.timeout_s:g} s"
    if err.returncode is None:
        return str(err)
    last = err.last_line()
    return f"{cmd} failed (exit {err.returncode})" + (f": {last}" if last else "")


def run_pipeline(root: Root, config_path: str, status: Status, status_file: StatusFile, log: Log,
                 *, json_out: bool, dry_run: bool, started: float) -> int:
    """Detect with pyudev, validate the config, run the GPU steps; return the exit code."""
    detect = status.steps[0]
    gpus, switches = discover()
    status.gpus, status.nvswitches = gpus, switches
    detect.result = StepResult.OK
    detect.duration_s = time.monotonic() - started
    detect.message = f"{len(gpus)} GPU(s), {len(switches)} NVSwitch(es)"
    try:
        config = load_config(config_path)
    except ConfigError as err:
        log.step(detect)
        step = Step("config", StepResult.FAILED, message=str(err))
        status.steps.append(step)
        log.step(step)
        return _fail(root, status, status_file, log, Config(), f"config: {err}", json_out, dry_run)
    if not gpus:
        detect.message = "no NVIDIA GPU on PCI" + (
            f" ({len(switches)} NVSwitch(es): a fabric manager service VM?)" if switches else "")
        return finish_without_gpu(root, status, status_file, log, json_out, dry_run,
                                  write_spec=config.unavailable_spec)
    log.step(detect)
    deadline = started + config.budget_s
    runner = Runner(config.tools, timeouts_for(config), deadline=deadline)
    ctx = BootContext(root, config, runner, status, deadline, gpus=gpus, nvswitches=switches)
    if dry_run:
        from podvm_gpu.plan import plan

        commands = plan(ctx)
        if json_out:
            print(json.dumps({"dry_run": True, "gpus": [g.to_dict() for g in gpus],
                              "nvswitches": [s.to_dict() for s in switches],
                              "commands": commands}, indent=2))
        else:
            for argv in commands:
                print(shlex.join(argv))
        return 0
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(ctx.remaining(), 0) + _ALARM_GRACE_S)
    try:
        for name, func in STEPS:
            reason = _run_step(ctx, name, func, status_file, log)
            if reason is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                return _fail(root, status, status_file, log, config, reason, json_out, dry_run)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    for finding in kmsg.findings(kmsg.read_kernel_log(root)):
        ctx.warn(f"kernel log: {finding.describe()}")
    status_file.finish(status, State.READY, None)
    log(Log.INFO, f"ready in {time.monotonic() - started:.3f} s: {len(gpus)} GPU(s)")
    report(status, json_out)
    return 0


def _run_step(ctx: BootContext, name: str, func, status_file: StatusFile, log: Log) -> str | None:
    """Run one step and record it; return the boot's failure reason, or None when it passed."""
    step = Step(name)
    ctx.status.steps.append(step)
    status_file.write(ctx.status)
    t0 = time.monotonic()
    try:
        if ctx.remaining() <= 0:
            raise StepFailed(f"timed out: the boot budget of {ctx.config.budget_s:g} s was spent "
                             "before this step")
        step.message = func(ctx) or ""
        step.result = StepResult.OK
    except Skipped as skip:
        step.result, step.message = StepResult.SKIPPED, str(skip)
    except StepFailed as err:
        step.result, step.message = StepResult.FAILED, str(err)
    except CommandError as err:
        step.result, step.message = StepResult.FAILED, describe_command_error(err)
    except BudgetExpired:
        step.result = StepResult.FAILED
        step.message = f"timed out: the boot budget of {ctx.config.budget_s:g} s is spent"
    except Exception as err:  # a bug must still end in 'failed' with the unavailable spec
        step.result = StepResult.FAILED
        step.message = f"internal error: {type(err).__name__}: {err}"
        log(Log.ERR, traceback.format_exc().replace("\n", " | "))
    step.duration_s = time.monotonic() - t0
    step.message = " ".join(step.message.split())
    log.step(step)
    status_file.write(ctx.status)
    if step.result is StepResult.FAILED:
        return f"{name}: {step.message}"
    return None


def _fail(root: Root, status: Status, status_file: StatusFile, log: Log, config: Config,
          reason: str, json_out: bool, dry_run: bool) -> int:
    """End the boot ``failed``: kernel-log facts appended, unavailable spec, final status, exit 1."""
    extra = [f.describe() for f in kmsg.findings(kmsg.read_kernel_log(root))
             if f.summary.lower() not in reason.lower()]
    if extra:
        reason = f"{reason}; kernel log: " + "; ".join(extra[:2])
    return finish_failed(root, status, status_file, log, reason, json_out, dry_run,
                         write_spec=config.unavailable_spec)
