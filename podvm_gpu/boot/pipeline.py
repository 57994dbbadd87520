"""The GPU side of ``podvm-gpu boot``: steps 2 to 10, once detect found a GPU.

Each step is recorded in the status file before it starts and after it ends, with its result
and duration. The first failure ends the boot with state ``failed``, a one-line reason that names
the step and the cause (plus what the kernel log says about the GPUs), the unavailable CDI spec
and exit status 1. A budget (``budget_s``) bounds the whole run: every command's timeout and every
wait is cut to it, and an interval timer stops anything that still runs past it.

The order, and what depends on what (contract section 3):

==========================  =================================================================
``drivers``                 first: with another driver bound, modprobe can only fail.
``modules``                 after drivers; every later step needs the loaded driver. On an
                            NVLink 5 VM also the IB modules (before modules.lock_after_boot
                            locks loading; their devices register during persistenced).
``versions``                after modules (reads the loaded module's version); before any NVML
                            client, which fails on a mismatch. The fabric manager's version too,
                            before persistenced starts initialising GPUs for nothing (C23).
                            Once it passed, ``nvidia-ctk --version`` starts on a thread of its
                            own for the cdi step (``_STARTED_AFTER``), beside the next two.
``device-nodes``            after modules (majors and minors come from the driver).
``persistenced``            after the nodes; before every NVML client (nvidia-smi, the fabric
                            wait, nvidia-ctk): without it each client initialises the GPUs again,
                            slow, and harmful in confidential-computing mode (C20).
``fabricmanager``     }     after persistenced; independent of each other, so they run at the
                            same time. On NVLink 5 the fabricmanager step finds the management
                            port, starts NVLSM, waits for it, then the fabric manager
                            (podvm_gpu/steps/fabric/nvl5.py); none of that touches a GPU, so it runs beside
``confidential-computing``  same time: the fabric wait is tens of seconds on HGX machines,
``cdi`` (generate)    }     and nvidia-ctk's generation does not need the fabric or the ready
                            state, only the driver and persistenced.
``cdi`` (health gate)       beside generation, in the same branch on a thread of its own,
                            started once the generation's process has started (the longest
                            lane's start first; podvm_gpu/steps/cdi/health.py,
                            steps/cdi/step.py ``run``): bounded
                            nvidia-smi queries side by side (row remapper; volatile ECC, pages
                            pending; reset status; recovery action), NVML clients, so
                            after persistenced; the branch waits for both, and the gate comes
                            before the install, since a spec means a usable GPU. No step of its
                            own: the contract's step list is fixed, and the gate decides whether
                            the ``cdi`` spec goes in.
``cdi`` (install)           only once all three succeeded: the spec a CDI reader sees must mean
                            a usable GPU (fabric Completed/Success, CC ready state as decided,
                            memory health as read).
==========================  =================================================================

A failure in one of the three parallel steps stops the steps after it in the order above at
once (their tool calls are ended; daemons are never touched); a step before it runs to its own
end first, as it would have in a sequential boot, and only then are the others stopped. So the
reason is always that of the earliest step that fails in the order above, whichever failed
first in time (a missing nvidia-smi fails the fabric wait and the CC step together), and a
boot fails no later than its sequential order would have made it. Nothing is installed, and the
boot ends failed as any other.
"""

from __future__ import annotations

import sys
import threading
import time

from podvm_gpu import steps as step_list
from podvm_gpu.boot.run import BudgetExpired, Interrupted, Log, Run
from podvm_gpu.config.model import Config, timeouts_for
from podvm_gpu.errors import Cancelled, CommandError, StepFailed, exit_text
from podvm_gpu.gpufacts import kernel
from podvm_gpu.host import kmsg
from podvm_gpu.host.proc import Background, Runner
from podvm_gpu.model import Step, StepResult, cut_reason
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.context import BootContext


def _imported_when_run(name: str):
    """Step ``name``'s ``run``, its module imported when it first runs: the parallel steps'
    modules (CC, attestation, CDI, fabric: about half of the pipeline's imports) are imported
    by :func:`import_parallel_steps` while the sequential steps wait on their tools, not
    before the first GPU step (issue 38)."""
    def run(ctx):
        return step_list.module(name).run(ctx)

    run.__qualname__ = f"{name}.run"
    return run


# The step list (podvm_gpu/steps/__init__.py): each step's ``run``, in order; after persistenced,
# the parallel ones at once; the last of them (the spec) ``finish``es once all have succeeded.
SEQUENTIAL = tuple((name, _imported_when_run(name)) for name in step_list.GPU_STEPS
                   if name not in step_list.PARALLEL)
PARALLEL = tuple((name, _imported_when_run(name)) for name in step_list.GPU_STEPS
                 if name in step_list.PARALLEL)


# What the parallel steps import inside their functions on every GPU boot (the attestation
# gate's question, the health gate), loaded beside the sequential steps too.
_IMPORTED_WHEN_RUN = ("podvm_gpu.steps.cc.attest.gate", "podvm_gpu.steps.cdi.health")


def start_while_waiting() -> Background:
    """Import the later steps' modules on a thread of its own, in the order they run (the
    sequential ones, then the parallel ones and what they import inside their functions),
    started once the boot's first tool call is in flight (the runner's ``at_next_spawn``: the
    first modprobe), so that it never delays that call, and runs while the main thread waits on
    modprobe and persistenced (issue 38). The package has no import cycle, so two threads
    importing at once only wait on each other's module (Python's per-module import locks),
    never deadlock. An import that fails here is left alone: it fails again where the step
    runs, and that step reports it."""
    import importlib

    def load() -> None:
        steps = [f"podvm_gpu.steps.{dict(step_list.STEPS)[n]}" for n in step_list.GPU_STEPS[2:]]
        for name in [*steps, *_IMPORTED_WHEN_RUN]:
            # what fails here fails again where its step runs, which reports it (the
            # docstring); a helper moved elsewhere is only not preloaded
            try:
                importlib.import_module(name)
            except Exception:  # the comment above says why
                pass

    return Background(load, "while-waiting")


def _read_toolkit_version(ctx: BootContext) -> None:
    from podvm_gpu.steps.cdi import toolkit

    toolkit.start_version_read(ctx)


# What starts before the step that needs it, once the step it needs has passed, as soon as the
# next tool call is in flight (so that its start does not delay that call's): nvidia-ctk's
# version, read while device-nodes and persistenced run instead of first in the cdi step, the
# boot's longest lane (issue 38); not before the versions step says the driver is usable, as no
# nvidia-ctk call at all may come before that (cases C04, C05, C25).
_STARTED_AFTER = {"versions": (_read_toolkit_version,)}


_ALARM_GRACE_S = 2.0  # after the budget, let the step in flight report its own timeout first
_STAGGER_S = 0.02  # at most this between the starts of two parallel steps (Steps.run_all)


def budget_spent(ctx, step_name: str, cut: str = "") -> str:
    """``timed out: the boot budget of N s is spent``, then ``cut`` (the call the budget cut,
    in words), then ``; last seen: <what the step's wait saw> for N s`` when the step recorded
    it (``ctx.last_seen``, the fabric wait's state), else ``""``: a budget that ends a wait
    names the state that never came, not only the call it cut (issue 33)."""
    seen = ctx.last_seen.get(step_name)
    return f"timed out: the boot budget of {ctx.config.budget_s:g} s is spent{cut}" + (
        f"; last seen: {seen}" if seen else "")


def budget_cut(err: BaseException) -> CommandError | None:
    """The tool call behind ``err`` (itself, or the error a step's :class:`StepFailed` was
    raised from or during) when that call timed out because the boot budget cut its timeout
    short (``budget_spent``): the budget, not the tool, ended it (docs/interface.md 3.3)."""
    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, CommandError):
            return err if err.timed_out and err.budget_spent else None
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def describe_command_error(err: CommandError) -> str:
    """One line for a failed command: what ran, exit status or ``timed out``, its last message."""
    cmd = " ".join([err.tool, *err.argv[1:3]])
    if err.timed_out:
        return f"{cmd} timed out after {err.timeout_s:g} s"
    if err.returncode is None or err.held_open:
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
    from podvm_gpu.steps.fabric import fabric_kind  # the GPU path only: VPD is never read on a CPU VM

    ctx.fabric = run.status.fabric = fabric_kind.detect([s.pci_address for s in switches],
                                                        gpus=gpus)
    standing = _standing_finding(run)
    if standing:  # the dry run says it too, as for a bad config (issue 47 item 6)
        return run.dry_run_refusal(standing) if run.dry_run else run.fail(standing)
    if run.dry_run:
        cannot = run.unwritable()  # the boot would fail writing its status (issue 47 item 22)
        return run.dry_run_refusal(cannot) if cannot else _dry_run(run, ctx)
    reason = _run_steps(run, ctx)
    if reason is not None:
        return _fail(run, reason)
    messages = kmsg.read_kernel_log(run.root)
    early = next((f for f in kernel.findings(kmsg.since_driver_load(messages))
                  if f.kind == "early-client"), None)
    if early is not None:  # issue 46: NVML lost GPUs while the boot ran (gpufacts/early_client.py)
        return _fail(run, f"kernel log: {kernel.describe(early)}")
    for finding in kernel.findings(messages):
        ctx.warn(f"kernel log: {kernel.describe(finding)}")
    return run.end_ready()


def _run_steps(run: Run, ctx: BootContext) -> str | None:
    """Run the steps under the budget's timer; the failure reason that ends the boot (the step
    in flight named when the budget ran out), or None when every step passed. A signal or a
    bug ends the other steps' tools and is raised again; a call still in flight afterwards is
    cancelled."""
    # a GPU boot's threads hand the interpreter over within 1 ms, not 5 (Python's default):
    # the main thread, woken by a tool's end, no longer waits on an importing thread (issue 38)
    sys.setswitchinterval(0.001)
    ctx.runner.at_next_spawn.append(start_while_waiting)
    steps = Steps(ctx, run)
    # the budget's timer (SIGALRM, boot/run.py Signals): BudgetExpired in the main thread; the
    # first signal or the timer starts the ending, which cancels the timer and only notes
    # what comes later, so nothing cuts the ending short (run_boot's guard does the rest)
    if run.signals:
        run.signals.arm(max(ctx.remaining(), 0) + _ALARM_GRACE_S)
    try:
        reason = steps.run_all()
    except BudgetExpired:  # while the parallel steps ran: the earliest in flight is blamed
        run.finishing()
        step = run.running_step()  # the earliest still running
        steps.stop("the boot budget is spent", wait_s=0.5)
        step.result, step.message = StepResult.FAILED, budget_spent(ctx, step.name)
        reason = f"{step.name}: {step.message}"
    except BaseException as err:
        # SIGTERM, SIGINT, a bug: the step in flight is the one the end names; end the other
        # steps' tools and give them a moment to record it, the timer cancelled first and
        # later signals only noted (a second SIGTERM, the budget) so the wait is not cut short
        run.finishing()
        if isinstance(err, Interrupted):
            err.steps = steps.running()
        steps.stop("the boot is ending", wait_s=1.0)
        raise
    finally:
        if run.signals:
            run.signals.disarm()
        # a call started ahead of its step (nvidia-ctk's version, a hook's ask) that is still
        # in flight when the steps ended is nobody's: end it, or it would outlive the boot
        ctx.runner.cancel("the boot's steps ended")
    return reason


class Steps:
    """Runs the steps in their order, the parallel ones on threads of their own, and records each.

    The status file is written by one thread at a time; signals (SIGTERM, SIGINT, the budget's
    timer) reach the main thread only, which then stops the others through :meth:`stop`.
    """

    def __init__(self, ctx: BootContext, run: Run):
        self.ctx, self.run = ctx, run
        self.threads: list[threading.Thread] = []
        self._ended = threading.Semaphore(0)  # released once by each parallel branch's end
        self._done: set[str] = set()  # the parallel steps whose branch has ended
        ctx.stopping = threading.Event()

    def write(self) -> None:
        self.run.status_file.write(self.ctx.status)  # one writer at a time (StatusFile)

    def stop(self, why: str, wait_s: float = 0.0) -> None:
        """Stop every step still running: waits end, tool calls in flight are killed, new ones
        refused; wait up to ``wait_s`` for the steps' threads to record it. Daemons are not the
        runner's children and are left alone."""
        self.ctx.stopped_because = self.ctx.stopped_because or why
        self.ctx.stopping.set()
        self.ctx.runner.cancel(why)
        end = time.monotonic() + wait_s
        for thread in self.threads:
            # a branch not started yet (a signal while run_all starts them one after another)
            # has nothing to record and never will
            if wait_s > 0 and thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(end - time.monotonic(), 0))

    def run_all(self) -> str | None:
        """The boot's failure reason, or None when every step passed (and the spec is in)."""
        for name, func in SEQUENTIAL:
            reason = self.one(self.start(name), func)
            if reason is not None:
                return reason
            for start in _STARTED_AFTER.get(name, ()):
                self.ctx.runner.at_next_spawn.append(lambda start=start: start(self.ctx))
        self.ctx.runner.at_next_spawn.clear()  # no call before them: what waits is done as they run
        started = [(self.start(name), func) for name, func in PARALLEL]
        results: dict[str, object] = {}
        self.threads = [Background(lambda step=step, func=func: self._branch(step, func, results),
                                   f"step-{step.name}", start=False).thread
                        for step, func in started]
        runner = self.ctx.runner
        for thread, (step, _func) in reversed(list(zip(self.threads, started))):
            # the spec's lane first: the longest (the generation); the next once this one has
            # its first call in flight (or ended, or 20 ms passed): process starts that compete
            # for the interpreter delay each other (issue 38)
            seen = runner.spawns
            thread.start()
            runner.wait_for_spawn(seen, lambda name=step.name: name in self._done, _STAGGER_S)
        steps = [step for step, _ in started]
        for _ in self.threads:
            # Each branch's end is released at once; the wait wakes every 0.05 s all the same:
            # the kernel may hand SIGTERM to a step's thread, and then only a main thread that
            # wakes up runs the handler (a plain join() sat out a hung call's whole timeout
            # before the boot noticed the signal).
            while not self._ended.acquire(timeout=0.05):
                pass
            failed = next((s for s in steps if s.result == StepResult.FAILED), None)
            if failed is not None and all(s.name in self._done
                                          for s in steps[:steps.index(failed)]):
                self.stop(f"{failed.name} failed")  # the module docstring says why not sooner
        for thread in self.threads:
            thread.join()  # each has released its end: nothing left but its return
        failed = [s for s in steps if s.result == StepResult.FAILED]
        if failed:  # the earliest in the step order (the steps before it had ended)
            for step in steps:
                if step.result == StepResult.RUNNING:  # the spec, generated: it stays out
                    step.result = StepResult.SKIPPED
                    step.message = f"spec generated and valid, not installed: {failed[0].name} failed"
                    self.run.log.step(step)
            return f"{failed[0].name}: {failed[0].message}"
        last = started[-1][0]
        last.message = ""
        finish = step_list.module(last.name).finish
        return self.one(last, lambda ctx: finish(ctx, results[last.name]), started=False)

    def running(self) -> list[Step]:
        """Every step still running, in the step order."""
        return [s for s in self.ctx.status.steps if s.result == StepResult.RUNNING]

    def start(self, name: str) -> Step:
        step = Step(name)
        self.ctx.status.steps.append(step)
        self.write()
        return step

    def _branch(self, step: Step, func, results: dict) -> None:
        # a step with a finish (the spec's install) keeps its result and runs on after the rest
        later = hasattr(step_list.module(step.name), "finish")

        def keep(ctx):
            value = func(ctx)
            if later:
                results[step.name] = value
                return None
            return value

        try:
            self.one(step, keep, final=not later)
        finally:
            self._done.add(step.name)
            self._ended.release()
            self.ctx.runner.wake()  # run_all may be waiting for this branch's first call

    def one(self, step: Step, func, started: bool = True, final: bool = True) -> str | None:
        """Run ``func(ctx)`` as ``step`` and record it; the failure reason, or None.

        ``started=False`` continues a step whose first part ran before (its time adds up);
        ``final=False`` leaves a step that succeeded ``running`` (the cdi step between its
        generation and its installation).
        """
        ctx = self.ctx
        t0 = time.monotonic()
        earlier = step.duration_s
        try:
            if ctx.remaining() <= 0:
                raise StepFailed(f"timed out: the boot budget of {ctx.config.budget_s:g} s was "
                                 "spent before this step")
            message = func(ctx) or ""
            step.message = message if started or not step.message else \
                f"{step.message}; {message}"
            step.result = StepResult.OK if final else StepResult.RUNNING
            if not final:
                step.message = "spec generated and valid; installed once the fabric and the " \
                               "confidential-computing steps succeed"
        except Skipped as skip:
            step.result, step.message = StepResult.SKIPPED, str(skip)
        except Cancelled as why:
            if step.result != StepResult.RUNNING:
                return None  # the main thread has given the step its end (a signal's)
            step.result, step.message = StepResult.SKIPPED, f"stopped: {why}"
        except (StepFailed, CommandError) as err:
            cut = budget_cut(err)
            step.result = StepResult.FAILED
            step.message = (budget_spent(ctx, step.name, f" ({describe_command_error(cut)}, "
                                         "its timeout cut to the budget)")
                            if cut else str(err) if isinstance(err, StepFailed)
                            else describe_command_error(err))
        except BudgetExpired:
            step.result, step.message = StepResult.FAILED, budget_spent(ctx, step.name)
        except Exception as err:  # a bug must still end in 'failed' with the unavailable spec
            import traceback

            step.result = StepResult.FAILED
            step.message = f"internal error: {type(err).__name__}: {err}"
            self.run.log(Log.ERR, traceback.format_exc().replace("\n", " | "))
        step.duration_s = earlier + time.monotonic() - t0
        step.message = cut_reason(step.message)
        if step.result != StepResult.RUNNING:
            self.run.log.step(step)
        self.write()
        if step.result == StepResult.FAILED:
            return f"{step.name}: {step.message}"
        return None


def _dry_run(run: Run, ctx: BootContext) -> int:
    from podvm_gpu.boot.plan import notes, plan
    from podvm_gpu.jsontext import dumps

    commands, said = plan(ctx), notes(ctx)
    if run.json_out:
        print(dumps({"dry_run": True, "gpus": [g.to_dict() for g in ctx.gpus],
                     "nvswitches": [s.to_dict() for s in ctx.nvswitches], "commands": commands,
                     "notes": said}))
    else:
        import shlex

        for argv in commands:
            print(shlex.join(argv))
        for note in said:  # shell comments: the output stays a list of commands
            print(f"# {note}")
    return 0


def _standing_finding(run: Run) -> str | None:
    """The reason of a boot run again while the watcher's finding stands (podvm_gpu/watch/,
    issue 34): ``watch: ...`` naming it. A ready boot would turn the kernel log's findings into
    warnings and bring the failed GPU back into the spec; only ``podvm-gpu watch --clear``
    (an operator's explicit word) lets a boot past it."""
    from podvm_gpu.watchfile import standing_finding

    finding = standing_finding(run.root)
    if not finding:
        return None
    said = finding["reason"].removeprefix("watch: ")
    return cut_reason(f"watch: a finding of the watcher stands: {said}; the boot does not "
                      "bring the GPU back: replace the VM, or clear it with podvm-gpu watch "
                      "--clear and run the boot again")


def _fail(run: Run, reason: str) -> int:
    """End the boot ``failed``: the driver's reason for not attaching a GPU first when the log
    has one (podvm_gpu/steps/modules/attach.py: the tool that failed only says it found no device), what else the
    kernel log says appended (the facts the patterns name, then the driver's own error records
    not quoted yet), then :meth:`Run.fail`."""
    from podvm_gpu.steps.modules.attach import attach_cause

    records = kmsg.read_kernel_records(run.root)
    messages = [m for _level, m in records]
    cause = attach_cause(run.root, messages)
    if cause and "cannot attach" not in reason:
        step, _sep, said = reason.partition(": ")
        reason = f"{step}: the driver cannot attach the GPU: {cause}; {said}"
    loader = "firmware loader" in reason  # issue 28: not "GSP firmware missing" beside it
    extra = [kernel.describe(f) for f in kernel.findings(messages)
             if f.what.lower() not in reason.lower()
             and not (loader and f.kind == "gsp-firmware")][:2]
    quoted = (reason + " ".join(extra)).lower()
    errors = [e for e in kmsg.driver_errors(records) if e.lower() not in quoted]
    extra += [f'driver: "{e}"' for e in errors]
    if extra:
        reason = f"{reason}; kernel log: " + "; ".join(extra)
    return run.fail(reason)
