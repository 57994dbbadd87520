"""The fabric's health summary after the fabric is ready (issue 33): read, then mapped to boot's
step and check's row. The judgements are gpufacts' (podvm_gpu/gpufacts/judge.py: ``fabric_state``,
the GPUs' fabric state against the VM's GPUs, the fabricmanager step's one decision for boot's
wait and check's row; ``fabric_health``, each GPU's health as gpufacts/finding.py findings); the
queries and their parsers are the nvidia-smi back end's, run and parsed by its readers
(podvm_gpu/gpufacts/ask.py: ``fabric_rows``, ``fabric_health``, ``fabric_detail``).
"""

from __future__ import annotations

import collections

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import ask, judge
from podvm_gpu.gpufacts.finding import Finding
from podvm_gpu.row import FAIL, PASS, WARN, Check


def read_summary(runner, timeout: float) -> tuple[list[Finding], list[dict], str, str]:
    """After the fabric is Completed/Success: each GPU's fabric health summary, a query of its
    own (gpufacts/smi.py ``fabric_health_argv``: 580 has the field, 535-555 refuse it, then
    "not offered"), and where it was read 580's detail of it (``fabric_detail_argv``), judged
    once (gpufacts/judge.py ``fabric_health``): Healthy or N/A pass, Limited Capacity, a
    recovery in progress or a word not understood are notes, Unhealthy or a route unhealthy
    fatal naming the GPU; an unanswered query unread. Two calls of at most ``timeout`` seconds.

    Returns:
        ``(findings, read, unread, said)``: the judge's findings (gpufacts/finding.py: level
        ``FAIL`` for a fatal one, Unhealthy or a route unhealthy; ``WARN`` for a note, Limited
        Capacity, a recovery in progress, a word not understood; each naming its GPU); what was
        read (status.json's ``fabric.health``: per GPU the values as printed, NVML's summary
        number and health mask); why a query was not read (empty when read or not offered);
        what was found, for a message.

    Raises:
        StepFailed: nvidia-smi says the driver or a GPU cannot answer (words.NVSMI_BROKEN).
    """
    rows, why = ask.fabric_health(runner, timeout)
    if rows is None:
        return [], [], why, "health summary not read" if why else \
            "health summary not offered by this nvidia-smi"
    detail, unread = ask.fabric_detail(runner, timeout)
    findings: list[Finding] = []
    read: list[dict] = []
    for bus, summary in rows:
        values = (detail or {}).get(bus)
        health = judge.fabric_health(summary, values, bus)
        findings += health.findings
        read.append({"gpu": bus, "summary": summary, **{
            d.field: (values or {}).get(d.field) for d in judge.HEALTH_DETAIL},
            "summary_code": health.summary_code, "mask": None if values is None else health.mask})
    return findings, read, unread or "", "health summary " + ", ".join(
        f"{s} on {n} GPU(s)" for s, n in collections.Counter(s for _, s in rows).items())


def said(findings: list[Finding], most: int = 4) -> str:
    """``<gpu>: <what>, ...`` for the first ``most`` findings."""
    return ", ".join(f"{f.gpu}: {f.what}" for f in findings[:most])


def health_summary(ctx) -> str:
    """Boot's side of :func:`read_summary` (the harmless-call time): notes and an unread query
    are warnings, the boot does not fail on them; what was read goes to status.json's
    ``fabric.health``.

    Raises:
        StepFailed: a GPU's summary is Unhealthy or a route unhealthy, or the driver or a GPU
            cannot answer.
    """
    findings, read, unread, found = read_summary(ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    if getattr(ctx, "fabric", None) is not None and read:
        ctx.fabric.health = read
    fatal = [f for f in findings if f.fatal]
    if fatal:
        raise StepFailed(f"fabric unhealthy: {said(fatal)}")
    if unread:
        ctx.warn(f"fabricmanager: fabric health not read ({unread}); the boot "
                 "does not fail on it")
    for note in findings:
        ctx.warn(f"fabricmanager: GPU {note.gpu}: {note.what}" + (
            "; the boot does not fail on it" if note.kind == judge.FABRIC_UNKNOWN else ""))
    return found


def summary_row(facts, said_before: str) -> Check:
    """The fabricmanager row once the fabric is ready: the health judged as boot judges it
    (parse.read_summary): Unhealthy or a route unhealthy fails, a note or an unread query
    warns."""
    try:
        findings, _, unread, found = read_summary(facts.runner,
                                                  facts.runner.timeouts.get("nvidia-smi", 10))
    except StepFailed as err:
        return Check("fabricmanager", FAIL, f"{said_before}; {err}", "reboot the VM; if a GPU "
                     "stays lost, ask the provider for another host")
    text = f"{said_before}; {found}"
    fatal = [f for f in findings if f.fatal]
    if fatal:
        return Check("fabricmanager", FAIL, f"{text}: {said(fatal)}",
                     "the NVLink fabric is unhealthy: ask the provider for another host")
    if findings or unread:
        return Check("fabricmanager", WARN, "; ".join([text, *(
            f"GPU {note.gpu}: {note.what}" for note in findings), *(
            [f"not read ({unread})"] if unread else [])]),
                     "run nvidia-smi -q and read its Fabric Health section")
    return Check("fabricmanager", PASS, text)
