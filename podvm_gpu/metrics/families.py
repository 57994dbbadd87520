"""The metric families of one scrape, built with prometheus-client's metric families.

Two groups:

- ``DCGM_FI_*``: the quantities NVIDIA's dcgm-exporter exports, under its names, types and labels
  (``etc/default-counters.csv`` of NVIDIA/dcgm-exporter for names and types; its
  ``rendermetrics`` template for the labels ``gpu``, ``UUID``, ``pci_bus_id``,
  ``device="nvidia<gpu>"``, ``modelName``, ``Hostname`` (every release so far; its unreleased
  main renames it ``hostname``) and ``DCGM_FI_DRIVER_VERSION``, a label-type field of the
  default counters file), so its dashboards and alerts work unchanged. Fields the default file
  leaves out but DCGM defines (the temperature thresholds, ``DCGM_FI_DEV_ROW_REMAP_PENDING``)
  are gauges as DCGM's field list has them.
- ``podvm_gpu_*``: the agent's own, in Prometheus naming (promtool's lint passes on them).

A DCGM counter is made as an ``unknown`` family, the only kind whose samples prometheus-client
writes under the family's own name: a counter family gets ``_total`` appended, and the DCGM names
(``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``, ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``) do not end in it.
``render`` then types them ``counter`` in the Prometheus text format as dcgm-exporter does.
"""

from __future__ import annotations

import collections
import datetime

from podvm_gpu.gpufacts.reading import CC_MODES
from podvm_gpu.gpufacts.words import bus_id
from podvm_gpu.metrics.health_families import COUNTERS as HEALTH_COUNTERS
from podvm_gpu.metrics.prom import GaugeMetricFamily, InfoMetricFamily, Metric
from podvm_gpu.model import State, shown

FULL = "full"
CC_SAFE = "cc-safe"

# DCGM field -> (type as in dcgm-exporter, help, profile that exports it). Types: the default
# counters file; help: this project's own words, in dcgm-exporter's units.
DCGM_FIELDS: dict[str, tuple[str, str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (C).", CC_SAFE),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("gauge", "Temperature at which the GPU slows down (C).", CC_SAFE),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("gauge", "Temperature at which the GPU shuts down (C).", CC_SAFE),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": ("gauge", "Maximum operating temperature of the GPU (C).", CC_SAFE),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Code of the last Xid the kernel log reports for the GPU "
                                        "since boot (0: none).", CC_SAFE),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Corrected (single-bit) ECC errors since the "
                                                 "driver loaded.", CC_SAFE),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Uncorrected (double-bit) ECC errors since the "
                                                 "driver loaded.", CC_SAFE),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Corrected ECC errors over the GPU's life.", CC_SAFE),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Uncorrected ECC errors over the GPU's life.", CC_SAFE),
    "DCGM_FI_DEV_RETIRED_SBE": ("counter", "Pages retired for repeated single-bit errors.", CC_SAFE),
    "DCGM_FI_DEV_RETIRED_DBE": ("counter", "Pages retired for double-bit errors.", CC_SAFE),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "1 when pages wait to be retired at the next "
                                               "reset.", CC_SAFE),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Memory rows remapped for correctable "
                                                         "errors.", CC_SAFE),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Memory rows remapped for "
                                                           "uncorrectable errors.", CC_SAFE),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "1 when a row remapping failed.", CC_SAFE),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "1 when a row remapping waits for a reset.", CC_SAFE),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "PCIe replays (retries).", CC_SAFE),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock (MHz).", FULL),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock (MHz).", FULL),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (W).", FULL),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Energy used since the driver loaded "
                                                        "(mJ).", FULL),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilisation (%).", FULL),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilisation (%).", FULL),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilisation (%).", FULL),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilisation (%).", FULL),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Frame buffer memory free (MiB).", FULL),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Frame buffer memory used (MiB).", FULL),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Frame buffer memory reserved by the driver (MiB).", FULL),
}
# with dcgm-exporter's own counters (etc/default-counters.csv; metrics/health_families.py)
DCGM_COUNTERS = frozenset(name for name, (kind, _, _) in DCGM_FIELDS.items() if kind == "counter") \
    | HEALTH_COUNTERS
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
               "DCGM_FI_DRIVER_VERSION")
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device")  # the agent's per-GPU series; join on these
DAEMONS = ("nvidia-persistenced", "nvlsm", "nv-fabricmanager")
# NVML_GPU_FABRIC_STATE_* 0..3 (nvml.h), as the ``state`` label of podvm_gpu_fabric_state
FABRIC_STATES = ("not-supported", "not-started", "in-progress", "completed")


def _gauge(name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = ()):
    """A gauge family; with ``value``, its one unlabelled sample."""
    family = GaugeMetricFamily(name, doc, labels=list(labels) or None)
    if value is not None:
        family.add_metric([], value)
    return family


def _one_of(name: str, doc: str, label: str, names, chosen) -> Metric:
    """A gauge family with a sample per name of ``names`` under ``label``: 1 for ``chosen``, 0
    for the others (a state set)."""
    family = _gauge(name, doc, labels=(label,))
    for each in names:
        family.add_metric([each], 1 if each == chosen else 0)
    return family


def _seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        return (datetime.datetime.fromisoformat(end)
                - datetime.datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return None


def boot_families(status: dict | None, status_error: str | None) -> list[Metric]:
    """The boot's own families from ``status.json`` (None: no status file yet).

    Args:
        status: the status document (contract section 4), or None.
        status_error: why the file could not be read (garbled), or None.
    """
    state = status.get("state") if status else None
    out: list[Metric] = [_one_of("podvm_gpu_boot_state", "1 for the state of the last boot in "
                                 "status.json (all 0: no status file yet or unreadable).", "state",
                                 State.ALL, state)]
    reason = status.get("reason") if status else status_error
    if reason:
        info = InfoMetricFamily("podvm_gpu_boot_reason", "Why the boot ended as it did "
                                "(status.json's reason), or why the status is unreadable.")
        # ESC, BEL and the like escaped as status and check show them: a scrape printed on a
        # terminal must not move its cursor (issue 35 item 17)
        info.add_metric([], {"reason": shown(str(reason))})
        out.append(info)
    if not status:
        return out
    duration = _seconds_between(status.get("started_at"), status.get("finished_at"))
    if duration is not None:
        out.append(_gauge("podvm_gpu_boot_duration_seconds", "Wall time of the last boot (absent "
                          "while it runs).", duration))
    steps = _gauge("podvm_gpu_boot_step_duration_seconds", "Wall time of each boot step, with "
                   "its result.", labels=("step", "result"))
    for step in _entries(status.get("steps")):
        seconds = _number(step.get("duration_s")) if isinstance(step, dict) else None
        if seconds is not None:
            steps.add_metric([str(step.get("name")), str(step.get("result"))], seconds)
    out.append(steps)
    out.append(_gauge("podvm_gpu_gpus", "NVIDIA GPUs the last boot found on PCI.",
                      _count(status.get("gpus"))))
    out.append(_gauge("podvm_gpu_nvswitches", "NVSwitches the last boot found on PCI.",
                      _count(status.get("nvswitches"))))
    cdi = status.get("cdi") if isinstance(status.get("cdi"), dict) else {}
    out.append(_gauge("podvm_gpu_cdi_devices", "Devices in the nvidia.com/gpu CDI spec the boot "
                      "installed (0: the unavailable spec or none).",
                      _count(cdi.get("devices"))))
    return out


def watch_families(watch: dict | None) -> list[Metric]:
    """The watcher's families from ``/run/podvm-gpu/watch.json`` (podvm_gpu/watchfile.py; None:
    no watcher ran since the boot, and no series). ``podvm_gpu_watch_finding`` 1 when its
    finding stands (status.json is then ``failed`` with a ``watch:`` reason): the alert rules
    tell a GPU that failed after a ready boot from a boot that failed."""
    if not watch:
        return []
    finding = watch.get("finding") if isinstance(watch.get("finding"), dict) else None
    found = _gauge("podvm_gpu_watch_finding", "1 when the watcher took the GPUs out of the CDI "
                   "spec after a ready boot (watch.json's finding), else 0.", labels=("gpu",))
    found.add_metric([str(finding.get("gpu") or "") if finding else ""], 1 if finding else 0)
    warned = sum(_number(w.get("count")) or 0 for w in _entries(watch.get("warnings"))
                 if isinstance(w, dict))
    hung = _gauge("podvm_gpu_watch_nvml_hung", "1 while the watcher refuses NVML clients "
                  "because one hung (watch.json's nvml_hung; a warning: its polls are not made "
                  "until a retry exits 0), else 0.",
                  1 if isinstance(watch.get("nvml_hung"), dict) else 0)
    from podvm_gpu.watchfile import repeated

    coalesced = _gauge("podvm_gpu_watch_warnings_repeated", "Warnings the watcher coalesced "
                       "into an earlier identical one (a flood of one kernel record: counted, "
                       "with first and last times in watch.json, said once).", repeated(watch))
    return [found, hung, coalesced, _gauge("podvm_gpu_watch_warnings", "Warnings the watcher raised since it "
                          "started (repeats counted; Xid 13 and the like, facts it could not "
                          "read).", warned + (_number(watch.get("warnings_dropped")) or 0))]


def _count(value) -> int:
    """How many entries a status list has; 0 for anything else (a hand-edited or damaged file
    must not stop a scrape)."""
    return len(_entries(value))


def _entries(value) -> list:
    """A status list's entries; none for anything else (``"steps": 5`` made every scrape fail)."""
    return value if isinstance(value, list) else []


def _number(value) -> float | None:
    """A status number as a sample value; None for anything else (a bool, a string, an integer
    too large for a float: JSON has no bound, a sample has)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def daemon_family(running: dict[str, bool]) -> Metric:
    """``podvm_gpu_daemon_up``: daemon name -> running, for the daemons that apply here
    (``exporter.daemons_due``); the family has no sample when none does."""
    family = _gauge("podvm_gpu_daemon_up", "1 when the daemon the boot started is running "
                    "(pid file and process name); no series for a daemon the boot did not "
                    "start.", labels=("daemon",))
    for name, up in running.items():
        family.add_metric([name], 1 if up else 0)
    return family


def fabric_kind_families(status: dict | None) -> list[Metric]:
    """``podvm_gpu_fabric_kind_info{kind, port, port_guid}`` from status.json's ``fabric``
    object (docs/interface.md 3.10: ``none``, ``nvswitch``, ``nvlink5``, ``mixed``; the port and
    its GUID on NVLink 5 once found, else ``""``); no family when the status has no fabric
    object (no status, a CPU VM, a boot that ended before it looked, a version 1 document)."""
    fabric = status.get("fabric") if isinstance(status, dict) else None
    if not isinstance(fabric, dict) or not isinstance(fabric.get("kind"), str):
        return []
    info = InfoMetricFamily("podvm_gpu_fabric_kind", "The VM's NVLink fabric kind the last boot "
                            "found on PCI (status.json fabric.kind), with the NVLink 5 "
                            "management port and its GUID when found.")
    info.add_metric([], {"kind": fabric["kind"], "port": str(fabric.get("port") or ""),
                         "port_guid": str(fabric.get("port_guid") or "")})
    return [info]


ATTESTATION_RESULTS = ("passed", "failed", "not-run", "off")
BINDING_STATES = ("bound", "unbound", "broken", "off")  # podvm_gpu/steps/cc/bind.py


def attestation_families(status: dict | None) -> list[Metric]:
    """From status.json's ``attestation`` record (docs/interface.md 3.11): its result
    (``podvm_gpu_attestation_result{result}``, 1 for the recorded one), its duration and the
    devices attested by type; no family when the status has no record (no GPU, CC off, a boot
    that did not reach it, a document from before issue 26). And the binding's state
    (``podvm_gpu_binding_state{state}``, issue 37) when the status records one."""
    binding = status.get("binding") if isinstance(status, dict) else None
    bound: list[Metric] = []
    if isinstance(binding, dict) and binding.get("state") in BINDING_STATES:
        bound.append(_one_of("podvm_gpu_binding_state", "1 for the state of the GPUs' verdict "
                             "bound into TDX RTMR3 in the last boot (status.json binding.state).",
                             "state", BINDING_STATES, binding["state"]))
    record = status.get("attestation") if isinstance(status, dict) else None
    if not isinstance(record, dict) or record.get("result") not in ATTESTATION_RESULTS:
        return bound
    out: list[Metric] = [_one_of("podvm_gpu_attestation_result", "1 for the result of the GPUs' "
                                 "attestation in the last boot (status.json attestation.result).",
                                 "result", ATTESTATION_RESULTS, record["result"])]
    if isinstance(record.get("duration_s"), (int, float)):
        out.append(_gauge("podvm_gpu_attestation_duration_seconds", "Wall time of the last "
                          "boot's attestation (every nvattest run and the version query).",
                          record["duration_s"]))
    devices = _gauge("podvm_gpu_attestation_devices", "Devices whose claims the last boot's "
                     "attestation judged, by type (a passed attestation: every GPU, and every "
                     "NVSwitch in Protected PCIe).", labels=("type",))
    found = [d.get("type") for d in record.get("devices") or [] if isinstance(d, dict)]
    for kind in ("gpu", "nvswitch"):
        devices.add_metric([kind], found.count(kind))
    out.append(devices)
    return out + bound


def gpu_fabric_families(reading) -> list[Metric]:
    """Each GPU's fabric state and status from NVML (``nvmlDeviceGetGpuFabricInfoV``, else
    ``nvmlDeviceGetGpuFabricInfo``: what nvidia-smi's ``fabric.state``/``fabric.status`` show), for the GPUs that
    answered it; no family when none did (NVML down, a library or GPU without the call).

    ``podvm_gpu_fabric_state{GPU labels, state}``: 1 for the GPU's state, 0 for the other
    :data:`FABRIC_STATES`. ``podvm_gpu_fabric_status{GPU labels}``: NVML's status of the fabric
    (an ``nvmlReturn_t``: 0 success, else the error code), only once the state is
    ``completed`` (nvml.h: the status is valid only then).

    Args:
        reading: the scrape's ``nvml.NvmlReading``.
    """
    answered = [g for g in reading.gpus if g.up and g.fabric_state in range(len(FABRIC_STATES))]
    if not answered:
        return []
    states = _gauge("podvm_gpu_fabric_state", "1 for the GPU's NVLink fabric state (NVML): "
                    "not-supported, not-started, in-progress, completed.",
                    labels=(*GPU_LABELS, "state"))
    status = _gauge("podvm_gpu_fabric_status", "NVML's status of the GPU's NVLink fabric once "
                    "its state is completed: 0 success, else the NVML error code.",
                    labels=GPU_LABELS)
    for gpu in answered:
        for i, name in enumerate(FABRIC_STATES):
            states.add_metric([*_gpu_labels(gpu), name], 1 if gpu.fabric_state == i else 0)
        if gpu.fabric_state == FABRIC_STATES.index("completed") and gpu.fabric_status is not None:
            status.add_metric(_gpu_labels(gpu), gpu.fabric_status)
    return [states, status] if status.samples else [states]


def kernel_families(records: int, finding_kinds: list[str], fatal: int,
                    xids: list[tuple[str, int]]) -> list[Metric]:
    """Families from the kernel log since boot.

    Args:
        records: how many of the kernel's own records were read (0: the log is unreadable).
        finding_kinds: the kind of every distinct finding (``gpufacts.kernel.findings``).
        fatal: how many of them leave a GPU unusable until it is reset.
        xids: every Xid record, ``(pci, code)``, oldest first (``gpufacts.kernel.xid_records``).
    """
    from podvm_gpu.gpufacts.kernel import KINDS

    events = _gauge("podvm_gpu_kernel_events", "Distinct GPU problems the kernel log reports since "
                    "boot, by kind (gauges: the kernel's ring buffer can drop old records).",
                    labels=("kind",))
    for kind in KINDS:
        events.add_metric([kind], finding_kinds.count(kind))
    counts = collections.Counter((bus_id(pci), code) for pci, code in xids)
    per_gpu = _gauge("podvm_gpu_xid_events", "Xid records in the kernel log since boot, by GPU "
                     "and Xid code.", labels=("pci_bus_id", "xid"))
    for (pci, code), count in sorted(counts.items()):
        per_gpu.add_metric([pci, str(code)], count)
    readable = _gauge("podvm_gpu_kernel_log_records", "Records of the kernel itself read from the "
                      "kernel log (0: unreadable, e.g. without CAP_SYSLOG under "
                      "kernel.dmesg_restrict=1: then no GPU problem can show).", records)
    return [readable, events, _gauge("podvm_gpu_kernel_fatal_events", "Of those, the ones after which a GPU "
                           "is unusable until it is reset (Xid 48, 62, 79, 95, 119, 120, 140, "
                           "fallen off the bus, ...).", fatal), per_gpu]


def nvml_families(reading, profile: str, configured: str) -> list[Metric]:
    """The families of the NVML state, the CC mode and the active profile.

    Args:
        reading: the scrape's ``nvml.NvmlReading``.
        profile: the active profile, ``full`` or ``cc-safe``.
        configured: the configured one, ``auto``, ``full`` or ``cc-safe``.
    """
    out: list[Metric] = [_gauge("podvm_gpu_nvml_up", "1 when NVML answered this scrape within the "
                                "bound.", 1 if reading.up else 0)]
    if not reading.up:
        info = InfoMetricFamily("podvm_gpu_nvml_error", "Why NVML did not answer: a reason word "
                                "and NVML's message.")
        info.add_metric([], {"reason": reading.reason or "error", "message": reading.message or ""})
        out.append(info)
    if reading.gpu_count is not None:
        out.append(_gauge("podvm_gpu_nvml_gpus", "GPUs NVML sees.", reading.gpu_count))
    if reading.gpus:
        up = _gauge("podvm_gpu_nvml_gpu_up", "1 when the GPU answers NVML (0: lost, needs a "
                    "reset).", labels=GPU_LABELS)
        down = InfoMetricFamily("podvm_gpu_nvml_gpu_error", "Why a GPU does not answer NVML.",
                                labels=("gpu", "reason", "message"))
        for gpu in reading.gpus:
            up.add_metric(_gpu_labels(gpu), 1 if gpu.up else 0)
            if not gpu.up:
                down.add_metric([str(gpu.index), gpu.reason or "error", gpu.message or ""], {})
        out.append(up)
        if down.samples:
            out.append(down)
    if reading.cc_mode in CC_MODES:
        out.append(_one_of("podvm_gpu_cc_mode", "1 for the GPUs' confidential-computing mode "
                           "(NVML).", "mode", CC_MODES, reading.cc_mode))
    if reading.cc_ready is not None:
        out.append(_gauge("podvm_gpu_cc_ready_state", "1 when the GPUs accept work in CC mode "
                          "(ready state), 0 when not ready.", 1 if reading.cc_ready else 0))
    info = InfoMetricFamily("podvm_gpu_metrics_profile", "The profile of this scrape (cc-safe: "
                            "no utilisation, clocks, power or memory use) and the configured one.")
    info.add_metric([], {"profile": profile, "configured": configured})
    out.append(info)
    return out


def _gpu_labels(gpu) -> list[str]:
    return [str(gpu.index), gpu.uuid, gpu.pci_bus_id, f"nvidia{gpu.index}"]


def dcgm_labels(gpu, hostname: str, reading, pod: dict[str, str] | None = None) -> dict[str, str]:
    """dcgm-exporter's labels of one GPU (:data:`DCGM_LABELS`), with ``pod`` and ``namespace``
    when the VM's pod is known (metrics/pod.py; dcgm-exporter's pod-attribution labels)."""
    return {**dict(zip(DCGM_LABELS, _gpu_labels(gpu) + [gpu.name, hostname,
                                                       reading.driver_version or ""])),
            **(pod or {})}


def dcgm_families(reading, hostname: str, last_xid: dict[str, int], profile: str,
                  pod: dict[str, str] | None = None) -> list[Metric]:
    """The DCGM-compatible families of the GPUs that answered.

    Args:
        reading: the scrape's ``nvml.NvmlReading``.
        hostname: the ``Hostname`` label (the pod VM's host name).
        last_xid: NVML-form PCI bus id -> last Xid code in the kernel log.
        profile: ``full`` or ``cc-safe``; a ``full``-only field is never in ``cc-safe``.
        pod: ``{"pod", "namespace"}`` labels, or None.
    """
    families: dict[str, Metric] = {}
    for gpu in reading.gpus:
        if not gpu.up:
            continue
        labels = dcgm_labels(gpu, hostname, reading, pod)
        values = dict(gpu.values)
        values["DCGM_FI_DEV_XID_ERRORS"] = last_xid.get(gpu.pci_bus_id.upper(), 0)
        for name, value in values.items():
            kind, doc, needs = DCGM_FIELDS[name]
            if needs == FULL and profile != FULL:
                continue
            family = families.get(name)
            if family is None:
                # counters as "unknown": see the module's docstring
                family = families[name] = Metric(name, doc, "gauge" if kind == "gauge" else "unknown")
            family.add_sample(name, labels, value)
    return [families[name] for name in DCGM_FIELDS if name in families]
