"""The ``fabric`` and ``fabricmanager`` rows of ``check`` on a running VM (issue 16; contract
section 5.1), through the real command: each case's world is booted by the real ``podvm-gpu
boot`` under the scenario harness, then ``podvm-gpu check --json`` runs on what that boot left.

- ``fabric``: the kind PCI shows and why; on NVLink 5 the IB modules, the port chosen as the boot
  chooses it with its GUID and subnet manager, the umad nodes, NVLSM and the fabric manager
  alive (S36, S41, S45, S49, S46);
- ``fabricmanager``: keyed on the kind, so an NVLink 5 VM is not "managed outside the VM".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_check_vm_rows import booted_check, case

pytestmark = pytest.mark.usefixtures("umockdev_run")


def test_an_nvlink5_vm_names_its_port_guid_modules_nodes_and_daemons():
    checks = booted_check(case("S36"))
    row = checks["fabric"]
    assert row["result"] == "pass", row
    for fact in ("NVLink 5", "0000:e1:00.0 (VPD keyword V3 carries SW_MNG)",
                 "IB modules mlx5_core, mlx5_ib, ib_umad loaded",
                 "port mlx5_2 (0000:e1:00.0), GUID 0xa088c20300543a1e, subnet manager enabled",
                 "umad* node(s)", "NVLSM running (pid", "fm_sm_ipc.socket present",
                 "nv-fabricmanager running (pid"):
        assert fact in row["detail"], (fact, row)
    fm = checks["fabricmanager"]
    assert fm["result"] == "pass", fm
    assert "outside" not in fm["detail"], "an NVLink 5 VM runs its own fabric manager"
    assert fm["detail"].startswith("running (pid"), fm


def test_nvlsm_gone_after_the_boot_fails_the_fabric_row():
    def nvlsm_gone(world):
        Path(world.path("/run/podvm-gpu/nvlsm.pid")).unlink()

    row = booted_check(case("S36"), after_boot=nvlsm_gone)["fabric"]
    assert row["result"] == "fail", row
    assert "NVLSM is not running (/run/podvm-gpu/nvlsm.pid names no live nvlsm)" in row["detail"]
    assert "port mlx5_2" in row["detail"], "what was found is still said"


def test_sm_disabled_on_every_management_port_fails_both_rows_naming_the_ports():
    checks = booted_check(case("S41"))
    row = checks["fabric"]
    assert row["result"] == "fail", row
    assert "no management port with the subnet manager enabled: mlx5_2 (0000:e1:00.0): " \
           "IsSMDisabled set" in row["detail"], row
    assert "mlx5_0" not in row["detail"], "a compute NIC is never a candidate"
    fm = checks["fabricmanager"]
    assert fm["result"] == "fail" and "NVLink 5 management ports but nv-fabricmanager is not " \
        "running" in fm["detail"], fm


def test_a_direct_nvswitch_board_and_a_vm_without_fabric_pass_naming_the_kind():
    row = booted_check(case("S49"))["fabric"]
    assert row["result"] == "pass", row
    assert row["detail"].startswith("nvswitch: 4 NVSwitch function(s)"), row
    row = booted_check(case("S46"))["fabric"]
    assert row["result"] == "pass", row
    assert row["detail"].startswith("none: no NVSwitch function and no ConnectX function"), row
    assert "malformed VPD" in row["detail"], "the functions that are not ports are named"


def test_a_mixed_topology_fails_the_fabric_row_and_starts_no_fabric_manager():
    checks = booted_check(case("S45"))
    assert checks["fabric"]["result"] == "fail", checks["fabric"]
    assert checks["fabric"]["detail"].startswith("mixed: "), checks["fabric"]
    assert checks["fabricmanager"]["result"] == "skip", checks["fabricmanager"]


# --- issue 33: the fabric health summary (nvidia-smi 580), a query of its own ------------------

# what a build without 580's detail fields answers (the harness refuses them so: fake_tool.py)
NO_DETAIL = (2, 'Field "fabric.health.bandwidth" is not a valid field to query.\n\n')


class _HealthCtx:
    """A boot context as much as ``health_summary`` reads it: one answer for the summary query,
    one for 580's detail query (issue 44; refused unless given)."""

    def __init__(self, rc, out, detail=NO_DETAIL):
        from podvm_gpu.gpufacts import smi
        from podvm_gpu.host.proc import Completed

        self.warnings, self.asked = [], []
        self.runner = self
        self.fabric = None
        self._done = {tuple(smi.fabric_detail_argv()): Completed(
            argv=[], returncode=detail[0], stdout=detail[1], stderr="", duration_s=0.01)}
        self._summary = Completed(argv=[], returncode=rc, stdout=out, stderr="", duration_s=0.01)

    def run(self, argv, check=False, timeout=None):
        self.asked.append(argv)
        return self._done.get(tuple(argv), self._summary)

    def harmless_timeout(self, tool):
        return 5.0

    def warn(self, text):
        self.warnings.append(text)


@pytest.mark.parametrize("out, said", [
    ("00000000:18:00.0, Healthy\n00000000:2A:00.0, Healthy\n", "health summary Healthy on 2 GPU(s)"),
    ("00000000:18:00.0, [N/A]\n", "health summary N/A on 1 GPU(s)"),
])
def test_a_healthy_or_na_fabric_health_summary_passes_without_a_warning(out, said):
    from podvm_gpu.gpufacts import smi
    from podvm_gpu.steps.fabric.parse import health_summary

    ctx = _HealthCtx(0, out)

    assert health_summary(ctx) == said
    assert ctx.warnings == []
    assert ctx.asked[0] == ["nvidia-smi", "--query-gpu=pci.bus_id,fabric.health.summary",
                            "--format=csv,noheader"]
    # issue 44: where the summary was read, 580's detail is asked (a query of its own)
    assert ctx.asked[1:] == [smi.fabric_detail_argv()]


def test_an_unhealthy_fabric_fails_naming_the_gpu_and_limited_capacity_warns():
    from podvm_gpu.errors import StepFailed
    from podvm_gpu.steps.fabric.parse import health_summary

    with pytest.raises(StepFailed, match=r"fabric unhealthy: 00000000:2A:00.0: health summary "
                                         r"Unhealthy \(fabric.health.summary\)"):
        health_summary(_HealthCtx(0, "00000000:18:00.0, Healthy\n00000000:2A:00.0, Unhealthy\n"))
    ctx = _HealthCtx(0, "00000000:18:00.0, Limited Capacity\n00000000:2A:00.0, Sparkly\n")
    assert health_summary(ctx) == "health summary Limited Capacity on 1 GPU(s), Sparkly on 1 GPU(s)"
    assert len(ctx.warnings) == 2
    assert "Limited Capacity" in ctx.warnings[0] and "'Sparkly' not understood" in ctx.warnings[1]


def test_a_build_without_the_field_is_not_offered_and_another_failure_warns():
    from podvm_gpu.steps.fabric.parse import health_summary

    ctx = _HealthCtx(2, 'Field "fabric.health.summary" is not a valid field to query.\n\n')
    assert health_summary(ctx) == "health summary not offered by this nvidia-smi"
    assert ctx.warnings == []
    ctx = _HealthCtx(3, "Not Supported\n")
    assert health_summary(ctx) == "health summary not read"
    assert ctx.warnings and "exit 3 (not supported)" in ctx.warnings[0]


class _OutsideFacts:
    """check's facts for a VM without NVSwitches whose GPUs report a fabric managed outside."""

    def __init__(self, root, summary_answer):
        from podvm_gpu.gpufacts import smi
        from podvm_gpu.host.fs import Root

        self.root = Root(str(root))
        self.answers = {
            tuple(smi.fabric_argv()): (0, "00000000:18:00.0, state  Completed, status Success\n"),
            tuple(smi.fabric_health_argv()): summary_answer,
            tuple(smi.fabric_detail_argv()): NO_DETAIL}
        self.runner = self
        self.timeouts = {}

    def run(self, argv, check=False, timeout=None):
        from podvm_gpu.host.proc import Completed

        rc, out = self.answers[tuple(argv)]
        return Completed(argv=argv, returncode=rc, stdout=out, stderr="", duration_s=0.01)


@pytest.mark.parametrize("answer, result, words", [
    ((0, "00000000:18:00.0, Healthy\n"), "pass", "health summary Healthy on 1 GPU(s)"),
    ((2, 'Field "fabric.health.summary" is not a valid field to query.\n\n'), "pass",
     "health summary not offered by this nvidia-smi"),
    ((0, "00000000:18:00.0, Unhealthy\n"), "fail", "00000000:18:00.0: health summary Unhealthy"),
    ((0, "00000000:18:00.0, Limited Capacity\n"), "warn", "less bandwidth"),
])
def test_checks_fabric_row_judges_the_health_summary_as_boot_does(tmp_path, answer, result, words):
    """Issue 33: the fabric was judged three times; check's row now reads 580's health summary
    after Completed/Success, as boot's step does (parse.read_summary)."""
    from podvm_gpu.steps.fabric import step

    row = step._outside_row(_OutsideFacts(tmp_path, answer))

    assert (row.result, words in row.detail) == (result, True), row
