"""When a series is there and when it is not (issue 19, "no false alarms"): no ``daemon_up`` that
reads as down for a daemon the boot did not start, and a field a GPU cannot give costs that
series only: never the scrape, never the GPU, never a 0 in its place (a fractional vGPU answers
NOT_SUPPORTED for much of NVML; NVIDIA/dcgm-exporter#661 exported nothing at all then).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from fake_nvml import describe, gpu, make_root, metrics_env
from prometheus_client.parser import text_string_to_metric_families

from podvm_gpu.metrics.families import DCGM_FIELDS


def scrape(root, desc=None) -> dict:
    done = subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root)],
                          capture_output=True, text=True, timeout=120, env=metrics_env(desc))
    assert done.returncode == 0, done.stderr
    return {f.name: f for f in text_string_to_metric_families(done.stdout)}


def daemon_series(families: dict) -> dict[str, float]:
    family = families.get("podvm_gpu_daemon_up")
    return {s.labels["daemon"]: s.value for s in (family.samples if family else [])}


def test_a_cpu_vm_has_no_daemon_series_at_all(tmp_path):
    """The real boot on this GPU-less machine: state no-gpu, no daemon meant to run."""
    root = tmp_path / "root"
    root.mkdir()
    booted = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            capture_output=True, text=True, timeout=60, env=metrics_env(None))
    assert booted.returncode == 0, booted.stderr
    families = scrape(root)
    assert [s.labels for s in families["podvm_gpu_boot_state"].samples if s.value] == [{"state": "no-gpu"}]
    assert daemon_series(families) == {}


@pytest.mark.parametrize("state, nvswitches, persistenced, expected", [
    ("ready", 0, True, {"nvidia-persistenced": 1}),
    ("ready", 0, False, {"nvidia-persistenced": 0}),  # should run and does not: a true alarm
    ("ready", 4, True, {"nvidia-persistenced": 1, "nv-fabricmanager": 0}),
])
def test_daemon_series_only_for_daemons_the_boot_meant_to_run(tmp_path, state, nvswitches,
                                                              persistenced, expected):
    root = make_root(tmp_path / "root", None, state=state, gpus=0 if state == "no-gpu" else 2,
                     nvswitches=nvswitches, persistenced=persistenced)
    assert daemon_series(scrape(root)) == expected


@pytest.mark.parametrize("fabric, running, expected", [
    ("nvlink5", (), {"nvlsm": 0, "nv-fabricmanager": 0}),  # both meant to run, both gone
    ("nvlink5", ("nvlsm", "nv-fabricmanager"), {"nvlsm": 1, "nv-fabricmanager": 1}),
    ("nvswitch", (), {"nv-fabricmanager": 0}),  # no NVLSM on an NVSwitch board
    ("none", (), {}),  # the fabric, if any, is managed outside the VM
    ("mixed", (), {}),  # refused before any daemon starts
])
def test_fabric_daemon_series_follow_the_fabric_kind_of_the_boot(tmp_path, fabric, running,
                                                                 expected):
    """issue 16: an NVLink 5 VM has no NVSwitch on PCI, yet the boot starts NVLSM and the fabric
    manager; keyed on ``nvswitches`` their series were missing and their death never alerted."""
    root = make_root(tmp_path / "root", None, gpus=8, fabric=fabric, running=running)
    assert daemon_series(scrape(root)) == {"nvidia-persistenced": 1, **expected}


def test_a_boot_still_before_the_daemons_or_failed_before_them_has_no_daemon_series():
    from podvm_gpu.metrics.exporter import daemons_due

    down = {"nvidia-persistenced": False, "nv-fabricmanager": False}
    running = {"state": "running", "nvswitches": [{}], "steps": [
        {"name": "drivers", "result": "ok"}, {"name": "persistenced", "result": "running"}]}
    assert daemons_due(running, down) == {}
    assert daemons_due(running, {**down, "nvidia-persistenced": True}) == {
        "nvidia-persistenced": True}, "a daemon that runs is always told"
    assert daemons_due({"state": "no-gpu", "steps": []}, down) == {}
    assert daemons_due(None, down) == {}

    failed_early = {"state": "failed", "nvswitches": [{}], "steps": [
        {"name": "drivers", "result": "ok"}, {"name": "modules", "result": "failed"}]}
    assert daemons_due(failed_early, {"nvidia-persistenced": False, "nv-fabricmanager": False}) == {}
    failed_there = {"state": "failed", "nvswitches": [{}], "steps": [
        {"name": "persistenced", "result": "ok"}, {"name": "fabricmanager", "result": "failed"}]}
    assert daemons_due(failed_there, {"nvidia-persistenced": True, "nv-fabricmanager": False}) == {
        "nvidia-persistenced": True, "nv-fabricmanager": False}
    nvl5_failed = {"state": "failed", "nvswitches": [], "fabric": {"kind": "nvlink5"}, "steps": [
        {"name": "persistenced", "result": "ok"}, {"name": "fabricmanager", "result": "failed"}]}
    assert daemons_due(nvl5_failed, {**down, "nvlsm": False}) == {
        "nvidia-persistenced": False, "nvlsm": False, "nv-fabricmanager": False}
    nvl5_early = {**nvl5_failed, "steps": [{"name": "modules", "result": "failed"}]}
    assert daemons_due(nvl5_early, {**down, "nvlsm": False}) == {}
    skipped = {"state": "failed", "nvswitches": [], "steps": [
        {"name": "persistenced", "result": "ok"}, {"name": "fabricmanager", "result": "skipped"}]}
    assert daemons_due(skipped, {"nvidia-persistenced": True, "nv-fabricmanager": False}) == {
        "nvidia-persistenced": True}


# NVML call of the fake (tests/fake_nvml) -> the DCGM fields it alone gives.
CALL_FIELDS = {
    "nvmlDeviceGetTemperatureThreshold": {"DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_SHUTDOWN_TEMP",
                                          "DCGM_FI_DEV_GPU_MAX_OP_TEMP"},
    "nvmlDeviceGetTotalEccErrors": {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                                    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"},
    "nvmlDeviceGetRetiredPages": {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE"},
    "nvmlDeviceGetRetiredPagesPendingStatus": {"DCGM_FI_DEV_RETIRED_PENDING"},
    "nvmlDeviceGetRemappedRows": {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                                  "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                  "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE"},
    "nvmlDeviceGetPcieReplayCounter": {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER"},
    "nvmlDeviceGetPowerUsage": {"DCGM_FI_DEV_POWER_USAGE"},
    "nvmlDeviceGetTotalEnergyConsumption": {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
    "nvmlDeviceGetClockInfo": {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"},
    "nvmlDeviceGetUtilizationRates": {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"},
    "nvmlDeviceGetEncoderUtilization": {"DCGM_FI_DEV_ENC_UTIL"},
    "nvmlDeviceGetDecoderUtilization": {"DCGM_FI_DEV_DEC_UTIL"},
    # the older call still gives free and used: only the reserved memory is lost
    "nvmlDeviceGetMemoryInfo_v2": {"DCGM_FI_DEV_FB_RESERVED"},
    "nvmlDeviceGetTemperatureV": set(),  # the older nvmlDeviceGetTemperature answers
}
# NVML return codes a GPU gives for a field it cannot report (nvml.h): NOT_SUPPORTED ("Not
# Supported", nvidia-smi's [N/A]), NO_PERMISSION, INVALID_ARGUMENT, UNKNOWN.
CODES = (3, 4, 2, 999)
PER_GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device")


def test_every_field_that_fails_costs_its_own_series_only(tmp_path, fake_nvml_libs):
    """One scrape, one GPU per NVML call: GPU i fails call i with one of four codes; the last
    GPU fails nothing. Each GPU loses exactly its call's series and nothing else."""
    calls = list(CALL_FIELDS)
    gpus = [gpu(i) for i in range(len(calls) + 1)]
    errors = {f"{call}.{i}": CODES[i % len(CODES)] for i, call in enumerate(calls)}
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=len(gpus))
    families = scrape(root, describe(tmp_path / "desc", gpus, error=errors))
    assert families["podvm_gpu_nvml_up"].samples[0].value == 1
    assert [s.value for s in families["podvm_gpu_nvml_gpu_up"].samples] == [1] * len(gpus)
    every = set(DCGM_FIELDS)
    for i, call in enumerate(calls + [None]):
        present = {name for name, family in families.items() if name.startswith("DCGM_")
                   for s in family.samples if s.labels["gpu"] == str(i)}
        assert present == every - CALL_FIELDS.get(call, set()), (i, call)


def test_a_fractional_vgpu_exports_what_it_has_and_the_scrape_stands(tmp_path, fake_nvml_libs):
    """A fractional vGPU guest (a C-series profile, 1/4 of an A100): no ECC, retired pages,
    remapped rows, replay counter, thresholds, power or energy, no encoder/decoder, no reserved
    memory; CC not supported. GPU 1 is a full passthrough GPU beside it."""
    unsupported = ("ecc.sbe_vol", "ecc.dbe_vol", "ecc.sbe_agg", "ecc.dbe_agg", "retired.sbe",
                   "retired.dbe", "retired.pending", "remap.correctable", "remap.uncorrectable",
                   "remap.pending", "remap.failure", "pcie_replay", "temp.slowdown", "temp.shutdown",
                   "temp.gpu_max", "power_mw", "energy_mj", "util.encoder", "util.decoder",
                   "mem.reserved")
    vgpu = gpu(0, name="GRID A100-10C", **dict.fromkeys(unsupported))
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=2)
    desc = describe(tmp_path / "desc", [vgpu, gpu(1)], error={"nvmlSystemGetConfComputeSettings": 3})
    families = scrape(root, desc)
    assert families["podvm_gpu_nvml_up"].samples[0].value == 1
    assert [s.value for s in families["podvm_gpu_nvml_gpu_up"].samples] == [1, 1]
    on_vgpu = {name: s.value for name, family in families.items() if name.startswith("DCGM_")
               for s in family.samples if s.labels["gpu"] == "0"}
    assert set(on_vgpu) == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK",
                            "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_UTIL",
                            "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"}
    assert on_vgpu["DCGM_FI_DEV_FB_USED"] == 4, "4 MiB used, from the older memory call"
    on_full = {name for name, family in families.items() if name.startswith("DCGM_")
               for s in family.samples if s.labels["gpu"] == "1"}
    assert on_full == set(DCGM_FIELDS)
    assert [s.labels["modelName"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples] == [
        "GRID A100-10C", "NVIDIA H100 80GB HBM3"]
