"""The GPUs' reset status and recovery action (issue 28): part of the health gate
(steps/cdi/health.py) and of check's ``recovery-action`` row.

The recovery action is the driver's own verdict on what a GPU needs after an error: NVML field
``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (driver 565+), values ``NVML_GPU_RECOVERY_ACTION_*``:
0 None, 1 GPU Reset, 2 Node Reboot, 3 Drain P2P, 4 Drain and Reset, 5 Recover IMEX Domain, 6 Bus
Reset, 7 System Reboot (the one table: gpufacts/judge.py ``ACTIONS``). DCGM's health check misses it
(NVIDIA/DCGM#263: a GPU stuck asking for a reset reported Healthy). Two queries of their own, never
fields added to another query (a field the installed nvidia-smi rejects aborts its whole query):

- ``--query-gpu=pci.bus_id,reset_status.reset_required,reset_status.drain_and_reset_recommended``:
  accepted by every Debian build, 535.261.03 to 555.58.02 (their ``--help-query-gpu``: "GPU reset
  status information. Reports if there is a GPU reset required or drain and reset recommended to
  recover from a bad state. 'N/A' indicates that the field is not supported ...",
  ../shared/nvidia-smi-real.md); refused by 580 (``Field "reset_status.reset_required" is not a
  valid field to query.``, exit 2, tests/data/real/h200-580): NVML deprecated the fields in 570
  for the recovery action. Refused while the recovery action answers, it is "not offered", no
  warning; refused while the recovery action does not answer either, a warning.
- ``--query-gpu=pci.bus_id,gpu_recovery_action``: none of the Debian builds knows the field; they
  print ``Field "gpu_recovery_action" is not a valid field to query.`` and exit 2 before any NVML
  call. That is "not offered", neither a failure nor a warning (it would warn on every boot).
  580 answers ``00000000:00:06.0, None``.

The values: Yes/No (as ``retired_pages.pending`` in ``--query-gpu``; ``True``/``False``, ``1``/``0``
accepted too), ``[N/A]`` where unsupported; the recovery action by its NVML name (``GPU Reset``),
the short labels (``Reset``, ``Reboot``) or number, any case, or ``<number>, <words>``; anything
else is "not read", with a warning that quotes it.

Verdicts (gpufacts/judge.py): GPU Reset, Drain and Reset, Bus Reset, reset required or
drain-and-reset recommended: "GPU reset needed" (the gate's reset list: ``health.reset_pending_warns``
applies); Node Reboot, System Reboot: failed (a pod VM cannot reboot its host: the GPU is unusable
here); Drain P2P, Recover IMEX Domain: a warning (the GPU itself still works).
"""

from __future__ import annotations

from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.gpufacts.smi import ACTION_FIELDS, RESET_FIELDS, action_argv, reset_argv  # noqa: F401
from podvm_gpu.gpufacts.words import NOT_A_FIELD

_na, _flag = words.na, smi.flag


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
        unknown = [v for v in (required, drain) if not _na(v) and _flag(v) is None]
        if unknown:
            found.unread.append(f"GPU {bus}: reset status {', '.join(unknown)} not understood")
        if _flag(required):
            found.reset.append(f"GPU {bus}: the driver says a reset is required "
                               "(reset_status.reset_required Yes): GPU reset needed")
        if _flag(drain):
            found.reset.append(f"GPU {bus}: the driver recommends drain and reset "
                               "(reset_status.drain_and_reset_recommended Yes): GPU reset needed")
        found.read.append(f"{bus} reset required {required}, drain and reset {drain}")


def judge_action(rows: list[list[str]], found: Found) -> None:
    """Rows of :data:`ACTION_FIELDS` into ``found``, each action judged by its kind
    (gpufacts/judge.py: the table of the 8 actions); a value no table knows is said verbatim
    in ``unread``."""
    for row in rows:
        bus, value = row[0], ", ".join(row[1:])  # "1, Reset" (NVIDIA/DCGM#263) is one value
        if _na(value):
            found.read.append(f"{bus} recovery action N/A")
            continue
        action = judge.action_of(value)
        if action is None:
            found.unread.append(f"GPU {bus}: recovery action {value!r} not understood")
            continue
        said = f"GPU {bus}: recovery action {action.name} (gpu_recovery_action)"
        if action.kind == judge.FATAL:
            found.fatal.append(f"{said}: {judge.action_says(action)}")
        elif action.kind == judge.RESET:
            found.reset.append(f"{said}: {judge.action_says(action)}")
        elif action.kind == judge.NOTE:
            found.warn.append(f"{said}: {judge.action_says(action)}")
        found.read.append(f"{bus} recovery action {action.name}")


def _action_rows(text: str) -> list[list[str]] | None:
    """The action query's rows: two values each, or three where the value is ``<number>,
    <words>`` (a real nvidia-smi printed ``1, Reset``, NVIDIA/DCGM#263)."""
    return words.csv_rows(text, len(ACTION_FIELDS)) or words.csv_rows(text, len(ACTION_FIELDS) + 1)


def read(ask, runner, timeout: float) -> Found:
    """Run both queries with ``ask`` (health.ask: ``(rows, "")`` or ``(None, why)``) and judge
    them. A query not answered is in ``unread``, except a field refused as "not a valid field"
    (not offered by this nvidia-smi, said in ``read``): ``gpu_recovery_action`` before 565, and
    the reset status after 570 when the recovery action answers (NVML deprecated the reset
    status for it; 580 refuses the fields, tests/data/real/h200-580)."""
    found = Found()
    reset_rows, reset_why = ask(runner, reset_argv(), len(RESET_FIELDS), timeout)
    action_rows, action_why = ask(runner, action_argv(), len(ACTION_FIELDS), timeout,
                                  parse=_action_rows)
    action_answers = action_rows is not None
    if reset_rows is not None:
        judge_reset(reset_rows, found)
    elif NOT_A_FIELD in reset_why and action_answers:
        found.read.append("reset status not offered by this nvidia-smi (deprecated since 570: "
                          "the recovery action says it)")
    else:
        found.unread.append(f"reset status not read ({reset_why})")
    if action_rows is None and NOT_A_FIELD in action_why:
        found.read.append("recovery action not offered by this nvidia-smi")
    elif action_rows is None:
        found.unread.append(f"recovery action not read ({action_why})")
    else:
        judge_action(action_rows, found)
    return found


def health_row_start(facts, name: str):
    """What every health row of check asks first (row-remapper, memory-errors,
    recovery-action): ``(row, None)`` when the row ends before its query (``skip``: the last
    boot never reached ``cdi``, or the driver is not there), else ``(None, timeout)``, the
    nvidia-smi timeout of a harmless call (``tools`` timeouts, at most
    :data:`~podvm_gpu.steps.context.HARMLESS_CALL_S` seconds).

    Args:
        facts: check's facts (podvm_gpu/check/vm.py); name: the row's name.
    """
    from podvm_gpu.row import SKIP, Check
    from podvm_gpu.steps.context import HARMLESS_CALL_S

    skip = facts.not_reached("cdi")
    if skip:
        return Check(name, SKIP, skip.detail), None
    skip = facts.needs_driver(name)
    if skip:
        return skip, None
    return None, min(facts.runner.timeouts.get("nvidia-smi", HARMLESS_CALL_S), HARMLESS_CALL_S)


def check_row(facts, ask):
    """check's ``recovery-action`` row: both queries, judged as the gate judges them. A node
    reboot fails; a reset needed fails unless ``health.reset_pending_warns`` (then warns); Drain
    P2P and anything unread warn; ``skip`` before the driver or when the boot never reached
    ``cdi``.

    Args:
        facts: check's facts (podvm_gpu/check/vm.py); ask: health.ask.
    """
    from podvm_gpu.row import FAIL, PASS, WARN, Check, doc_ref

    name = "recovery-action"
    ended, timeout = health_row_start(facts, name)
    if ended:
        return ended
    found = read(ask, facts.runner, timeout)
    said = "; ".join(found.fatal + found.reset + found.warn + found.unread)
    if found.read:  # what was read beside what was refused (issue 35 item 4)
        said += ("; read: " if said else "") + "; ".join(found.read)
    if found.fatal:
        return Check(name, FAIL, said, "the GPU needs its host rebooted: ask the provider "
                     "for another host, or to reboot this one")
    if found.reset:
        verdict = judge.reset_verdict(facts.config.health.reset_pending_warns)
        return Check(name, words.CHECK_STATE[verdict], said + (
            " (a warning: health.reset_pending_warns)" if verdict == words.WARN else ""),
            judge.reset_advice(judge.buses_in(found.reset), getattr(facts, "confidential",
                                                                     None)))
    if found.warn or found.unread:
        return Check(name, WARN, said, "run " + " ".join(action_argv()).replace(
            ",noheader", "") + f" by hand; {doc_ref('operating.md', 'Recovery action')} says "
            "what each action asks")
    return Check(name, PASS, said)
