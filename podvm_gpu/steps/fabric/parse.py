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
    """What the health queries found, the one judgement boot's step, check's row and the
    watcher act on: ``fatal`` (Unhealthy, a route unhealthy), ``notes`` (Limited Capacity, a
    recovery in progress, a word not understood), each ``(gpu, what)``; ``unread`` (why a query
    was not read; empty when read or not offered), ``said`` (for a message) and ``gpus``
    (status.json's ``fabric.health``: per GPU the values as printed, NVML's summary number and
    health mask)."""

    __slots__ = ("fatal", "notes", "unread", "said", "gpus")

    def __init__(self):
        self.fatal: list[tuple[str, str]] = []
        self.notes: list[tuple[str, str]] = []
        self.unread = ""
        self.said = ""
        self.gpus: list[dict] = []


def _ask(runner, argv: list[str], parse, timeout: float):
    """``(parsed, None)``, or ``(None, why)`` with why ``""`` for a field this nvidia-smi does
    not offer.

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    try:
        done = runner.run(argv, check=False, timeout=timeout)
    except CommandError as err:
        return None, str(err)
    broken = words.broken(done.returncode, done.output)
    if broken:
        raise StepFailed(f"fabric health: {broken}")
    parsed = parse(done.stdout) if done.returncode == 0 else None
    if parsed is None and words.NOT_A_FIELD in done.output:
        return None, ""
    if parsed is None:
        return None, words.failed_call(argv, done.returncode, done.output)
    return parsed, None


def read_summary(runner, timeout: float) -> Summary:
    """After the fabric is Completed/Success: each GPU's fabric health summary, a query of its
    own (gpufacts/smi.py ``fabric_health_argv``: 580 has the field, 535-555 refuse it, then
    "not offered"), and where it was read 580's detail of it (``fabric_detail_argv``), judged
    once (gpufacts/judge.py ``fabric_health``): Healthy or N/A pass, Limited Capacity, a
    recovery in progress or a word not understood are notes, Unhealthy or a route unhealthy
    fatal naming the GPU; an unanswered query unread. Two calls of at most ``timeout`` seconds.

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    found = Summary()
    rows, why = _ask(runner, smi.fabric_health_argv(), smi.parse_fabric_health, timeout)
    if rows is None:
        found.unread = why
        found.said = "health summary not read" if why else \
            "health summary not offered by this nvidia-smi"
        return found
    detail, why = _ask(runner, smi.fabric_detail_argv(), smi.parse_fabric_detail, timeout)
    if why:
        found.unread = why
    counts: dict[str, int] = {}
    for bus, summary in rows:
        counts[summary] = counts.get(summary, 0) + 1
        values = (detail or {}).get(bus)
        health = judge.fabric_health(summary, values)
        for kind, what in health.findings:
            (found.fatal if kind == judge.FATAL else found.notes).append((bus, what))
        found.gpus.append({"gpu": bus, "summary": summary, **{
            d.field: (values or {}).get(d.field) for d in judge.HEALTH_DETAIL},
            "summary_code": health.summary_code, "mask": None if values is None else health.mask})
    found.said = "health summary " + ", ".join(f"{s} on {n} GPU(s)" for s, n in counts.items())
    return found


def said(pairs: list[tuple[str, str]], most: int = 4) -> str:
    """``<gpu>: <what>, ...`` for the first ``most`` findings."""
    return ", ".join(f"{gpu}: {what}" for gpu, what in pairs[:most])


def health_summary(ctx) -> str:
    """Boot's side of :func:`read_summary` (the harmless-call time): notes and an unread query
    are warnings, the boot does not fail on them; what was read goes to status.json's
    ``fabric.health``.

    Raises:
        StepFailed: a GPU's summary is Unhealthy or a route unhealthy, or the driver or a GPU
            cannot answer.
    """
    found = read_summary(ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    if getattr(ctx, "fabric", None) is not None and found.gpus:
        ctx.fabric.health = found.gpus
    if found.fatal:
        raise StepFailed(f"fabric unhealthy: {said(found.fatal)}")
    if found.unread:
        ctx.warn(f"fabricmanager: fabric health not read ({found.unread}); the boot "
                 "does not fail on it")
    for gpu, note in found.notes:
        ctx.warn(f"fabricmanager: GPU {gpu}: {note}" + ("; the boot does not fail on it"
                                                        if "not understood" in note else ""))
    return found.said


def summary_row(facts, said_before: str) -> Check:
    """The fabricmanager row once the fabric is ready: the health judged as boot judges it
    (parse.read_summary): Unhealthy or a route unhealthy fails, a note or an unread query
    warns."""
    try:
        found = read_summary(facts.runner, facts.runner.timeouts.get("nvidia-smi", 10))
    except StepFailed as err:
        return Check("fabricmanager", FAIL, f"{said_before}; {err}", "reboot the VM; if a GPU "
                     "stays lost, ask the provider for another host")
    text = f"{said_before}; {found.said}"
    if found.fatal:
        return Check("fabricmanager", FAIL, f"{text}: {said(found.fatal)}",
                     "the NVLink fabric is unhealthy: ask the provider for another host")
    if found.notes or found.unread:
        return Check("fabricmanager", WARN, "; ".join([text, *(
            f"GPU {gpu}: {note}" for gpu, note in found.notes), *(
            [f"not read ({found.unread})"] if found.unread else [])]),
                     "run nvidia-smi -q and read its Fabric Health section")
    return Check("fabricmanager", PASS, text)
