"""The fleet-health families of issue 28, under dcgm-exporter's names where it has them.

Read from NVIDIA/dcgm-exporter at commit d5e5f510a1b6b393f39a43293ccd9dc985defc79 (read, not
copied; docs/metrics.md cites each file):

- ``DCGM_EXP_GPU_HEALTH_STATUS``: type ``counter`` (``etc/default-counters.csv``), one series per
  GPU and health watch with the labels ``health_watch`` (``PCIE``, ``NVLINK``, ``MEM``, ...,
  ``ALL``) and ``health_error_code`` (a ``DCGM_FR_*`` name), the value DCGM's health result: 0
  pass, 10 warn, 20 fail (``internal/pkg/collector/gpu_health_collector.go``; the numbers are
  go-dcgm's ``DCGM_HEALTH_RESULT_*``). DCGM computes it; here it is computed from what the agent
  reads (:func:`health_results`), and only for the watches the agent reads: ``MEM``, ``NVLINK``
  (where the GPU reports a fabric) and ``ALL`` (recovery action, fatal Xids). A watch the agent
  does not read has no series: a ``0`` would claim a check that was never made.
- ``DCGM_EXP_XID_ERRORS_COUNT``: type ``counter``, per GPU, one series per Xid code seen in the
  window with labels ``xid`` and ``window_size_in_ms`` (default 300000: 5 minutes), value the
  count in the window; a GPU with none has one series without ``xid``, value 0
  (``internal/pkg/collector/xid_collector.go``, ``expcollector.go``, ``pkg/cmd/app.go``).
- ``DCGM_FI_DEV_CC_MODE`` (DCGM field 74, ``dcgm_fields.h``: "ConfidentialCompute/AmpereProtected
  Memory status for this system, 0 = disabled, 1 = enabled"): a gauge per GPU.
- ``DCGM_FI_DEV_GPU_RECOVERY_ACTION`` (DCGM field 1523, the newer name of
  ``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION``): NVML's number, a gauge per GPU; and the agent's own
  ``podvm_gpu_recovery_action{GPU labels, action}``: 1 for the GPU's action by its name.
"""

from __future__ import annotations

from podvm_gpu.gpufacts import judge
from podvm_gpu.gpufacts.facts import nvml_facts
from podvm_gpu.gpufacts.words import SCORE, bus_id
from podvm_gpu.metrics.prom import GaugeMetricFamily, Metric

PASS, WARN, FAIL = SCORE["ok"], SCORE["warn"], SCORE["fail"]  # DCGM_HEALTH_RESULT_*
COUNTERS = frozenset({"DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_XID_ERRORS_COUNT"})
# every DCGM-named family of this module (all kept by the cc-safe profile: states and counts,
# none a rate or a use that could time the GPU's work)
FAMILIES = (*sorted(COUNTERS), "DCGM_FI_DEV_CC_MODE", "DCGM_FI_DEV_GPU_RECOVERY_ACTION")
# dcgm-exporter 4.8.4's fabric health fields (DCGM fields 175 and 174), from what boot and the
# watcher read with nvidia-smi (status.json's, watch.json's fabric.health): never NVML in process
# (nvmlDeviceGetGpuFabricInfoV's v3 struct crashed Python on a real H200: compatibility.md)
FABRIC_HEALTH = ("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "DCGM_FI_DEV_FABRIC_HEALTH_MASK")
XID_WINDOW_MS = 300000  # dcgm-exporter's --xid-count-window-size default
# Xids after which the GPU is unusable until it is reset (podvm_gpu/gpufacts/xids.py: the fatal codes,
# NVLink 5's by their record's word) fail ALL;
# Xid 95 is DCGM's uncontained error, the others have no DCGM_FR_ code of their own
# recovery action names: the one table (gpufacts/judge.py ACTIONS, 0-7)
ACTION_NAMES = {a.number: a.name for a in judge.ACTIONS}
# MEM's findings, worst first: (the NVML value that is not 0, result, DCGM_FR_* code)
MEM_FINDINGS = (("DCGM_FI_DEV_ROW_REMAP_FAILURE", FAIL, "DCGM_FR_ROW_REMAP_FAILURE"),
                ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"),
                ("DCGM_FI_DEV_ROW_REMAP_PENDING", WARN, "DCGM_FR_PENDING_ROW_REMAP"),
                ("DCGM_FI_DEV_RETIRED_PENDING", WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"))


def health_results(gpu, fatal_xids: list[int]) -> dict[str, tuple[int, str]]:
    """health watch -> (result, ``DCGM_FR_*`` code) for one GPU, worst finding first.

    - ``MEM``: a row remap failure (``DCGM_FR_ROW_REMAP_FAILURE``) or volatile uncorrectable
      ECC errors (``DCGM_FR_VOLATILE_DBE_DETECTED``) fail; a pending row remap
      (``DCGM_FR_PENDING_ROW_REMAP``) or pending page retirement
      (``DCGM_FR_PENDING_PAGE_RETIREMENTS``) warn; else pass (``DCGM_FR_OK``). Only when NVML
      gave at least one of those values.
    - ``NVLINK``: when the GPU reports a fabric (state not "not supported"): completed with a
      status other than success fails, not completed warns (``DCGM_FR_NVLINK_DOWN``); completed
      with success passes.
    - ``ALL``: a fatal Xid of this GPU in the kernel log since boot fails
      (``DCGM_FR_UNCONTAINED_ERROR`` for Xid 95, else ``DCGM_FR_UNKNOWN``); a recovery action
      Node Reboot, GPU Reset, Drain and Reset, Bus Reset or System Reboot fails, Drain P2P or
      Recover IMEX Domain warns (``DCGM_FR_UNKNOWN``: DCGM has no failure code for it, the gap
      of NVIDIA/DCGM#263; ``podvm_gpu_recovery_action`` names it); else pass. Always present.

    Args:
        gpu: a ``reading.GpuReading`` that answered NVML.
        fatal_xids: codes of the fatal Xids the kernel log has for this GPU.
    """
    out: dict[str, tuple[int, str]] = {}
    v = gpu.values
    if any(key in v for key, _, _ in MEM_FINDINGS):
        out["MEM"] = next(((result, code) for key, result, code in MEM_FINDINGS if v.get(key)),
                          (PASS, "DCGM_FR_OK"))
    if gpu.fabric_state in (1, 2, 3):  # NVML_GPU_FABRIC_STATE_NOT_STARTED .. COMPLETED
        if gpu.fabric_state != 3:
            out["NVLINK"] = (WARN, "DCGM_FR_NVLINK_DOWN")
        elif gpu.fabric_status not in (None, 0):
            out["NVLINK"] = (FAIL, "DCGM_FR_NVLINK_DOWN")
        else:
            out["NVLINK"] = (PASS, "DCGM_FR_OK")
    action = judge.ACTION_BY_NUMBER.get(gpu.recovery_action) \
        if gpu.recovery_action is not None else None
    # DCGM's meaning: no health.reset_pending_warns here (the podvm_gpu_health family has it)
    result = SCORE[judge.verdict_of(action.kind, False)] if action is not None else PASS
    if fatal_xids:
        out["ALL"] = (FAIL, "DCGM_FR_UNCONTAINED_ERROR" if 95 in fatal_xids else "DCGM_FR_UNKNOWN")
    else:  # PASS is 0
        out["ALL"] = (result, "DCGM_FR_UNKNOWN" if result else "DCGM_FR_OK")
    return out


def xid_counts(timed: list[tuple[int | None, str, int]], now_usec: int | None,
               window_ms: int = XID_WINDOW_MS) -> dict[str, dict[int, int]]:
    """NVML-form PCI bus id -> Xid code -> how many records in the last ``window_ms``.

    Args:
        timed: ``gpufacts.kernel.timed_xids`` (usec since boot, the driver's pci, code).
        now_usec: the kernel's monotonic clock now, microseconds (None: unknown, then no record
            is in the window: never guess).
    """
    out: dict[str, dict[int, int]] = {}
    if now_usec is None:
        return out
    start = now_usec - window_ms * 1000
    for usec, pci, code in timed:
        if usec is None or usec < start or usec > now_usec:
            continue
        per = out.setdefault(bus_id(pci), {})
        per[code] = per.get(code, 0) + 1
    return out


def agent_health_family(reading, gpu_labels, reset_pending_warns: bool) -> Metric | None:
    """``podvm_gpu_health{gpu labels, check}``: the agent's own verdict per GPU and check
    (``memory``, ``recovery-action``, ``fabric``, ``gpu-lost``) on DCGM's scale, 0 pass, 10
    warn, 20 fail: the decision boot's health gate and check's rows make on the same facts
    (gpufacts/facts.py ``nvml_facts``, gpufacts/judge.py ``facts_verdicts``),
    ``health.reset_pending_warns`` included. Where DCGM's meaning differs (a pending row
    remap: DCGM warns, the agent fails the boot), ``DCGM_EXP_GPU_HEALTH_STATUS`` keeps DCGM's
    and this family says the agent's (docs/metrics.md). None when NVML gave no GPU."""
    family = GaugeMetricFamily("podvm_gpu_health", "The agent's verdict on the GPU per check, "
                               "as boot and check make it: 0 pass, 10 warn, 20 fail.",
                               labels=["gpu", "UUID", "pci_bus_id", "device", "check"])
    for gpu in reading.gpus:
        verdicts = judge.facts_verdicts(nvml_facts(gpu), reset_pending_warns)
        for check, verdict in verdicts.items():
            family.add_metric([*gpu_labels(gpu), check], SCORE[verdict])
    return family if family.samples else None


def fabric_health_read(status: dict | None, watch: dict | None) -> list[dict]:
    """The GPUs' fabric health as last read: watch.json's ``fabric_health`` when the watcher of
    this boot read it (its ``boot_started_at`` is status.json's ``started_at``), else status.json's
    ``fabric.health`` (the boot's); ``[]`` when neither has it (not 580, no fabric)."""
    status = status if isinstance(status, dict) else {}
    if isinstance(watch, dict) and isinstance(watch.get("fabric_health"), list) and \
            watch.get("boot_started_at") == status.get("started_at"):
        return watch["fabric_health"]
    fabric = status.get("fabric")
    health = fabric.get("health") if isinstance(fabric, dict) else None
    return health if isinstance(health, list) else []


def fabric_health_families(reading, dcgm_labels, read: list[dict]) -> list[Metric]:
    """``DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY`` (NVML's ``NVML_GPU_FABRIC_HEALTH_SUMMARY_*``: 0 not
    supported, 1 healthy, 2 unhealthy, 3 limited capacity) and ``DCGM_FI_DEV_FABRIC_HEALTH_MASK``
    (NVML's health mask: degraded bandwidth at bit 0, route recovery 2, route unhealthy 4,
    access-timeout recovery 6, incorrect configuration 8 (4 bits), partition assigned 12; each
    field 1 true, 2 false, 0 not supported), gauges per GPU under dcgm-exporter's labels, from
    ``read`` (:func:`fabric_health_read`); a GPU whose value was not understood, or not read,
    has no series."""
    by_bus = {bus_id(g["gpu"]): g for g in read if isinstance(g, dict) and isinstance(
        g.get("gpu"), str)}
    out = [Metric(FABRIC_HEALTH[0], "The GPU's fabric health summary as NVML numbers it (0 not "
                  "supported, 1 healthy, 2 unhealthy, 3 limited capacity).", "gauge"),
           Metric(FABRIC_HEALTH[1], "The GPU's fabric health mask as NVML lays it out "
                  "(NVML_GPU_FABRIC_HEALTH_MASK_*).", "gauge")]
    for gpu in reading.gpus:
        found = by_bus.get(bus_id(gpu.pci_bus_id)) if gpu.up else None
        for family, key in zip(out, ("summary_code", "mask")):
            value = (found or {}).get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                family.add_sample(family.name, dcgm_labels(gpu), value)
    return [f for f in out if f.samples]


def health_families(reading, dcgm_labels, fatal_by_gpu: dict[str, list[int]],
                    xids: dict[str, dict[int, int]], window_ms: int = XID_WINDOW_MS,
                    gpu_labels=None, reset_pending_warns: bool = False) -> list[Metric]:
    """The families of this module for the GPUs that answered NVML.

    Args:
        reading: the scrape's ``nvml.NvmlReading``.
        dcgm_labels: ``gpu -> dict`` of dcgm-exporter's labels for a GPU (families.dcgm_labels).
        fatal_by_gpu: NVML-form PCI bus id -> fatal Xid codes since boot.
        xids: :func:`xid_counts`.
        gpu_labels: ``gpu -> list`` of the agent's GPU label values (families._gpu_labels).
        reset_pending_warns: the config's ``health.reset_pending_warns`` (podvm_gpu_health).
    """
    health = Metric("DCGM_EXP_GPU_HEALTH_STATUS", "Health of the GPU per health watch, computed "
                    "by podvm-gpu from what it reads: 0 pass, 10 warn, 20 fail.", "unknown")
    xid = Metric("DCGM_EXP_XID_ERRORS_COUNT", "Xid records of the GPU in the kernel log within "
                 "the window, by Xid code.", "unknown")
    cc = Metric("DCGM_FI_DEV_CC_MODE", "Confidential-computing mode of the GPU: 1 enabled "
                "(on, devtools, protected PCIe), 0 disabled.", "gauge")
    action = Metric("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "The driver's recovery action for the GPU "
                    "(nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain "
                    "P2P, 4 drain and reset).", "gauge")
    named = GaugeMetricFamily("podvm_gpu_recovery_action", "1 for the driver's recovery action "
                              "for the GPU, by its name (NVML, driver 565+).",
                              labels=["gpu", "UUID", "pci_bus_id", "device", "action"])
    cc_value = {"on": 1, "devtools": 1, "ppcie": 1, "off": 0}.get(reading.cc_mode or "")
    for gpu in reading.gpus:
        if not gpu.up:
            continue
        labels = dcgm_labels(gpu)
        bus = gpu.pci_bus_id.upper()
        for watch, (result, code) in health_results(gpu, fatal_by_gpu.get(bus, [])).items():
            health.add_sample("DCGM_EXP_GPU_HEALTH_STATUS",
                              {**labels, "health_watch": watch, "health_error_code": code}, result)
        seen = xids.get(bus, {})
        window = {"window_size_in_ms": str(window_ms)}
        for code, count in sorted(seen.items()):
            xid.add_sample("DCGM_EXP_XID_ERRORS_COUNT", {**labels, **window, "xid": str(code)},
                           count)
        if not seen:
            xid.add_sample("DCGM_EXP_XID_ERRORS_COUNT", {**labels, **window}, 0)
        if cc_value is not None:
            cc.add_sample("DCGM_FI_DEV_CC_MODE", labels, cc_value)
        if gpu.recovery_action is not None:
            action.add_sample("DCGM_FI_DEV_GPU_RECOVERY_ACTION", labels, gpu.recovery_action)
            name = ACTION_NAMES.get(gpu.recovery_action, f"unknown({gpu.recovery_action})")
            for known in dict.fromkeys([*ACTION_NAMES.values(), name]):
                named.add_metric([*gpu_labels(gpu), known], 1 if known == name else 0)
    agent = agent_health_family(reading, gpu_labels, reset_pending_warns) if gpu_labels else None
    return [f for f in (health, xid, cc, action, named, agent) if f is not None and f.samples]
