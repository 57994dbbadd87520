"""The fabric state of each GPU judged against the VM's GPUs: the fabricmanager step's one
decision (boot's wait and check's row); the fabric's health summary after it (issue 33). The
query and its parsers are the nvidia-smi back end's (podvm_gpu/gpufacts/smi.py:
``fabric_argv``, ``parse_fabric_rows``, ``parse_fabric``); their names are here too for the
step's readers.
"""

from __future__ import annotations

from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.gpufacts.smi import FABRIC_FIELDS, FabricState, fabric_argv, parse_fabric, parse_fabric_rows, summarize  # noqa: F401 (the step's names for the back end's)
from podvm_gpu.gpufacts.words import bus_id


class FabricSeen:
    """The GPUs' fabric state judged against the VM's GPUs: the one decision boot's wait
    (:func:`wait_for_fabric`) and check's row (:func:`fabricmanager_row`) both act on.

    Args:
        states: what the fabric query reported (parse.parse_fabric_rows).
        gpus: the VM's GPUs' PCI addresses (every one must be Completed/Success, not just the
            ones nvidia-smi happens to list).

    Attributes:
        waiting: the GPUs (PCI addresses) without fabric Completed/Success.
        unhealthy: the states Completed with another status than Success (a failure at once).
        ready: states were reported, every one Completed/Success, and no GPU is waiting.
    """

    __slots__ = ("states", "waiting", "unhealthy", "ready")

    def __init__(self, states: list[FabricState], gpus: list[str]):
        done = {bus_id(s.gpu) for s in states if s.success}
        self.states = states
        self.waiting = [g for g in gpus if bus_id(g) not in done]
        self.unhealthy = [s for s in states if s.completed and not s.success]
        self.ready = bool(states) and not self.waiting and all(s.success for s in states)

    def not_ready_said(self, most: int = 3) -> str:
        """The GPUs not Completed/Success, for a row: ``<gpu>: State X, Status Y``, then the
        GPUs that reported nothing; ``no state`` when nothing was reported."""
        reported = {bus_id(s.gpu) for s in self.states}
        said = [f"{s.gpu}: State {s.state}, Status {s.status}" for s in self.states if not s.success]
        said += [f"{g}: no state" for g in self.waiting if bus_id(g) not in reported]
        return ", ".join(said[:most]) or "no state"


def health_summary(ctx) -> str:
    """After the fabric is Completed/Success: each GPU's fabric health summary, a query of its
    own (gpufacts/smi.py ``fabric_health_argv``: 580 has the field, 535-555 refuse it, then
    "not offered"), judged once (gpufacts/judge.py ``summary_kind``): Healthy or N/A pass,
    Limited Capacity warns, Unhealthy fails naming the GPU; a word no table knows warns
    verbatim; an unanswered query warns. One bounded call (the harmless-call time).

    Raises:
        StepFailed: a GPU's summary is Unhealthy, or nvidia-smi says the driver or a GPU
            cannot answer (words.NVSMI_BROKEN).
    """
    argv = smi.fabric_health_argv()
    try:
        done = ctx.runner.run(argv, check=False, timeout=ctx.harmless_timeout("nvidia-smi"))
    except CommandError as err:
        ctx.warn(f"fabricmanager: fabric health summary not read ({err}); the boot does not "
                 "fail on it")
        return "health summary not read"
    broken = words.broken(done.returncode, done.output)
    if broken:
        raise StepFailed(f"fabric health summary: {broken}")
    rows = smi.parse_fabric_health(done.stdout) if done.returncode == 0 else None
    if rows is None and words.NOT_A_FIELD in done.output:
        return "health summary not offered by this nvidia-smi"
    if rows is None:
        ctx.warn(f"fabricmanager: fabric health summary not read "
                 f"({words.failed_call(argv, done.returncode, done.output)}); the boot does "
                 "not fail on it")
        return "health summary not read"
    unhealthy = [f"{bus}: health summary {summary}" for bus, summary in rows
                 if judge.summary_kind(summary) == judge.FATAL]
    if unhealthy:
        raise StepFailed(f"fabric unhealthy: {', '.join(unhealthy[:4])} (fabric.health.summary)")
    for bus, summary in rows:
        kind = judge.summary_kind(summary)
        if kind == judge.NOTE:
            ctx.warn(f"fabricmanager: GPU {bus}: fabric health summary {summary}: the NVLink "
                     "fabric works with less bandwidth than it should")
        elif kind is None:
            ctx.warn(f"fabricmanager: GPU {bus}: fabric health summary {summary!r} not "
                     "understood; the boot does not fail on it")
    counts: dict[str, int] = {}
    for _, summary in rows:
        counts[summary] = counts.get(summary, 0) + 1
    return "health summary " + ", ".join(f"{s} on {n} GPU(s)" for s, n in counts.items())
