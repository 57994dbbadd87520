"""The GPU side of ``podvm-gpu boot``: steps 2 to 10 in order, once detect found a GPU.

Each step is recorded in the status file before it starts and after it ends, with its result
and duration. The first failure ends the boot with state ``failed``, a one-line reason that names
the step and the cause (plus what the kernel log says about the GPUs), the unavailable CDI spec
and exit status 1. A budget (``budget_s``) bounds the whole run: every command's timeout and every
wait is cut to it, and an interval timer stops anything that still runs past it.
"""

from __future__ import annotations

import shlex
import signal
import time
import traceback

from podvm_gpu.boot import REASON_MAX, Log, Run
from podvm_gpu.config import Config, timeouts_for
from podvm_gpu.context import BootContext
from podvm_gpu.errors import CommandError, StepFailed, exit_text, one_line
from podvm_gpu.host import kmsg
from podvm_gpu.host.proc import Runner
from podvm_gpu.jsontext import dumps
from podvm_gpu.model import Step, StepResult
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
    return f"{cmd} failed ({exit_text(err.returncode)})" + (f": {last}" if last else "")


def run_pipeline(run: Run, config: Config | None) -> int:
    """Run steps 2 to 10 on the GPUs detect found (in ``run.status``); return the exit code.

    Args:
        run: the boot run, its lock held and its status written once.
        config: the validated config (None: the defaults).
    """
    config = config or Config()
    gpus, switches = run.status.gpus, run.status.nvswitches
    deadline = run.started + config.budget_s
    runner = Runner(config.tools, timeouts_for(config), deadline=deadline, trust_tool_paths=True)
    ctx = BootContext(run.root, config, runner, run.status, deadline, gpus=gpus,
                      nvswitches=switches)
    if run.dry_run:
        from podvm_gpu.plan import plan

        commands = plan(ctx)
        if run.json_out:
            print(dumps({"dry_run": True, "gpus": [g.to_dict() for g in gpus],
                         "nvswitches": [s.to_dict() for s in switches], "commands": commands}))
        else:
            for argv in commands:
                print(shlex.join(argv))
        return 0
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(ctx.remaining(), 0) + _ALARM_GRACE_S)
    try:
        for name, func in STEPS:
            reason = _run_step(ctx, name, func, run.status_file, run.log)
            if reason is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                return _fail(run, reason)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    for finding in kmsg.findings(kmsg.read_kernel_log(run.root)):
        ctx.warn(f"kernel log: {finding.describe()}")
    return run.end_ready()


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
    step.message = one_line(step.message, REASON_MAX)
    log.step(step)
    status_file.write(ctx.status)
    if step.result == StepResult.FAILED:
        return f"{name}: {step.message}"
    return None


def _fail(run: Run, reason: str) -> int:
    """End the boot ``failed``: what the kernel log says appended (the facts the patterns name,
    then the driver's own error records not quoted yet), then :meth:`Run.fail`."""
    records = kmsg.read_kernel_records(run.root)
    messages = [m for _level, m in records]
    extra = [f.describe() for f in kmsg.findings(messages)
             if f.summary.lower() not in reason.lower()][:2]
    quoted = (reason + " ".join(extra)).lower()
    errors = [e for e in kmsg.driver_errors(records) if e.lower() not in quoted]
    extra += [f'driver: "{e}"' for e in errors]
    if extra:
        reason = f"{reason}; kernel log: " + "; ".join(extra)
    return run.fail(reason)
