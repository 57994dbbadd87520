"""What the confidential-computing step asks: nvidia-smi's CC queries, the guest's TEE, and the
fabricmanager step's end (the ready state is set only after it succeeded).

Every call is bounded (the runner's nvidia-smi timeout, cut to the boot's budget); the fabric
wait (the boot's one bounded wait, host/wait.py) polls the pipeline's record of the step every
0.05 s, stops when the boot stops, and ends at the budget.
"""

from __future__ import annotations

from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import ask, words
from podvm_gpu.host import kmsg, tee
from podvm_gpu.host.fs import Root
from podvm_gpu.model import StepResult
from podvm_gpu.steps.cc import classify
from podvm_gpu.steps.context import BootContext

FABRIC_STEP = "fabricmanager"
_POLL_S = 0.05
# Words in the kernel log of a TDX or SEV guest: only a hint (a warning), never the evidence that
# makes a guest confidential (host/tee.py): the log also holds a host's or a nested guest's lines.
KERNEL_LOG_SIGNS = ("Memory Encryption Features active", "SEV-SNP", "Intel TDX", "tdx: Guest")


def conf_compute(ctx: BootContext, *args: str):
    """``nvidia-smi conf-compute <args>``, its exit status not checked.

    Raises:
        StepFailed: nvidia-smi could not be run, or timed out (the reason names the command).
    """
    try:
        return ask.conf_compute(ctx.runner, *args)
    except CommandError as err:
        raise _not_run(err, *args) from err


def _not_run(err: CommandError, *args: str) -> StepFailed:
    """A ``nvidia-smi conf-compute <args>`` call that could not run, as a step failure."""
    command = f"nvidia-smi conf-compute {' '.join(args)}"
    said = str(err)  # a timeout names the command already; "not found" does not
    return StepFailed(said if said.startswith(command) else f"{command}: {said}")


def answers(run_one) -> dict:
    """Query -> ``(returncode, output)`` for :data:`classify.QUERIES`, asked side by side with
    ``run_one(query)`` (a finished call with ``returncode`` and ``output``; it runs on threads of
    its own) and read in that order: after an exit 9 (no driver) or 15 (a lost GPU) the rest
    are not read, the answer is decided. What the first query to raise in that order raised is
    raised, as asking one after another would have (issue 38: four queries side by side take
    about the time of one on a real H200, 27 ms against 94).
    """
    from podvm_gpu.host.proc import side_by_side

    done = side_by_side([lambda query=query: run_one(query) for query in classify.QUERIES])
    found = {}
    for query, (answer, err) in zip(classify.QUERIES, done):
        if err is not None:
            raise err
        found[query] = (answer.returncode, answer.output)
        if answer.returncode in (words.NVSMI_NO_DRIVER_RC, words.NVSMI_GPU_LOST_RC):
            break
    return found


def read_finding(ctx: BootContext) -> classify.CcAnswers:
    """The GPUs' :class:`~podvm_gpu.steps.cc.classify.CcAnswers` from nvidia-smi.

    Raises:
        StepFailed: nvidia-smi could not be run or timed out.
    """
    found = answers(lambda query: conf_compute(ctx, query))
    finding = classify.from_smi(found)
    for query in classify.QUERIES:
        if query not in found and query not in finding.unreadable:
            finding.unreadable[query] = "not read: the answer was decided"
    return finding


def guest(root: Root) -> tuple[str | None, str | None]:
    """The confidential guest (host/tee.py's evidence, described), or None; and a hint for a
    warning when only the kernel log speaks of a TEE (it never makes a confidential guest)."""
    found = tee.detect(root)
    if found.kind is not None:
        return found.describe(), None
    signs = [sign for sign in KERNEL_LOG_SIGNS
             if any(sign in message for message in kmsg.read_kernel_log(root))]
    if signs:
        return None, (f"the kernel log mentions {signs[0]!r}, but /proc/cpuinfo, /sys and /dev "
                      "show no TDX or SEV-SNP guest: treated as a regular VM")
    return None, None


def ready_state(ctx: BootContext) -> str:
    """The GPUs' ready state, ``ready`` or ``not-ready``.

    Raises:
        StepFailed: nvidia-smi failed or printed a value the agent does not know.
    """
    try:
        state, done = ask.ready_state(ctx.runner)
    except CommandError as err:
        raise _not_run(err, "-grs") from err
    if done.returncode != 0 or state not in ("ready", "not-ready"):
        raise StepFailed(f"cannot read the CC ready state (nvidia-smi conf-compute -grs "
                         f"{words.ended(done.returncode, done.output)})")
    return state


def wait_for_fabric(ctx: BootContext) -> str:
    """Wait until the fabricmanager step has ended well (``ok``, or ``skipped``: no fabric);
    ``""`` when it had already, else ``; after the fabric (N.NN s)``.

    The boot's one bounded wait (:meth:`BootContext.wait`): no limit of its own, the budget's
    (the fabric step's own wait bounds it first). A boot without the pipeline (a step run alone)
    has no such step and does not wait.

    Raises:
        StepFailed: the fabricmanager step failed, or the budget ran out first.
        Cancelled: the boot is stopping (ctx.check_stop).
    """
    def ended_well():
        step = next((s for s in ctx.status.steps if s.name == FABRIC_STEP), None)
        if step is not None and step.result == StepResult.FAILED:
            raise StepFailed("the ready state is not set: the fabricmanager step failed")
        return step is None or step.result in (StepResult.OK, StepResult.SKIPPED)

    waited = ctx.wait(ended_well, max(ctx.remaining(), 0.0), _POLL_S)
    if not waited.held:
        raise StepFailed(f"timed out: the boot budget of {ctx.config.budget_s:g} s was spent "
                         "waiting for the fabricmanager step before setting the ready state")
    return "" if waited.waited_s < _POLL_S else f"; after the fabric ({waited.waited_s:.2f} s)"
