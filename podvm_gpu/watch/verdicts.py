"""The watcher's verdicts, taken from the boot's own readers and judgements: the one place the
watcher asks what a kernel record, a recovery action, a memory-health answer or a fabric state
means (issue 34: "verdicts from one table shared with boot").

Every rule here is the boot's, called, not copied:

- the kernel log: :mod:`podvm_gpu.host.kmsg` (its record patterns and ``FATAL_KINDS``) and the
  one Xid table, :mod:`podvm_gpu.xids` (fatal codes, the codes that are one application's error
  and only warnings, NVLink 5's 144-150 judged by their record's ``Fatal``/``Nonfatal``, a
  ``caused by previous Xid N`` record counted as N's follow-on);
- Xid 154 (the driver changed a GPU's recovery action) is read over its hex code, not its label,
  which differs by branch (``... changed from 0x0 (None) to 0x1 (PF FLR)`` on 610): the code is
  NVML's ``NVML_GPU_RECOVERY_ACTION_*`` number (:data:`podvm_gpu.gpufacts.judge.ACTIONS`);
- the recovery action, reset status and memory health: :mod:`podvm_gpu.gpufacts.health` (the
  queries and judges the boot's gate and check use), each finding gpufacts/finding.py's type;
- the fabric: :mod:`podvm_gpu.steps.fabric.parse`.

The GPU-facts package (issue 33, podvm_gpu/gpufacts) holds the recovery-action table and the
bus-id normaliser this module uses; the health gate's and the fabric step's queries are called
through their steps, which take them from there.
"""

from __future__ import annotations

import re

from podvm_gpu.gpufacts import ask, health, judge, kernel, smi, xids
from podvm_gpu.gpufacts.finding import FAIL, NONE, REPLACE, RESET, WARN, Finding, finding, reset_needed
from podvm_gpu.gpufacts.words import bus_id, failed_call
from podvm_gpu.steps.fabric import parse as fabric_parse

# The NVIDIA modules' own records (gpufacts/kernel.py's list of them): "NVRM: ...", "nvidia: ...",
# "nvidia-uvm: ...", "nvidia 0000:01:00.0: ..." (dev_err), "nvidia-modeset: ...", "nvidia-nvlink: ..."
NVIDIA_PREFIXES = ("NVRM:", "nvidia")
_ACTION_CODE = re.compile(r"\bto (0x[0-9A-Fa-f]{1,8})\b")


def judge_record(message: str, xids_seen: set[int] | None = None,
                 reset_pending_warns: bool = False) -> list[Finding]:
    """What one kernel record (its message, without the prefix) says about the GPUs: findings
    of level warn or fail (gpufacts/finding.py), ``gpu`` the PCI address the record names.

    Args:
        message: the record; xids_seen: the Xid codes of the records judged before (added to
            here), so that a ``caused by previous Xid N`` record of an N seen is N's follow-on
            and no verdict of its own (None: nothing seen before); reset_pending_warns: the
            config's ``health.reset_pending_warns`` (Xid 154 asking for a reset).

    Returns an empty list for a record that says nothing about them (most of the log).
    """
    found = []
    if "Xid" in message:
        m = kernel.XID_PATTERN.search(message)
        if m and int(m.group("code")) == xids.RECOVERY_XID:
            if xids_seen is not None:
                xids_seen.add(xids.RECOVERY_XID)
            verdict = _recovery_xid(m.group("pci").lower(), message, reset_pending_warns)
            return [verdict] if verdict else []
    for seen in kernel.findings([message], xids_seen):
        gpu = seen.gpu  # the PCI address the record's pattern names (an Xid's always)
        if seen.kind == "xid":
            if seen.code in xids.WARN_XIDS and not seen.fatal:
                found.append(finding(WARN, f"{seen.what} ({xids.WARN_XIDS[seen.code]})", gpu=gpu))
                continue
        elif not message.startswith(NVIDIA_PREFIXES):
            # the boot's patterns explain a failed load from the whole log; after boot only the
            # driver's own records count ("reset required", "firmware ... failed" of a NIC or
            # a USB device are no finding about a GPU)
            continue
        elif gpu is None:
            m = re.search(r"GPU (?:at PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                          r"(?:\.[0-7])?)", seen.evidence)
            gpu = m.group(1) if m else None
        found.append(finding(seen.level, seen.what, gpu=gpu))
    return found


def _recovery_xid(gpu: str, message: str, reset_pending_warns: bool) -> Finding | None:
    """Xid 154 judged as the boot judges the recovery action (gpufacts/judge.py's table of
    NVML's actions 0-7); None for ``None`` (recovered)."""
    m = _ACTION_CODE.search(message)
    action = judge.action_of(int(m.group(1), 16)) if m else None
    said = f"Xid 154 on GPU {gpu}: recovery action changed to {m.group(1) if m else '?'}"
    if action is None:
        return finding(WARN, f"{said}, a code this agent does not know; not read as a verdict",
                       gpu=gpu)
    if action.kind == judge.FINE:
        return None
    said = f"{said} ({action.name}): {judge.action_says(action)}"
    if action.kind == judge.RESET:
        return reset_needed(said, gpu, reset_pending_warns)
    return finding(FAIL if action.kind == judge.FATAL else WARN, said, gpu=gpu,
                   action=REPLACE if action.kind == judge.FATAL else NONE)


def poll_health(runner, timeout: float,
                reset_pending_warns: bool = False) -> tuple[list[Finding], list[str]]:
    """The memory health and recovery queries the boot's gate runs, judged as it judges them
    (gpufacts/health.py).

    Returns:
        ``(findings, unread)``: what was found (warn or fail; those that ask for a replacement
        first, then a reset, then the others), and why a query or value was not read (a
        warning, never a verdict: the watcher raises no false alarm of its own).
    """
    unread: list[str] = []
    try:
        found = health.read_memory(runner, timeout, reset_pending_warns, unread)
    except health.Broken as err:
        return [finding(FAIL, str(err), gpu=err.gpu)], unread
    unread += health.said(found, "unread-value", "unread")
    return ([f for f in found if f.action == REPLACE] + [f for f in found if f.action == RESET]
            + [f for f in found if f.kind == "note"]), unread


def poll_fabric(runner, timeout: float, gpus: list[str],
                seen: dict | None = None) -> tuple[list[Finding], list[str]]:
    """The fabric state of ``gpus`` (PCI addresses) by the boot's fabric query: a GPU whose
    fabric is no longer Completed/Success is fatal; an answer not read is a warning. Then, with
    ``seen`` (a dict: the boot read 580's fabric health, status.json's ``fabric.health``), the
    health the boot's step reads, judged as it judges it (fabric_parse.read_summary: gpufacts'
    queries and judgement): a fatal finding is fatal, a note a warning; what was read goes to
    ``seen["fabric_health"]`` (watch.json, the exporter's ``DCGM_FI_DEV_FABRIC_HEALTH_*``).
    Without ``seen`` (535-555 refuse the fields: the driver does not change under the watcher)
    the health is not asked."""
    from podvm_gpu.errors import CommandError, StepFailed

    try:
        states, done = ask.fabric_rows(runner, timeout)
    except CommandError as err:
        return [], [f"fabric state not read ({err})"]
    if states is None:
        return [], [f"fabric state not read ({failed_call(smi.fabric_argv(), done.returncode, done.output)})"]
    wanted = {bus_id(g) for g in gpus}
    out = [finding(FAIL, f"GPU {s.gpu}: fabric State {s.state}, Status {s.status} (was "
                         "Completed/Success at boot)", gpu=s.gpu)  # a lost GPU is no success either
           for s in states if bus_id(s.gpu) in wanted and s.supported and not s.success]
    if out or seen is None:
        return out, []
    try:
        findings, read, unread, _ = fabric_parse.read_summary(runner, timeout)
    except StepFailed as err:
        gpus = judge.buses_in([str(err)])
        return [finding(FAIL, str(err), gpu=gpus[0] if gpus else None)], []
    if read:
        seen["fabric_health"] = read
    out = [finding(FAIL, f"GPU {f.gpu}: fabric unhealthy: {f.what}", gpu=f.gpu) for f in findings if f.fatal]
    out += [finding(WARN, f"GPU {f.gpu}: {f.what}", gpu=f.gpu) for f in findings if not f.fatal]
    return out, [f"fabric health not read ({unread})"] if unread else []


def same_gpu(named: str, address: str) -> bool:
    """Whether ``named`` (as a source prints it: ``0000:01:00`` in an Xid, ``00000000:01:00.0``
    in nvidia-smi) is the GPU at ``address`` (``0000:01:00.0``, status.json): their forms by the
    one bus-id normaliser (gpufacts/words.py) are equal."""
    return bus_id(named) == bus_id(address)
