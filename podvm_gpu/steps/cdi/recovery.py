"""The GPUs' reset status and recovery action (issue 28): part of the health gate
(steps/cdi/health.py) and of check's ``recovery-action`` row.

The recovery action is the driver's own verdict on what a GPU needs after an error: NVML field
``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (driver 565+), values ``NVML_GPU_RECOVERY_ACTION_*``:
0 None, 1 GPU Reset, 2 Node Reboot, 3 Drain P2P, 4 Drain and Reset. DCGM's health check misses it
(NVIDIA/DCGM#263: a GPU stuck asking for a reset reported Healthy). Two queries of their own, never
fields added to another query (a field the installed nvidia-smi rejects aborts its whole query):

- ``--query-gpu=pci.bus_id,reset_status.reset_required,reset_status.drain_and_reset_recommended``:
  accepted by every Debian build, 535.261.03 to 555.58.02 (their ``--help-query-gpu``: "GPU reset
  status information. Reports if there is a GPU reset required or drain and reset recommended to
  recover from a bad state. 'N/A' indicates that the field is not supported ...",
  ../shared/nvidia-smi-real.md);
- ``--query-gpu=pci.bus_id,gpu_recovery_action``: none of those builds knows the field; they print
  ``Field "gpu_recovery_action" is not a valid field to query.`` and exit 2 before any NVML call.
  That is "not offered", neither a failure nor a warning (it would warn on every boot).

The values: Yes/No (as ``retired_pages.pending`` in ``--query-gpu``; ``True``/``False``, ``1``/``0``
accepted too), ``[N/A]`` where unsupported; the recovery action by its NVML name (``GPU Reset``)
or number. No binary we could run prints either with a value (nvidia-smi-real.md "Limits"), so
the reader takes every spelling above; anything else is "not read", with a warning.

Verdicts: GPU Reset, Drain and Reset, reset required or drain-and-reset recommended: "GPU reset
needed" (the gate's reset list: ``health.reset_pending_warns`` applies); Node Reboot: failed (a pod
VM cannot reboot its host's node: the GPU is unusable here); Drain P2P: a warning (peer-to-peer
traffic should be drained: the GPU itself still works).
"""

from __future__ import annotations

RESET_FIELDS = ("pci.bus_id", "reset_status.reset_required",
                "reset_status.drain_and_reset_recommended")
ACTION_FIELDS = ("pci.bus_id", "gpu_recovery_action")
NOT_A_FIELD = "is not a valid field to query"

NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET = (
    "None", "GPU Reset", "Node Reboot", "Drain P2P", "Drain and Reset")
# nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) -> name (nvml.h, 565+)
ACTIONS = {0: NONE, 1: GPU_RESET, 2: NODE_REBOOT, 3: DRAIN_P2P, 4: DRAIN_AND_RESET}
_SPELLINGS = {"none": NONE, "gpureset": GPU_RESET, "reset": GPU_RESET,
              "nodereboot": NODE_REBOOT, "reboot": NODE_REBOOT, "drainp2p": DRAIN_P2P,
              "drainandreset": DRAIN_AND_RESET}
_YES, _NO = ("yes", "true", "1"), ("no", "false", "0")


def reset_argv() -> list[str]:
    """``nvidia-smi --query-gpu=<RESET_FIELDS> --format=csv,noheader``."""
    return ["nvidia-smi", f"--query-gpu={','.join(RESET_FIELDS)}", "--format=csv,noheader"]


def action_argv() -> list[str]:
    """``nvidia-smi --query-gpu=<ACTION_FIELDS> --format=csv,noheader``."""
    return ["nvidia-smi", f"--query-gpu={','.join(ACTION_FIELDS)}", "--format=csv,noheader"]


def action_name(value: str) -> str | None:
    """The recovery action's NVML name from nvidia-smi's text or NVML's number; None when it
    is none of them (``[N/A]``, an error text)."""
    text = value.strip()
    if text.isdigit():
        return ACTIONS.get(int(text))
    key = "".join(ch for ch in text.lower() if ch.isalnum())
    return _SPELLINGS.get(key)


def _na(value: str) -> bool:
    return value.strip().strip("[]").lower() in ("n/a", "not supported", "")


class Found:
    """What the two queries said: ``fatal`` / ``reset`` / ``warn`` lines (one per finding),
    ``read`` (one line per GPU), ``unread`` (why a value or a query was not read)."""

    def __init__(self):
        self.fatal: list[str] = []
        self.reset: list[str] = []
        self.warn: list[str] = []
        self.read: list[str] = []
        self.unread: list[str] = []


def judge_reset(rows: list[list[str]], found: Found) -> None:
    """Rows of :data:`RESET_FIELDS` into ``found``."""
    for bus, required, drain in rows:
        if _na(required) and _na(drain):
            found.read.append(f"{bus} reset status N/A")
            continue
        unknown = [v for v in (required, drain) if not _na(v) and v.lower() not in _YES + _NO]
        if unknown:
            found.unread.append(f"GPU {bus}: reset status {', '.join(unknown)} not understood")
        if required.lower() in _YES:
            found.reset.append(f"GPU {bus}: the driver says a reset is required "
                               "(reset_status.reset_required Yes): GPU reset needed")
        if drain.lower() in _YES:
            found.reset.append(f"GPU {bus}: the driver recommends drain and reset "
                               "(reset_status.drain_and_reset_recommended Yes): GPU reset needed")
        found.read.append(f"{bus} reset required {required}, drain and reset {drain}")


def judge_action(rows: list[list[str]], found: Found) -> None:
    """Rows of :data:`ACTION_FIELDS` into ``found``."""
    for bus, value in rows:
        if _na(value):
            found.read.append(f"{bus} recovery action N/A")
            continue
        action = action_name(value)
        if action is None:
            found.unread.append(f"GPU {bus}: recovery action {value!r} not understood")
            continue
        said = f"GPU {bus}: recovery action {action} (gpu_recovery_action)"
        if action == NODE_REBOOT:
            found.fatal.append(f"{said}: the driver asks for a reboot of the host's node; the "
                               "GPU is unusable until then")
        elif action in (GPU_RESET, DRAIN_AND_RESET):
            found.reset.append(f"{said}: GPU reset needed")
        elif action == DRAIN_P2P:
            found.warn.append(f"{said}: drain peer-to-peer traffic (NVLink/PCIe P2P) before "
                              "using it across GPUs")
        found.read.append(f"{bus} recovery action {action}")


def read(ask, runner, timeout: float) -> Found:
    """Run both queries with ``ask`` (health.ask: ``(rows, "")`` or ``(None, why)``) and judge
    them. A query not answered is in ``unread``, except ``gpu_recovery_action`` refused as
    "not a valid field" (nvidia-smi before 565: not offered, said in ``read``)."""
    found = Found()
    rows, why = ask(runner, reset_argv(), len(RESET_FIELDS), timeout)
    if rows is None:
        found.unread.append(f"reset status not read ({why})")
    else:
        judge_reset(rows, found)
    rows, why = ask(runner, action_argv(), len(ACTION_FIELDS), timeout)
    if rows is None and NOT_A_FIELD in why:
        found.read.append("recovery action not offered by this nvidia-smi")
    elif rows is None:
        found.unread.append(f"recovery action not read ({why})")
    else:
        judge_action(rows, found)
    return found


def check_row(facts, ask):
    """check's ``recovery-action`` row: both queries, judged as the gate judges them. A node
    reboot fails; a reset needed fails unless ``health.reset_pending_warns`` (then warns); Drain
    P2P and anything unread warn; ``skip`` before the driver or when the boot never reached
    ``cdi``.

    Args:
        facts: check's facts (podvm_gpu/check/vm.py); ask: health.ask.
    """
    from podvm_gpu.row import FAIL, PASS, SKIP, WARN, Check, doc_ref
    from podvm_gpu.steps.context import HARMLESS_CALL_S

    name = "recovery-action"
    skip = facts.not_reached("cdi")
    if skip:
        return Check(name, SKIP, skip.detail)
    skip = facts.needs_driver(name)
    if skip:
        return skip
    timeout = min(facts.runner.timeouts.get("nvidia-smi", HARMLESS_CALL_S), HARMLESS_CALL_S)
    found = read(ask, facts.runner, timeout)
    said = "; ".join(found.fatal + found.reset + found.warn + found.unread) or \
        "; ".join(found.read)
    if found.fatal:
        return Check(name, FAIL, said, "the GPU needs its host's node rebooted: ask the provider "
                     "for another host, or to reboot this one")
    if found.reset:
        warns = facts.config.health.reset_pending_warns
        return Check(name, WARN if warns else FAIL, said + (
            " (a warning: health.reset_pending_warns)" if warns else ""),
            "reset the GPU (nvidia-smi -r with no process using it, or restart the VM on its "
            "host)")
    if found.warn or found.unread:
        return Check(name, WARN, said, f"see {doc_ref('operating.md', 'Recovery action')}")
    return Check(name, PASS, said)
