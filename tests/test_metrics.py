"""The metrics exporter against the fake libnvidia-ml.so.1, loaded by the real nvidia-ml-py.

Each test runs ``python -m podvm_gpu.metrics`` in its own process (NVML is process-wide, and a
hung call stays hung) against a pod VM root made by ``fake_nvml.make_root``, and parses what it
prints or serves with prometheus-client's own parsers.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import fake_nvml
import pytest
from fake_nvml import describe, gpu, make_root, metrics_env
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from podvm_gpu.metrics.families import CC_SAFE, DCGM_FIELDS, DCGM_LABELS, FULL
from podvm_gpu.metrics.health_families import FAMILIES as FLEET

FULL_ONLY = {name for name, (_, _, profile) in DCGM_FIELDS.items() if profile == FULL}
HEALTH = set(DCGM_FIELDS) - FULL_ONLY
# The NVML calls behind the full-only fields: never made in the cc-safe profile.
FULL_ONLY_CALLS = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                   "nvmlDeviceGetClockInfo", "nvmlDeviceGetUtilizationRates",
                   "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
                   "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"}
# H100s use row remapping, not page retirement: NVML answers NOT_SUPPORTED for retired pages.
H100 = {"retired.sbe": None, "retired.dbe": None, "retired.pending": None}


def write_config(root: Path, **metrics) -> None:
    import yaml

    path = root / "etc/podvm-gpu/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"metrics": metrics}))


def exporter(root: Path, description: Path | None, *args: str, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=metrics_env(description))


def scrape(root: Path, description: Path | None = None, *args: str) -> dict:
    """Run the exporter once; name -> family, parsed by prometheus-client's text parser."""
    done = exporter(root, description, *args)
    assert done.returncode == 0, done.stderr
    return {f.name: f for f in text_string_to_metric_families(done.stdout)}


def values(families: dict, name: str, **match) -> list[float]:
    family = families.get(name)
    return [s.value for s in (family.samples if family else [])
            if all(s.labels.get(k) == v for k, v in match.items())]


def one(families: dict, name: str, **match) -> float:
    found = values(families, name, **match)
    assert len(found) == 1, (name, match, found)
    return found[0]


def calls(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def gpu_root(tmp_path, fake_nvml_libs):
    return make_root(tmp_path / "root", fake_nvml_libs["current"])


def test_gpu_less_vm_prints_the_boot_metrics_and_nvml_unreachable(tmp_path):
    """The real boot on this GPU-less machine (state no-gpu), then the exporter on its root."""
    root = tmp_path / "root"
    root.mkdir()
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=metrics_env(None))
    assert booted.returncode == 0, booted.stderr
    families = scrape(root)
    assert one(families, "podvm_gpu_boot_state", state="no-gpu") == 1
    assert sum(values(families, "podvm_gpu_boot_state")) == 1
    assert one(families, "podvm_gpu_gpus") == 0
    assert one(families, "podvm_gpu_nvml_up") == 0
    reason = families["podvm_gpu_nvml_error_info"].samples[0].labels
    assert reason["reason"] == "no-gpu"
    assert not [name for name in families if name.startswith("DCGM_")]


def test_eight_gpus_export_every_dcgm_field_under_dcgm_names_and_labels(gpu_root, tmp_path):
    desc = describe(tmp_path / "desc", [gpu(i, **H100) for i in range(8)])
    families = scrape(gpu_root, desc)
    assert one(families, "podvm_gpu_nvml_up") == 1
    assert one(families, "podvm_gpu_nvml_gpus") == 8
    exported = {name for name in families if name.startswith("DCGM_")}
    retired = {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"}
    # issue 28's families (tests/test_metrics_health.py): the CC mode (off in this world) and
    # dcgm-exporter's own; the recovery action only where the driver gives one
    fleet = set(FLEET) - {"DCGM_FI_DEV_GPU_RECOVERY_ACTION"}
    assert exported - fleet == set(DCGM_FIELDS) - retired
    assert fleet <= exported
    for name in exported:
        for sample in families[name].samples:
            extra = {"DCGM_EXP_GPU_HEALTH_STATUS": {"health_watch", "health_error_code"},
                     "DCGM_EXP_XID_ERRORS_COUNT": {"window_size_in_ms"}}.get(name, set())
            assert set(sample.labels) == set(DCGM_LABELS) | extra, name
    labels = families["DCGM_FI_DEV_GPU_TEMP"].samples[3].labels
    assert labels == {"gpu": "3", "UUID": gpu(3)["uuid"], "pci_bus_id": "00000000:48:00.0",
                      "device": "nvidia3", "modelName": "NVIDIA H100 80GB HBM3",
                      "Hostname": "podvm-gpu-test-1", "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    # dcgm-exporter's units: W from NVML's mW, MiB from bytes, C and MHz as they are
    assert one(families, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == pytest.approx(71.234)
    assert one(families, "DCGM_FI_DEV_FB_USED", gpu="0") == 4
    assert one(families, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 540
    assert one(families, "DCGM_FI_DEV_GPU_TEMP", gpu="5") == 39
    assert one(families, "DCGM_FI_DEV_SLOWDOWN_TEMP", gpu="5") == 92
    assert one(families, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", gpu="7") == 2
    assert one(families, "DCGM_FI_DEV_XID_ERRORS", gpu="7") == 0
    assert one(families, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", gpu="2") == 1
    info = families["podvm_gpu_metrics_profile_info"].samples[0].labels
    assert info == {"profile": FULL, "configured": "auto"}
    assert one(families, "podvm_gpu_cc_mode", mode="off") == 1


def test_dcgm_counters_are_typed_counter_in_the_text_format_and_unknown_in_openmetrics(gpu_root, tmp_path):
    desc = describe(tmp_path / "desc", [gpu(0)])
    text = exporter(gpu_root, desc).stdout
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n" in text
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text
    assert "\nDCGM_FI_DEV_ECC_DBE_VOL_TOTAL{" in text  # dcgm-exporter's sample name, no _total
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text
    assert "untyped" not in text
    om = exporter(gpu_root, desc, "--openmetrics").stdout
    assert om.endswith("# EOF\n")
    families = {f.name: f for f in om_families(om)}
    assert families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].type == "unknown"
    assert families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].samples[0].name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
    assert families["podvm_gpu_nvml_up"].type == "gauge"


@pytest.mark.parametrize("mode", ["on", "devtools", "ppcie"])
def test_cc_mode_auto_profile_reads_and_exports_only_state_and_health(gpu_root, tmp_path, mode):
    log = tmp_path / "calls.log"
    desc = describe(tmp_path / "desc", [gpu(i) for i in range(8)], cc=mode, log=log)
    families = scrape(gpu_root, desc)
    exported = {name for name in families if name.startswith("DCGM_")}
    assert exported - set(FLEET) == HEALTH, "every health field, and nothing of the full profile"
    # issue 28: the cc-safe profile keeps the CC mode (1: on, devtools and protected PCIe are
    # all confidential modes), the health status and the Xid count
    assert one(families, "DCGM_FI_DEV_CC_MODE", gpu="0") == 1
    assert {"DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_XID_ERRORS_COUNT"} <= exported
    assert not FULL_ONLY_CALLS & set(calls(log)), "the cc-safe profile never even asks NVML"
    assert families["podvm_gpu_metrics_profile_info"].samples[0].labels["profile"] == CC_SAFE
    assert one(families, "podvm_gpu_cc_mode", mode=mode) == 1
    assert one(families, "podvm_gpu_cc_ready_state") == 1
    assert one(families, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 34


def test_cc_ready_state_not_ready_is_exported_as_0(gpu_root, tmp_path):
    desc = describe(tmp_path / "desc", [gpu(0)], cc="on", cc_ready=0)
    assert one(scrape(gpu_root, desc), "podvm_gpu_cc_ready_state") == 0


def test_cc_safe_configured_exports_no_utilisation_on_a_gpu_without_cc(gpu_root, tmp_path):
    write_config(gpu_root, profile="cc-safe")
    log = tmp_path / "calls.log"
    families = scrape(gpu_root, describe(tmp_path / "desc", [gpu(0)], log=log))
    assert not FULL_ONLY & set(families)
    assert not FULL_ONLY_CALLS & set(calls(log))
    assert families["podvm_gpu_metrics_profile_info"].samples[0].labels == {"profile": CC_SAFE,
                                                                       "configured": CC_SAFE}


def test_full_configured_in_cc_mode_is_the_operators_choice(gpu_root, tmp_path):
    write_config(gpu_root, profile="full")
    families = scrape(gpu_root, describe(tmp_path / "desc", [gpu(0)], cc="on"))
    assert FULL_ONLY <= set(families)
    assert families["podvm_gpu_metrics_profile_info"].samples[0].labels["profile"] == FULL


@pytest.mark.parametrize("how", [{"cc.feature": 7}, {"cc.error": 999}],
                         ids=["unknown-cc-value", "cc-query-fails"])
def test_a_cc_mode_nvml_cannot_tell_is_never_read_as_off(gpu_root, tmp_path, how):
    log = tmp_path / "calls.log"
    desc = describe(tmp_path / "desc", [gpu(0)], log=log)
    desc.write_text(desc.read_text() + "".join(f"{k} {v}\n" for k, v in how.items()))
    families = scrape(gpu_root, desc)
    assert families["podvm_gpu_metrics_profile_info"].samples[0].labels["profile"] == CC_SAFE
    assert "podvm_gpu_cc_mode" not in families
    assert not FULL_ONLY_CALLS & set(calls(log))


def test_535_library_lacks_the_newer_calls_and_the_older_ones_answer(tmp_path, fake_nvml_libs):
    """Debian 12's 535 NVML has neither nvmlDeviceGetTemperatureV nor
    nvmlSystemGetConfComputeSettings: nvidia-ml-py raises FunctionNotFound, the exporter falls
    back to nvmlDeviceGetTemperature and nvmlSystemGetConfComputeState."""
    root = make_root(tmp_path / "root", fake_nvml_libs["535"])
    log = tmp_path / "calls.log"
    families = scrape(root, describe(tmp_path / "desc", [gpu(0), gpu(1)], cc="on", log=log,
                                     driver_version="535.309.01"))
    made = set(calls(log))
    assert {"nvmlDeviceGetTemperature", "nvmlSystemGetConfComputeState"} <= made
    assert not {"nvmlDeviceGetTemperatureV", "nvmlSystemGetConfComputeSettings"} & made
    assert one(families, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 35
    assert one(families, "podvm_gpu_cc_mode", mode="on") == 1
    assert families["podvm_gpu_metrics_profile_info"].samples[0].labels["profile"] == CC_SAFE


def test_driver_not_loaded_gives_nvml_down_with_nvmls_reason(gpu_root, tmp_path):
    families = scrape(gpu_root, describe(tmp_path / "desc", [gpu(0)], init_error=9))
    assert one(families, "podvm_gpu_nvml_up") == 0
    assert families["podvm_gpu_nvml_error_info"].samples[0].labels == {
        "reason": "driver-not-loaded", "message": "nvmlInit: Driver Not Loaded"}
    assert one(families, "podvm_gpu_boot_state", state="ready") == 1, "the boot metrics stay"


def test_gpu_fallen_off_the_bus_is_down_and_the_others_still_answer(gpu_root, tmp_path):
    desc = describe(tmp_path / "desc", [gpu(0), gpu(1, lost=1), gpu(2)])
    families = scrape(gpu_root, desc)
    assert one(families, "podvm_gpu_nvml_up") == 1
    assert values(families, "podvm_gpu_nvml_gpu_up") == [1, 0, 1]
    error = families["podvm_gpu_nvml_gpu_error_info"].samples[0].labels
    assert error == {"gpu": "1", "reason": "gpu-is-lost",
                     "message": "nvmlDeviceGetHandleByIndex(1): GPU is lost"}
    assert [s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples] == ["0", "2"]


def test_a_gpu_lost_during_the_scrape_is_down(gpu_root, tmp_path):
    desc = describe(tmp_path / "desc", [gpu(0), gpu(1)],
                    error={"nvmlDeviceGetTotalEccErrors.1": 15})
    families = scrape(gpu_root, desc)
    assert values(families, "podvm_gpu_nvml_gpu_up") == [1, 0]
    assert "nvmlDeviceGetTotalEccErrors(GPU 1)" in \
        families["podvm_gpu_nvml_gpu_error_info"].samples[0].labels["message"]


def test_fields_a_gpu_does_not_support_are_left_out_and_retired_pages_where_it_has_them(gpu_root, tmp_path):
    v100 = gpu(1, name="Tesla V100-SXM2-16GB", **{"retired.dbe": 2,
                                                   "remap.correctable": None, "remap.uncorrectable": None,
                                                   "remap.pending": None, "remap.failure": None})
    desc = describe(tmp_path / "desc", [gpu(0, power_mw=None, **H100), v100],
                    error={"nvmlDeviceGetPcieReplayCounter": 999})
    families = scrape(gpu_root, desc)
    assert [s.labels["gpu"] for s in families["DCGM_FI_DEV_POWER_USAGE"].samples] == ["1"]
    assert one(families, "DCGM_FI_DEV_RETIRED_DBE", gpu="1") == 2
    assert values(families, "DCGM_FI_DEV_RETIRED_DBE", gpu="0") == []
    assert values(families, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == []
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" not in families, "an unknown error leaves it out"
    assert values(families, "podvm_gpu_nvml_gpu_up") == [1, 1]


@pytest.mark.parametrize("state", ["failed", "running"])
def test_nvml_is_never_called_before_a_ready_boot(tmp_path, fake_nvml_libs, state):
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], state=state,
                     reason="modules: Xid 79 (GPU has fallen off the bus)" if state == "failed" else None)
    log = tmp_path / "calls.log"
    families = scrape(root, describe(tmp_path / "desc", [gpu(0)], log=log))
    assert calls(log) == []
    assert families["podvm_gpu_nvml_error_info"].samples[0].labels["reason"] == f"boot-{state}"
    assert one(families, "podvm_gpu_boot_state", state=state) == 1
    if state == "failed":
        assert families["podvm_gpu_boot_reason_info"].samples[0].labels["reason"].startswith("modules:")
    else:
        assert "podvm_gpu_boot_duration_seconds" not in families


def test_nvml_is_never_called_without_persistenced(tmp_path, fake_nvml_libs):
    """Without persistenced each NVML client initialises the GPUs again (field case C20)."""
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], persistenced=False)
    log = tmp_path / "calls.log"
    families = scrape(root, describe(tmp_path / "desc", [gpu(0)], log=log))
    assert calls(log) == []
    assert families["podvm_gpu_nvml_error_info"].samples[0].labels["reason"] == "persistenced-not-running"
    assert one(families, "podvm_gpu_daemon_up", daemon="nvidia-persistenced") == 0


def test_fabric_manager_state_only_on_nvswitch_machines(tmp_path, fake_nvml_libs):
    hgx = scrape(make_root(tmp_path / "hgx", None, nvswitches=4))
    assert one(hgx, "podvm_gpu_daemon_up", daemon="nv-fabricmanager") == 0
    assert one(hgx, "podvm_gpu_nvswitches") == 4
    pcie = scrape(make_root(tmp_path / "pcie", None))
    assert values(pcie, "podvm_gpu_daemon_up", daemon="nv-fabricmanager") == []


COMPLETED = {"fabric.state": 3, "fabric.status": 0}


def fabric_states(families: dict) -> dict[str, str]:
    """GPU index -> the fabric state whose series is 1 (exactly one per GPU)."""
    found: dict[str, list[str]] = {}
    for s in families["podvm_gpu_fabric_state"].samples:
        found.setdefault(s.labels["gpu"], [])
        if s.value == 1:
            found[s.labels["gpu"]].append(s.labels["state"])
    assert all(len(v) == 1 for v in found.values()), found
    return {gpu: states[0] for gpu, states in found.items()}


def test_the_fabric_kind_and_each_gpus_fabric_state_and_status_are_gauges(tmp_path,
                                                                          fake_nvml_libs):
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=3, fabric="nvlink5")
    log = tmp_path / "log"
    desc = describe(tmp_path / "desc", [gpu(0, **COMPLETED),
                                        gpu(1, **{"fabric.state": 3, "fabric.status": 26}),
                                        gpu(2, **{"fabric.state": 2})], log=log)
    families = scrape(root, desc)
    kind = families["podvm_gpu_fabric_kind_info"].samples
    assert [s.labels for s in kind] == [{"kind": "nvlink5", "port": "mlx5_2",
                                         "port_guid": "0xa088c20300543a1e"}]
    assert fabric_states(families) == {"0": "completed", "1": "completed", "2": "in-progress"}
    assert len(families["podvm_gpu_fabric_state"].samples) == 3 * 4
    status = {s.labels["gpu"]: s.value for s in families["podvm_gpu_fabric_status"].samples}
    assert status == {"0": 0, "1": 26}, "a status only once the state is completed"
    assert "nvmlDeviceGetGpuFabricInfoV" in calls(log)
    assert "nvmlDeviceGetGpuFabricInfo" not in calls(log), "the newer call answered"


def test_the_535_library_gives_the_fabric_state_through_the_older_call(tmp_path, fake_nvml_libs):
    root = make_root(tmp_path / "root", fake_nvml_libs["535"], gpus=1, nvswitches=2)
    log = tmp_path / "log"
    families = scrape(root, describe(tmp_path / "desc", [gpu(0, **COMPLETED)], log=log))
    assert fabric_states(families) == {"0": "completed"}
    assert "nvmlDeviceGetGpuFabricInfo" in calls(log)
    assert [s.labels["kind"] for s in families["podvm_gpu_fabric_kind_info"].samples] == ["nvswitch"]


def test_no_fabric_state_series_where_nvml_gives_none_and_no_kind_before_the_boot_looked(
        gpu_root, tmp_path):
    families = scrape(gpu_root, describe(tmp_path / "desc", [gpu(0)]))  # NOT_SUPPORTED
    assert "podvm_gpu_fabric_state" not in families and "podvm_gpu_fabric_status" not in families
    assert one(families, "podvm_gpu_nvml_gpu_up", gpu="0") == 1, "the GPU itself still answers"
    cpu = make_root(tmp_path / "cpu", None, state="no-gpu", gpus=0)
    status = cpu / "run/podvm-gpu/status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "fabric": None}))
    assert "podvm_gpu_fabric_kind_info" not in scrape(cpu)


def test_library_missing_or_outside_the_loader_path_is_named_without_importing_pynvml(tmp_path, fake_nvml_libs):
    root = make_root(tmp_path / "root", None)
    probe = ("import sys; from podvm_gpu.host.fs import Root; from podvm_gpu.metrics.command import "
             "MetricsSettings, print_once; print_once(Root(sys.argv[1]), MetricsSettings()); "
             "print('pynvml' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True,
                          timeout=60, env=metrics_env(None))
    assert done.stderr.strip() == "False"
    error = {f.name: f for f in text_string_to_metric_families(done.stdout)}["podvm_gpu_nvml_error_info"]
    assert error.samples[0].labels == {"reason": "library-not-found",
                                       "message": "libnvidia-ml.so.1 is not installed"}
    hidden = root / "usr/lib64/nvidia"
    hidden.mkdir(parents=True)
    (hidden / "libnvidia-ml.so.1").write_bytes(fake_nvml_libs["current"].read_bytes())
    message = scrape(root)["podvm_gpu_nvml_error_info"].samples[0].labels["message"]
    assert message == ("libnvidia-ml.so.1 is not installed (there is /usr/lib64/nvidia/"
                       "libnvidia-ml.so.1, in no directory the loader searches)")


def test_a_library_that_cannot_be_loaded_is_reported(gpu_root):
    (gpu_root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").write_bytes(b"not an ELF file")
    error = scrape(gpu_root)["podvm_gpu_nvml_error_info"].samples[0].labels
    assert error["reason"] == "library-unloadable"
    assert "libnvidia-ml.so.1" in error["message"]


def test_xids_of_the_kernel_log_set_the_last_xid_of_that_gpu(tmp_path, fake_nvml_libs):
    log = ["NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build",
           "NVRM: Xid (PCI:0000:28:00): 31, pid=1234, name=python3, Ch 00000008, intr 10000000. "
           "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34000000.",
           "NVRM: Xid (PCI:0000:28:00): 13, pid=1234, name=python3, Graphics Exception.",
           "NVRM: Xid (PCI:0000:28:00): 13, pid=1234, name=python3, Graphics Exception.",
           "NVRM: Xid (PCI:0000:38:00): 79, pid=0, name=, GPU has fallen off the bus."]
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], kernel_log=log)
    families = scrape(root, describe(tmp_path / "desc", [gpu(i) for i in range(3)]))
    assert [one(families, "DCGM_FI_DEV_XID_ERRORS", gpu=str(i)) for i in range(3)] == [0, 13, 79]
    assert one(families, "podvm_gpu_xid_events", pci_bus_id="00000000:28:00.0", xid="13") == 2
    assert one(families, "podvm_gpu_xid_events", pci_bus_id="00000000:28:00.0", xid="31") == 1
    assert one(families, "podvm_gpu_kernel_fatal_events") == 1
    assert one(families, "podvm_gpu_kernel_events", kind="xid") == 3  # distinct: 31, 13, 79


def test_a_gpu_the_driver_cannot_attach_shows_as_kernel_events_of_its_kinds(tmp_path,
                                                                            fake_nvml_libs):
    """Issue 17's recognitions are kinds of ``podvm_gpu_kernel_events`` (no family of their own:
    the boot's reason says the cause, the kind is what a fleet alerts on); they need no reset,
    so they are not fatal events."""
    log = ["NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build",
           "NVRM: confComputeConstructEngine_IMPL: GPU confidential compute capability is not "
           "enabled.",
           "NVRM: GPU 0000:00:04.0: RmInitAdapter failed! (0x22:0x3f:744)",
           "decompression failed with status 6"]
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], kernel_log=log)
    families = scrape(root, describe(tmp_path / "desc", [gpu(0)]))
    for kind in ("cc-not-enabled", "cannot-attach", "decompress-failed"):
        assert one(families, "podvm_gpu_kernel_events", kind=kind) == 1, kind
    for kind in ("lkca-stubs", "swiotlb-full", "dma-mapping", "xid"):
        assert one(families, "podvm_gpu_kernel_events", kind=kind) == 0, kind
    assert one(families, "podvm_gpu_kernel_fatal_events") == 0


def test_a_hanging_nvml_call_gives_the_bounded_answer_once(gpu_root, tmp_path):
    write_config(gpu_root, nvml_timeout_s=0.5)
    desc = describe(tmp_path / "desc", [gpu(i) for i in range(4)],
                    hang={"nvmlDeviceGetPowerUsage.2": 1})
    started = time.monotonic()
    done = exporter(gpu_root, desc, timeout=30)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    families = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    assert one(families, "podvm_gpu_nvml_up") == 0
    assert families["podvm_gpu_nvml_error_info"].samples[0].labels == {
        "reason": "timeout", "message": "nvmlDeviceGetPowerUsage(GPU 2) did not return within 0.5 s"}
    assert not [n for n in families if n.startswith("DCGM_")], "no half reading"
    assert one(families, "podvm_gpu_boot_state", state="ready") == 1
    print(f"once with a hung NVML call: {elapsed:.2f} s (bound 0.5 s)")
    assert elapsed < 10, "the process ends although the call still hangs"


def serve(root: Path, description: Path | None):
    """Start the exporter's server on a free loopback port; ``(process, base URL)``."""
    proc = subprocess.Popen([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root),
                             "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True,
                            env=metrics_env(description))
    line = proc.stderr.readline()
    assert "serving http://" in line, line
    return proc, line.split("serving ", 1)[1].strip().removesuffix("/metrics")


def get(url: str, **headers) -> tuple[bytes, dict]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        return resp.read(), dict(resp.headers)


def test_http_scrape_on_loopback_in_both_formats_and_gzip(gpu_root, tmp_path):
    proc, base = serve(gpu_root, describe(tmp_path / "desc", [gpu(0), gpu(1)]))
    try:
        body, headers = get(f"{base}/metrics")
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert one(families, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 35
        assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in body.decode()
        # what Prometheus asks for: OpenMetrics first
        body, headers = get(f"{base}/metrics", Accept="application/openmetrics-text;version=1.0.0,"
                            "text/plain;version=0.0.4;q=0.5", **{"Accept-Encoding": "gzip"})
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert headers["Content-Encoding"] == "gzip"
        families = {f.name: f for f in om_families(gzip.decompress(body).decode())}
        assert families["podvm_gpu_nvml_up"].samples[0].value == 1
        with pytest.raises(urllib.error.HTTPError) as err:
            get(f"{base}/other")
        assert err.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_http_scrapes_while_an_nvml_call_hangs_share_the_bound_answer_at_once_and_call_nvml_no_more(gpu_root, tmp_path):
    write_config(gpu_root, nvml_timeout_s=0.5)
    log = tmp_path / "calls.log"
    proc, base = serve(gpu_root, describe(tmp_path / "desc", [gpu(0), gpu(1)], log=log,
                                          hang={"nvmlDeviceGetTotalEccErrors.1": 1}))
    try:
        import concurrent.futures

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # scrapes at the same moment
            bodies = list(pool.map(lambda _: get(f"{base}/metrics")[0].decode(), range(3)))
        first_s = time.monotonic() - started
        first = {f.name: f for f in text_string_to_metric_families(bodies[0])}
        assert all("podvm_gpu_nvml_up 0.0" in body for body in bodies)
        made = len(calls(log))
        started = time.monotonic()
        second = {f.name: f for f in text_string_to_metric_families(get(f"{base}/metrics")[0].decode())}
        second_s = time.monotonic() - started
        assert "nvmlDeviceGetTotalEccErrors(GPU 1)" in \
            first["podvm_gpu_nvml_error_info"].samples[0].labels["message"]
        message = second["podvm_gpu_nvml_error_info"].samples[0].labels["message"]
        assert message.startswith("nvmlDeviceGetTotalEccErrors(GPU 1) has not returned for ")
        assert len(calls(log)) == made, "no new NVML call queues behind the hung one"
        print(f"scrapes with a hung call: 3 at once {first_s:.2f} s, then one {second_s:.3f} s")
        assert first_s < 2, "three scrapes at once share one bound of 0.5 s, they do not queue"
        assert second_s < first_s
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_keeps_nvml_initialised_between_scrapes(gpu_root, tmp_path):
    log = tmp_path / "calls.log"
    proc, base = serve(gpu_root, describe(tmp_path / "desc", [gpu(0)], log=log))
    try:
        for _ in range(3):
            get(f"{base}/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    made = calls(log)
    assert made.count("nvmlInit") == 1
    assert made.count("nvmlDeviceGetCount") == 3


def test_serve_says_why_it_cannot_listen(gpu_root):
    done = exporter(gpu_root, None, "--listen", "192.0.2.1:9400", timeout=30)
    assert done.returncode == 1
    assert "cannot listen on 192.0.2.1:9400" in done.stderr


def test_textfile_is_written_atomically_with_mode_0644(gpu_root, tmp_path):
    write_config(gpu_root, textfile_path="/run/podvm-gpu/metrics.prom")
    done = exporter(gpu_root, describe(tmp_path / "desc", [gpu(0)]), "--textfile")
    assert done.returncode == 0, done.stderr
    path = gpu_root / "run/podvm-gpu/metrics.prom"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert one(families, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 34
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_boot_textfile_is_off_by_default_and_on_costs_no_nvml(gpu_root, tmp_path):
    probe = ("import json, sys; from podvm_gpu.host.fs import Root; from podvm_gpu.metrics.command import "
             "MetricsSettings, write_boot_textfile; s = MetricsSettings(textfile=sys.argv[2] == 'on');"
             " path = write_boot_textfile(Root(sys.argv[1]), s); print(json.dumps([path, "
             "'prometheus_client.exposition' in sys.modules, 'pynvml' in sys.modules]))")
    log = tmp_path / "calls.log"
    env = metrics_env(describe(tmp_path / "desc", [gpu(0)], log=log))

    def boot_end(setting: str) -> list:
        import json

        done = subprocess.run([sys.executable, "-c", probe, str(gpu_root), setting],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert boot_end("off") == [None, False, False], "off: nothing written, nothing imported"
    path, prometheus_imported, pynvml_imported = boot_end("on")
    assert path == str(gpu_root / "run/podvm-gpu/metrics.prom")
    assert (prometheus_imported, pynvml_imported) == (True, False)
    assert calls(log) == []
    families = {f.name: f for f in text_string_to_metric_families(Path(path).read_text())}
    assert one(families, "podvm_gpu_boot_state", state="ready") == 1
    assert "podvm_gpu_nvml_up" not in families


def test_bad_metrics_config_is_a_usage_error_naming_the_key(gpu_root):
    write_config(gpu_root, profile="paranoid")
    done = exporter(gpu_root, None)
    assert done.returncode == 2
    assert "metrics.profile: must be one of auto, full, cc-safe, not 'paranoid'" in done.stderr


def test_fake_library_exports_exactly_what_the_tests_say(fake_nvml_libs):
    import ctypes

    current = ctypes.CDLL(str(fake_nvml_libs["current"]))
    old = ctypes.CDLL(str(fake_nvml_libs["535"]))
    assert all(hasattr(current, name) for name in fake_nvml.FUNCTIONS)
    assert [n for n in fake_nvml.FUNCTIONS if not hasattr(old, n)] == fake_nvml.ABSENT_IN_535
    assert os.path.basename(fake_nvml_libs["current"]) == "libnvidia-ml.so.1"


def test_once_imports_prometheus_client_without_its_init_and_leaves_a_working_package(tmp_path):
    root = make_root(tmp_path / "root", None, state="no-gpu", gpus=0)
    probe = ("import sys; from podvm_gpu.host.fs import Root; from podvm_gpu.metrics.command import "
             "MetricsSettings, print_once; print_once(Root(sys.argv[1]), MetricsSettings()); "
             "skipped = 'prometheus_client' not in sys.modules and 'prometheus_client.metrics' not in "
             "sys.modules; import prometheus_client; print(skipped, prometheus_client.Counter.__name__, "
             "prometheus_client.exposition is sys.modules['prometheus_client.exposition'], "
             "file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True,
                          timeout=60, env=metrics_env(None))
    assert done.returncode == 0, done.stderr
    assert done.stderr.split() == ["True", "Counter", "True"]
    assert "podvm_gpu_boot_state{state=\"no-gpu\"} 1.0" in done.stdout


def test_the_metrics_doc_lists_every_metric_with_its_type_and_profile(tmp_path, fake_nvml_libs):
    """docs/metrics.md's table is the reference: every family the exporter can export is in it, with
    the type and profile it has, and nothing else is."""
    import re as regex

    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    table = dict((name, (kind.split()[0], profile)) for name, kind, profile in regex.findall(
        r"^\| `((?:podvm_gpu|DCGM)_\w+)` \| ([^|]+?) \| [^|]*\| (both|full) \|", doc, regex.M))
    lib = fake_nvml_libs["current"]
    seen: dict[str, str] = {}
    cases = [(make_root(tmp_path / "full", lib, nvswitches=2, kernel_log=[
                 "NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception."]),
              describe(tmp_path / "d1", [gpu(0, recovery_action=3, **COMPLETED), gpu(1, lost=1)]),
              FULL),
             (make_root(tmp_path / "cc", lib, attestation={
                 "result": "passed", "reason": None, "duration_s": 3.2, "devices": [
                     {"type": "gpu", "index": 0}]}, binding={
                 "state": "bound", "result": "pass", "appended": True, "digest": "ab" * 48,
                 "reason": None, "eventlog": "/run/attestation-agent/eventlog"}),
              describe(tmp_path / "d2", [gpu(0)], cc="on"), CC_SAFE),
             (make_root(tmp_path / "failed", lib, state="failed", reason="watch: GPU x: Xid 79"),
              None, CC_SAFE)]
    # issue 34: the watcher's finding (watch.json) beside the failed status
    from podvm_gpu.watchfile import WATCH_PATH, new_state

    watch = {**new_state(None), "finding": {"gpu": "0000:18:00.0", "reason": "watch: GPU x"}}
    Path(cases[2][0], WATCH_PATH.lstrip("/")).write_text(json.dumps(watch))
    # issue 44: 580's fabric health as the boot read it (status.json's fabric.health)
    status_path = Path(cases[0][0], "run/podvm-gpu/status.json")
    doc = json.loads(status_path.read_text())
    doc["fabric"]["health"] = [{"gpu": "00000000:18:00.0", "summary": "Healthy", "summary_code": 1,
                                "mask": 4522}]
    status_path.write_text(json.dumps(doc))
    for root, desc, profile in cases:
        for name, family in scrape(root, desc).items():
            seen[name] = family.type
            if profile == CC_SAFE:
                assert table[name][1] == "both", f"{name} is exported in cc-safe"
    assert set(seen) == set(table)
    for name, kind in seen.items():
        assert kind == table[name][0], name  # an info family is a gauge in the text format


def test_a_status_with_fields_of_the_wrong_type_still_gives_the_boot_families():
    """Found by a newcomer: ``"gpus": 5`` or ``"cdi": {"devices": 5}`` in a hand-edited or
    damaged status.json made every scrape fail (TypeError); such a list now counts 0. (A
    ``ready`` document like this is unreadable since issue 35 item 8, so a failed one here.)"""
    from podvm_gpu.metrics.families import boot_families

    status = {"state": "failed", "reason": "cdi: boom", "warnings": [], "gpus": 5,
              "nvswitches": "x", "cdi": {"devices": 5},
              "steps": [{"name": "detect", "duration_s": "fast"}], "started_at": 3,
              "finished_at": None}
    families = {f.name: f for f in boot_families(status, None)}
    assert [s.value for s in families["podvm_gpu_gpus"].samples] == [0]
    assert [s.value for s in families["podvm_gpu_nvswitches"].samples] == [0]
    assert [s.value for s in families["podvm_gpu_cdi_devices"].samples] == [0]
    assert [s.value for s in families["podvm_gpu_boot_state"].samples if s.labels["state"] == "failed"] == [1]


def test_a_ready_status_that_breaks_the_ready_rules_is_not_ready_to_the_exporter(tmp_path):
    """Issue 35 item 8: ``{"state": "ready", "gpus": 5}`` kept ready=1; it is unreadable now,
    every state 0 and the reason info saying why."""
    from podvm_gpu.config.metrics import MetricsSettings
    from podvm_gpu.host.fs import Root
    from podvm_gpu.metrics.exporter import Exporter

    path = tmp_path / "run/podvm-gpu/status.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"state": "ready", "reason": None, "warnings": [], "gpus": 5}))
    exporter = Exporter(Root(tmp_path), MetricsSettings())
    try:
        families = {f.name: f for f in exporter.families(with_nvml=False)}
    finally:
        exporter.close()
    assert [s.value for s in families["podvm_gpu_boot_state"].samples] == [0, 0, 0, 0]
    reason = families["podvm_gpu_boot_reason"].samples[0].labels["reason"]
    assert "says ready, but gpus is 5" in reason, reason


def test_the_metrics_doc_names_every_reason_the_nvml_error_info_can_give():
    """docs/metrics.md listed the reasons of ``podvm_gpu_nvml_error_info`` without ``no-status``
    (issue 21 item 10): every reason the code can give is in the doc."""
    import re

    repo = Path(__file__).resolve().parents[1]
    code = (repo / "podvm_gpu/metrics/exporter.py").read_text() + \
        (repo / "podvm_gpu/gpufacts/nvml.py").read_text()
    reasons = set(re.findall(r'return "([a-z][a-z-]+)", ', code)) | \
        set(re.findall(r'NvmlReading\(False, "([a-z][a-z-]+)"', code))
    doc = (repo / "docs/metrics.md").read_text()

    assert {"no-status", "timeout", "library-not-found"} <= reasons
    assert [r for r in sorted(reasons) if f"`{r}`" not in doc] == []


def test_the_reason_label_escapes_control_characters_as_status_and_check_do():
    """Issue 35 item 17: ESC and BEL of a status reason reached podvm_gpu_boot_reason_info raw."""
    from podvm_gpu.metrics.exporter import render
    from podvm_gpu.metrics.families import boot_families

    reason = "modules: \x1b[2J\x07boom"
    info = next(f for f in boot_families({"state": "failed", "reason": reason}, None)
                if f.name == "podvm_gpu_boot_reason")
    assert info.samples[0].labels["reason"] == "modules: \\x1b[2J\\x07boom"
    assert "\x1b" not in render(boot_families({"state": "failed", "reason": reason}, None)).decode()


def test_another_roots_nvml_is_never_loaded_and_nvml_up_says_why(gpu_root, tmp_path):
    """Issue 47 item 3: ``metrics --root DIR`` loads no libnvidia-ml.so.1 from DIR (foreign code,
    and another root's NVML talks to this machine's driver anyway): NVML families say why. Run
    without the test-only opening (``PODVM_GPU_TEST_FOREIGN_NVML``) metrics_env gives."""
    log = tmp_path / "nvml.log"
    desc = describe(tmp_path / "desc", [gpu(0)], log=log)
    env = {k: v for k, v in metrics_env(desc).items() if k != "PODVM_GPU_TEST_FOREIGN_NVML"}
    done = subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(gpu_root)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    families = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    assert one(families, "podvm_gpu_nvml_up") == 0
    reason = families["podvm_gpu_nvml_error_info"].samples[0].labels
    assert reason["reason"] == "foreign-root", reason
    assert "root /" in reason["message"], reason
    assert calls(log) == []  # the fake was never loaded: none of its calls ran


def test_an_unloadable_library_is_named_once_in_the_message(tmp_path, monkeypatch):
    """Issue 47 item 14: ``.../libnvidia-ml.so.X: .../libnvidia-ml.so.X: file too short``."""
    import types

    from podvm_gpu.gpufacts.nvml import TEST_FOREIGN_NVML, NvmlReader
    from podvm_gpu.host.fs import Root

    lib = tmp_path / "usr/lib/libnvidia-ml.so.550.54.15"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv(TEST_FOREIGN_NVML, "1")
    found = types.SimpleNamespace(path="/usr/lib/libnvidia-ml.so.550.54.15")
    reading = NvmlReader(Root(tmp_path), 10, find=(lambda root: found, lambda root: None)).read("full")
    assert reading.reason == "library-unloadable", reading
    assert reading.message.count(str(lib)) == 1, reading.message
