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
from podvm_gpu.row import FAIL, PASS, WARN, Check


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


class Summary:
    """What the health summary query found, the one judgement boot's step and check's row act
    on: ``fatal`` (Unhealthy), ``notes`` (Limited Capacity, a word not understood), ``unread``
    (why it was not read; empty when read or not offered), ``said`` (for a message)."""

    __slots__ = ("fatal", "notes", "unread", "said")

    def __init__(self):
        self.fatal: list[str] = []
        self.notes: list[str] = []
        self.unread = ""
        self.said = ""


def read_summary(runner, timeout: float) -> Summary:
    """After the fabric is Completed/Success: each GPU's fabric health summary, a query of its
    own (gpufacts/smi.py ``fabric_health_argv``: 580 has the field, 535-555 refuse it, then
    "not offered"), judged once (gpufacts/judge.py ``summary_kind``): Healthy or N/A pass,
    Limited Capacity is a note, Unhealthy fatal naming the GPU; a word no table knows a note
    quoting it; an unanswered query unread. One call of at most ``timeout`` seconds.

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    found = Summary()
    argv = smi.fabric_health_argv()
    try:
        done = runner.run(argv, check=False, timeout=timeout)
    except CommandError as err:
        found.unread, found.said = str(err), "health summary not read"
        return found
    broken = words.broken(done.returncode, done.output)
    if broken:
        raise StepFailed(f"fabric health summary: {broken}")
    rows = smi.parse_fabric_health(done.stdout) if done.returncode == 0 else None
    if rows is None and words.NOT_A_FIELD in done.output:
        found.said = "health summary not offered by this nvidia-smi"
        return found
    if rows is None:
        found.unread = words.failed_call(argv, done.returncode, done.output)
        found.said = "health summary not read"
        return found
    counts: dict[str, int] = {}
    for bus, summary in rows:
        counts[summary] = counts.get(summary, 0) + 1
        kind = judge.summary_kind(summary)
        if kind == judge.FATAL:
            found.fatal.append(f"{bus}: health summary {summary}")
        elif kind == judge.NOTE:
            found.notes.append(f"GPU {bus}: fabric health summary {summary}: the NVLink fabric "
                               "works with less bandwidth than it should")
        elif kind is None:
            found.notes.append(f"GPU {bus}: fabric health summary {summary!r} not understood")
    found.said = "health summary " + ", ".join(f"{s} on {n} GPU(s)" for s, n in counts.items())
    return found


def health_summary(ctx) -> str:
    """Boot's side of :func:`read_summary` (the harmless-call time): notes and an unread query
    are warnings, the boot does not fail on them.

    Raises:
        StepFailed: a GPU's summary is Unhealthy, or the driver or a GPU cannot answer.
    """
    found = read_summary(ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    if found.fatal:
        raise StepFailed(f"fabric unhealthy: {', '.join(found.fatal[:4])} (fabric.health.summary)")
    if found.unread:
        ctx.warn(f"fabricmanager: fabric health summary not read ({found.unread}); the boot "
                 "does not fail on it")
    for note in found.notes:
        ctx.warn(f"fabricmanager: {note}" + ("; the boot does not fail on it"
                                             if "not understood" in note else ""))
    return found.said


def summary_row(facts, said: str) -> Check:
    """The fabricmanager row once the fabric is ready: the health summary judged as boot
    judges it (parse.read_summary): Unhealthy fails, a note or an unread query warns."""
    try:
        found = read_summary(facts.runner, facts.runner.timeouts.get("nvidia-smi", 10))
    except StepFailed as err:
        return Check("fabricmanager", FAIL, f"{said}; {err}", "reboot the VM; if a GPU stays "
                     "lost, ask the provider for another host")
    said = f"{said}; {found.said}"
    if found.fatal:
        return Check("fabricmanager", FAIL, f"{said}: {', '.join(found.fatal[:4])}",
                     "the NVLink fabric is unhealthy: ask the provider for another host")
    if found.notes or found.unread:
        return Check("fabricmanager", WARN, "; ".join([said, *found.notes, *(
            [f"not read ({found.unread})"] if found.unread else [])]),
                     "run nvidia-smi -q and read its Fabric Health section")
    return Check("fabricmanager", PASS, said)
