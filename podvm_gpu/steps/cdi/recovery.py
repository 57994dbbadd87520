"""The GPUs' reset status and recovery action (issue 28): part of the health gate
(steps/cdi/health.py) and of check's ``recovery-action`` row; asked and judged in
gpufacts/health.py (``read_recovery``).

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

from podvm_gpu.gpufacts import health, judge, smi
from podvm_gpu.gpufacts.finding import OK, REPLACE, RESET


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
    from podvm_gpu.steps.context import harmless_timeout

    skip = facts.not_reached("cdi")
    if skip:
        return Check(name, SKIP, skip.detail), None
    skip = facts.needs_driver(name)
    if skip:
        return skip, None
    return None, harmless_timeout(facts.runner, "nvidia-smi")


def check_row(facts, ask=None):
    """check's ``recovery-action`` row: both queries, judged as the gate judges them. A node
    reboot fails; a reset needed fails unless ``health.reset_pending_warns`` (then warns); Drain
    P2P and anything unread warn; ``skip`` before the driver or when the boot never reached
    ``cdi``.

    Args:
        facts: check's facts (podvm_gpu/check/vm.py); ask: gpufacts/health.py ``ask``'s shape
            (default: it).
    """
    from podvm_gpu.row import FAIL, PASS, WARN, Check, doc_ref

    name = "recovery-action"
    ended, timeout = health_row_start(facts, name)
    if ended:
        return ended
    found = health.read_recovery(ask or health.ask, facts.runner, timeout,
                                 facts.config.health.reset_pending_warns)
    fatal = [f.what for f in found if f.action == REPLACE]
    reset = [f for f in found if f.action == RESET]
    said = "; ".join(fatal + [f.what for f in reset] + health.said(found, "note", "unread"))
    read = health.said(found, *health.READ)
    if read:  # what was read beside what was refused (issue 35 item 4)
        said += ("; read: " if said else "") + "; ".join(read)
    if fatal:
        return Check(name, FAIL, said, "the GPU needs its host rebooted: ask the provider "
                     "for another host, or to reboot this one")
    if reset:
        warns = not reset[0].fatal
        return Check(name, WARN if warns else FAIL, said + (
            " (a warning: health.reset_pending_warns)" if warns else ""),
            judge.reset_advice([f.gpu for f in reset if f.gpu],
                               getattr(facts, "confidential", None)))
    if any(f.level != OK for f in found):
        return Check(name, WARN, said, "run " + " ".join(smi.action_argv()).replace(
            ",noheader", "") + f" by hand; {doc_ref('operating.md', 'Recovery action')} says "
            "what each action asks")
    return Check(name, PASS, said)
