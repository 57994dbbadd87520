"""Issue 28's metric families (podvm_gpu/metrics/health_families.py): the recovery action from
NVML's field (the fake NVML serves NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), dcgm-exporter's
DCGM_EXP_GPU_HEALTH_STATUS computed value by value as docs/metrics.md "Fleet health" says,
DCGM_EXP_XID_ERRORS_COUNT in its window, DCGM_FI_DEV_CC_MODE."""

from __future__ import annotations

import pytest
from fake_nvml import describe, gpu, make_root
from test_metrics import one, scrape, values

from podvm_gpu.gpufacts.reading import GpuReading
from podvm_gpu.metrics.health_families import FAIL, PASS, WARN, health_results, xid_counts

HEALTHY = {"DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
           "DCGM_FI_DEV_ROW_REMAP_PENDING": 0}


def reading(values=HEALTHY, fabric=None, action=None) -> GpuReading:
    g = GpuReading(0)
    g.up, g.values = True, dict(values)
    if fabric is not None:
        g.fabric_state, g.fabric_status = fabric
    g.recovery_action = action
    return g


@pytest.mark.parametrize("changed, mem", [
    ({}, (PASS, "DCGM_FR_OK")),
    ({"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1}, (FAIL, "DCGM_FR_ROW_REMAP_FAILURE")),
    ({"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 3}, (FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")),
    ({"DCGM_FI_DEV_ROW_REMAP_PENDING": 1}, (WARN, "DCGM_FR_PENDING_ROW_REMAP")),
    ({"DCGM_FI_DEV_RETIRED_PENDING": 1}, (WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS")),
    # the worst wins: a failure with a pending remap is the failure
    ({"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1, "DCGM_FI_DEV_ROW_REMAP_PENDING": 1},
     (FAIL, "DCGM_FR_ROW_REMAP_FAILURE")),
])
def test_the_mem_watch_value_by_value(changed, mem):
    assert health_results(reading({**HEALTHY, **changed}), [])["MEM"] == mem


def test_no_memory_value_read_means_no_mem_watch_never_a_pass():
    assert set(health_results(reading({}), [])) == {"ALL"}


@pytest.mark.parametrize("fabric, nvlink", [
    ((0, None), None), ((1, None), (WARN, "DCGM_FR_NVLINK_DOWN")),
    ((2, None), (WARN, "DCGM_FR_NVLINK_DOWN")), ((3, 0), (PASS, "DCGM_FR_OK")),
    ((3, 3), (FAIL, "DCGM_FR_NVLINK_DOWN")),
])
def test_the_nvlink_watch_only_where_the_gpu_reports_a_fabric(fabric, nvlink):
    assert health_results(reading(fabric=fabric), []).get("NVLINK") == nvlink


@pytest.mark.parametrize("action, result", [
    (None, PASS), (0, PASS), (1, FAIL), (2, FAIL), (3, WARN), (4, FAIL), (5, WARN), (6, FAIL),
    (7, FAIL), (99, PASS),
])
def test_the_all_watch_by_recovery_action(action, result):
    got = health_results(reading(action=action), [])["ALL"]
    assert got == (result, "DCGM_FR_OK" if result == PASS else "DCGM_FR_UNKNOWN")


def test_a_fatal_xid_fails_all_and_xid_95_is_dcgms_uncontained_error():
    assert health_results(reading(), [79])["ALL"] == (FAIL, "DCGM_FR_UNKNOWN")
    assert health_results(reading(), [48, 95])["ALL"] == (FAIL, "DCGM_FR_UNCONTAINED_ERROR")


def test_xid_counts_keep_only_the_window_and_never_guess_without_a_clock():
    timed = [(10_000_000, "0000:18:00", 13), (350_000_000, "0000:18:00", 13),
             (399_000_000, "0000:18:00", 31), (399_500_000, "0000:28:00", 79), (None, "0000:18:00", 13)]
    assert xid_counts(timed, 400_000_000) == {"00000000:18:00.0": {13: 1, 31: 1},
                                              "00000000:28:00.0": {79: 1}}
    assert xid_counts(timed, None) == {}


def kmsg(root, records: list[tuple[int, str]], uptime_s: float) -> None:
    (root / "dev/kmsg").write_text("".join(f"3,{i},{usec},-;{m}\n"
                                           for i, (usec, m) in enumerate(records)))
    (root / "proc/uptime").write_text(f"{uptime_s:.2f} 100.00\n")


def test_recovery_action_health_and_xid_count_through_the_exporter(tmp_path, fake_nvml_libs):
    root = make_root(tmp_path / "root", fake_nvml_libs["current"], gpus=2)
    kmsg(root, [(5_000_000, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception"),
                (590_000_000, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception"),
                (595_000_000, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception")], 600)
    desc = describe(tmp_path / "desc", [gpu(0, recovery_action=4), gpu(1)])
    families = scrape(root, desc)
    assert one(families, "DCGM_FI_DEV_GPU_RECOVERY_ACTION", gpu="0") == 4
    assert values(families, "DCGM_FI_DEV_GPU_RECOVERY_ACTION", gpu="1") == []
    assert one(families, "podvm_gpu_recovery_action", gpu="0", action="Drain and Reset") == 1
    assert sum(values(families, "podvm_gpu_recovery_action", gpu="0")) == 1
    assert one(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="0", health_watch="ALL") == FAIL
    assert one(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="1", health_watch="ALL") == PASS
    assert one(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="1", health_watch="MEM") == PASS
    # two of the three Xid 13 are in the last 5 minutes; GPU 1 has its zero series
    assert one(families, "DCGM_EXP_XID_ERRORS_COUNT", gpu="0", xid="13",
               window_size_in_ms="300000") == 2
    zero = [s for s in families["DCGM_EXP_XID_ERRORS_COUNT"].samples if s.labels["gpu"] == "1"]
    assert [(s.value, "xid" in s.labels) for s in zero] == [(0, False)]
    assert one(families, "DCGM_FI_DEV_CC_MODE", gpu="0") == 0


def test_the_535_library_gives_no_recovery_action_and_no_series_for_it(tmp_path, fake_nvml_libs):
    root = make_root(tmp_path / "root", fake_nvml_libs["535"], gpus=1)
    families = scrape(root, describe(tmp_path / "desc", [gpu(0)]))
    assert "DCGM_FI_DEV_GPU_RECOVERY_ACTION" not in families
    assert "podvm_gpu_recovery_action" not in families
    assert one(families, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="0", health_watch="ALL") == PASS
