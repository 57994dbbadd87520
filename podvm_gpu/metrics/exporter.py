"""One scrape: read the boot's status, the daemons, the kernel log and NVML under a root, and
render the families with prometheus-client (Prometheus text 0.0.4 or OpenMetrics 1.0).
"""

from __future__ import annotations

import os

from podvm_gpu.config.metrics import MetricsSettings
from podvm_gpu.gpufacts import kernel
from podvm_gpu.gpufacts.reading import NvmlReading, cc_safe
from podvm_gpu.gpufacts.words import bus_id
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
from podvm_gpu.metrics import families as fam
from podvm_gpu.metrics import health_families as hfam
from podvm_gpu.metrics.pod import read_labels as read_pod_labels
from podvm_gpu.metrics.prom import generate_latest, generate_openmetrics
from podvm_gpu.readers import running_daemons
from podvm_gpu.status import StatusUnreadable, load_status


def nvml_gate(status: dict | None, persistenced_up: bool) -> tuple[str, str] | None:
    """Why NVML must not be called now, as ``(reason, message)``; None when it may.

    Only a ``ready`` boot has the driver loaded and nvidia-persistenced started, and without
    persistenced every NVML client initialises the GPUs again (field case C20), so a scrape must
    never be the first NVML client.
    """
    state = (status or {}).get("state")
    if status is None:
        return "no-status", "no readable status.json: the boot has not run or its file is garbled"
    if state == "running":
        return "boot-running", "the boot is still running"
    if state == "no-gpu":
        return "no-gpu", status.get("reason") or "no NVIDIA GPU in this VM"
    if state != "ready":
        return "boot-failed", f"the boot failed: {status.get('reason') or 'no reason given'}"
    if not persistenced_up:
        return "persistenced-not-running", ("nvidia-persistenced is not running; NVML would "
                                            "initialise the GPUs again on every scrape")
    return None


# The fabric daemons each fabric kind (status.json ``fabric.kind``, docs/interface.md 3.10) has
# the boot start: the fabric manager on NVSwitch VMs, NVLSM and then the fabric manager on
# NVLink 5 VMs; none on ``none`` (the fabric, if any, is managed outside the VM) or ``mixed``
# (refused before any daemon starts).
FABRIC_DAEMONS = {"nvswitch": ("nv-fabricmanager",), "nvlink5": ("nvlsm", "nv-fabricmanager")}


def fabric_kind_of(status: dict | None) -> str | None:
    """The fabric kind of the last boot: status.json's ``fabric.kind``; a document without a
    fabric object (version 1, or a boot that ended before it looked) counts NVSwitches on PCI
    as version 1 did (``nvswitch`` when there are some); None when nothing says."""
    status = status if isinstance(status, dict) else {}
    fabric = status.get("fabric")
    if isinstance(fabric, dict) and isinstance(fabric.get("kind"), str):
        return fabric["kind"]
    return "nvswitch" if status.get("nvswitches") else None


def daemons_due(status: dict | None, running: dict[str, bool]) -> dict[str, bool]:
    """The daemons whose ``podvm_gpu_daemon_up`` series a scrape exports, name -> running.

    A daemon is exported when it runs, or when the boot meant it to run: nvidia-persistenced
    after a ``ready`` boot or one whose ``persistenced`` step started (ok or failed); the
    fabric daemons of the boot's fabric kind (:data:`FABRIC_DAEMONS`, from
    :func:`fabric_kind_of`) the same way (``fabricmanager`` step). So a CPU VM (``no-gpu``), a
    boot still running or failed before the step, and a VM whose fabric kind has no daemon
    have no series that reads as down (no false alarm).

    Args:
        status: status.json's document, or None.
        running: daemon name -> whether its pid file names a live process of its name.
    """
    status = status if isinstance(status, dict) else {}
    listed = status.get("steps")  # a garbled file may hold anything here (a number, a name list)
    steps = {str(s.get("name")): s.get("result") for s in listed if isinstance(s, dict)} \
        if isinstance(listed, list) else {}
    ready = status.get("state") == "ready"
    fabric_step = ready or steps.get("fabricmanager") in ("ok", "failed")
    due = {"nvidia-persistenced": ready or steps.get("persistenced") in ("ok", "failed")}
    for name in FABRIC_DAEMONS.get(fabric_kind_of(status), ()):
        due[name] = fabric_step
    return {name: up for name, up in running.items() if up or due.get(name)}


def kernel_clock_usec(root: Root) -> int | None:
    """The kernel's clock now, microseconds since boot, as the kernel log's record times count
    (``/proc/uptime``'s first number, read under the root as a bounded regular file: the same
    clock in a VM that never suspends); None when unreadable (no Xid is then in any window)."""
    text = (root.read_text("/proc/uptime", limit=256) or "").split()
    try:
        return int(float(text[0]) * 1_000_000) if text else None
    except ValueError:
        return None


def hostname(root: Root) -> str:
    """The VM's host name (dcgm-exporter's ``Hostname`` label): the root's kernel host name."""
    name = (root.read_text("/proc/sys/kernel/hostname") or "").strip()
    return name or os.uname().nodename


class Exporter:
    """The metrics of a root, as a prometheus-client collector (``collect()``).

    Args:
        root: the :class:`Root`.
        settings: the :class:`MetricsSettings` (profile, NVML bound).
        keep_open: True when serving (NVML stays initialised between scrapes).
    """

    def __init__(self, root: Root, settings: MetricsSettings, keep_open: bool = False):
        self.root = root
        self.settings = settings
        self.keep_open = keep_open
        self.reader = None  # made when NVML may first be called: its module costs start-up
        self.hostname = hostname(root)

    def collect(self):
        """Every family of one scrape (prometheus-client's collector protocol)."""
        return self.families(with_nvml=True)

    def families(self, with_nvml: bool = True) -> list:
        """The families of one scrape.

        Args:
            with_nvml: False for the boot's own textfile: no NVML, no GPU families.
        """
        try:
            status, status_error = load_status(self.root), None
        except StatusUnreadable as err:
            status, status_error = None, str(err)
        out = fam.boot_families(status, status_error)
        up = running_daemons(self.root)
        out.append(fam.daemon_family(daemons_due(status, {name: name in up for name in fam.DAEMONS})))
        out += fam.fabric_kind_families(status)
        out += fam.attestation_families(status)
        from podvm_gpu.watchfile import load as load_watch

        watch = load_watch(self.root)
        out += fam.watch_families(watch)
        records = kmsg.read_timed_records(self.root)
        messages = [message for _level, message, _usec in records]
        found = kernel.findings(messages)
        events = kernel.xid_events(messages)
        xids = [(pci, code) for pci, code, _fatal in events]
        out += fam.kernel_families(len(messages), [f.kind for f in found],
                                   sum(f.fatal for f in found), xids)
        if not with_nvml:
            return out
        reading = self._reading(status, "nvidia-persistenced" in up)
        profile = fam.CC_SAFE if cc_safe(self.settings.profile, reading.cc_mode) else fam.FULL
        out += fam.nvml_families(reading, profile, self.settings.profile)
        out += fam.gpu_fabric_families(reading)
        last_xid = {bus_id(pci): code for pci, code in xids}
        pod = read_pod_labels(self.root)  # never apf.json itself: metrics/pod.py
        out += fam.dcgm_families(reading, self.hostname, last_xid, profile, pod)
        fatal: dict[str, list[int]] = {}
        for pci, code, is_fatal in events:
            if is_fatal:
                fatal.setdefault(bus_id(pci), []).append(code)
        counts = hfam.xid_counts(kernel.timed_xids(records), kernel_clock_usec(self.root))
        out += hfam.health_families(
            reading, lambda gpu: fam.dcgm_labels(gpu, self.hostname, reading, pod), fatal, counts,
            gpu_labels=fam._gpu_labels, reset_pending_warns=self.settings.reset_pending_warns)
        out += hfam.fabric_health_families(
            reading, lambda gpu: fam.dcgm_labels(gpu, self.hostname, reading, pod),
            hfam.fabric_health_read(status, watch))
        return out

    def _reading(self, status, persistenced: bool) -> NvmlReading:
        """This scrape's NVML reading: none, with the gate's reason, when NVML must not be
        called now (:func:`nvml_gate`: the boot's state, ``persistenced`` running or not), else
        the reader's (made at the first call) for the settings' profile."""
        gate = nvml_gate(status, persistenced)
        if gate is not None:
            return NvmlReading(False, *gate)
        if self.reader is None:
            from podvm_gpu.gpufacts.nvml import NvmlReader
            from podvm_gpu.readers import find_nvml, find_nvml_elsewhere

            self.reader = NvmlReader(self.root, self.settings.nvml_timeout_s, self.keep_open,
                                     find=(find_nvml, find_nvml_elsewhere))
        return self.reader.read(self.settings.profile)

    def close(self) -> None:
        """Shut NVML down (unless a call still hangs)."""
        if self.reader is not None:
            self.reader.close()


class Families:
    """A collector that yields families made already (prometheus-client renders collectors)."""

    def __init__(self, families: list):
        self._families = families

    def collect(self):
        return self._families


def render(families: list, openmetrics: bool = False) -> bytes:
    """The exposition of ``families``: Prometheus text 0.0.4, or OpenMetrics 1.0.0.

    In the text format the DCGM counters are typed ``counter``, as dcgm-exporter types them
    (``families`` makes them ``unknown`` so that their samples keep the DCGM names); in
    OpenMetrics they stay ``unknown``: an OpenMetrics counter's samples must end in ``_total``.
    """
    if openmetrics:
        return generate_openmetrics(Families(families))
    return type_dcgm_counters(generate_latest(Families(families)))


def type_dcgm_counters(text: bytes) -> bytes:
    """Replace the ``# TYPE <name> untyped`` line of each DCGM counter by ``... counter``.

    Only those exact lines, as prometheus-client writes them, change; every sample line stays as
    prometheus-client wrote it.
    """
    for name in fam.DCGM_COUNTERS:
        text = text.replace(f"# TYPE {name} untyped\n".encode(), f"# TYPE {name} counter\n".encode())
    return text

