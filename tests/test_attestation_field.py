"""Field items on the confidential path (issue 37 item 7), with the nvattest stand-in:
NVAT 104 ``RIM Not Found`` named as such with the VBIOS version nvidia-smi reports, an
nvattest older than 1.2.1 attesting NVSwitches warns naming both versions, and the stand-in
held to what NVIDIA's real nvattest 1.2.2 answered (../shared/nvattest.md, "Confirmed with the
real binary")."""

from __future__ import annotations

import sys

import pytest
from test_attestation_gate import _ppcie_plan, world  # noqa: F401  (the fixture)
from test_attestation_verdict import NONCE, attest, nvattest

from podvm_gpu.errors import StepFailed
from podvm_gpu.steps.cc.attest import gate

VBIOS = "96.00.D9.00.01"


def answering_vbios(world_fixture, text: str = f"{VBIOS}\n") -> None:
    """nvidia-smi of the world answering ``--query-gpu=vbios_version`` as a real one does."""
    smi = world_fixture.root.parent / "bin" / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\nimport sys\n"
                   f"if '--query-gpu=vbios_version' in sys.argv:\n    print({text!r}, end='')\n")
    smi.chmod(0o755)


def test_rim_not_found_is_named_with_the_vbios_and_is_not_a_mismatch(world):  # noqa: F811
    answering_vbios(world)
    ctx = world({"gpu": {"code": 104}})
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    reason = str(err.value)
    assert "NVAT result 104 (RIM Not Found)" in reason
    assert f"RIM not found: NVIDIA has not published the reference values for this GPU's " \
           f"firmware or driver (VBIOS {VBIOS}; driver 550.54.15)" in reason
    assert "not a measurement mismatch" in reason and "confidential_computing.rim_dir" in reason
    assert "measres" not in reason


def test_rim_not_found_without_a_vbios_answer_still_names_the_cause(world):  # noqa: F811
    ctx = world({"gpu": {"code": 104}})  # the world's nvidia-smi prints nothing
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert "RIM not found" in str(err.value) and "(VBIOS " not in str(err.value)


def test_a_measurement_mismatch_is_not_called_rim_not_found(world):  # noqa: F811
    ctx = world({"gpu": {"measres_fail": [0]}})
    with pytest.raises(StepFailed) as err:
        gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert "RIM not found" not in str(err.value) and "NVAT result 12" in str(err.value)


@pytest.mark.parametrize("version, warned", [("1.2.0", True), ("1.1.0", True),
                                             ("1.2.1", False), ("1.2.2", False),
                                             ("1.3.0", False), (None, False)])
def test_nvswitch_attestation_needs_nvattest_1_2_1(version, warned):
    said = gate.too_old_for_switches(version)
    assert (said is not None) is warned
    if warned:
        assert f"nvattest {version}" in said and "nvattest 1.2.1" in said


def test_an_old_nvattest_attesting_switches_warns_naming_both_versions(world):  # noqa: F811
    plan = _ppcie_plan()
    plan["version"] = "1.2.0"
    ctx = world(plan, gpus=8, switches=4)
    gate.attest_before_ready(ctx, "not-ready", guest="TDX", ppcie=True)
    assert [w for w in ctx.status.warnings if "nvattest 1.2.0" in w and "1.2.1" in w]


def test_no_warning_for_switches_with_a_current_nvattest(world):  # noqa: F811
    ctx = world(_ppcie_plan(), gpus=8, switches=4)
    gate.attest_before_ready(ctx, "not-ready", guest="TDX", ppcie=True)
    assert not [w for w in ctx.status.warnings if "1.2.1" in w]


# --- the stand-in answers as the real nvattest 1.2.2 did (nvattest.md, last section) -----------

def error_lines(stderr: str) -> list[str]:
    return [line.split("[error] ", 1)[1] for line in stderr.splitlines() if "[error] " in line]


def test_standin_no_gpu_is_500_exit_244_as_the_real_one(tmp_path):
    rc, out, _ = attest(tmp_path, {"gpu": {"code": 500}})
    import json

    assert rc == 244 and json.loads(out) == {"result_code": 500, "result_message":
                                             "NVML Initialization Failed", "claims": {},
                                             "detached_eat": {}}


def test_standin_cc_off_is_509_exit_253_with_the_real_error_lines(tmp_path):
    rc, out, err = attest(tmp_path, {"gpu": {"code": 509}})
    import json

    assert rc == 253 and json.loads(out) == {"claims": {}, "detached_eat": {}, "result_code": 509,
                                             "result_message": "GPU is neither in CC nor in "
                                                               "PPCIe mode"}
    assert error_lines(err) == ["GPU must be running in CC or PPCIe mode to collect evidence "
                                "through NVML", "Failed to collect GPU evidence",
                                "Error while performing device attestation"]


def test_standin_nvswitch_without_nscq_is_600_exit_88(tmp_path):
    rc, out, err = attest(tmp_path, {"nvswitch": {"code": 600}}, "nvswitch")
    import json

    assert rc == 88 and json.loads(out)["result_message"] == "NSCQ Initialization Failed"
    assert error_lines(err)[0] == "Failed to initialize NSCQ"


def test_standin_version_is_the_real_line_on_stderr(tmp_path):
    rc, out, err = nvattest(tmp_path, {}, "version")
    assert rc == 0 and out == "" and err.strip().endswith("nvattest 1.2.2 (Linux/x86_64)")
    assert NONCE  # the shared nonce of the verdict tests is 64 hex


# --- the CC step binds pass before -srs 1 (issue 37) -------------------------------------------

def _register(world_fixture, monkeypatch, register):
    from podvm_gpu.host import rtmr

    node = world_fixture.root / rtmr.RTMR3_PATH.lstrip("/")
    node.parent.mkdir(parents=True, exist_ok=True)
    node.write_bytes(bytes(48))
    monkeypatch.setattr(rtmr, "Register", lambda path: register)


def test_the_cc_step_binds_an_attested_pass(world, monkeypatch):  # noqa: F811
    from rtmr_fake import FakeRegister

    from podvm_gpu.steps.cc import step

    register = FakeRegister()
    _register(world, monkeypatch, register)
    ctx = world({"gpu": {"driver": "550.54.15"}})
    gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert step.bind_pass(ctx, "not-ready") == "; pass bound into RTMR3"
    assert ctx.status.binding["state"] == "bound" and register.writes == [(48, 0)]
    assert not [c for c in world.calls() if "-srs" in c]


def test_a_broken_binding_fails_the_step_and_sets_a_ready_state_back(world, monkeypatch):  # noqa: F811
    from rtmr_fake import FakeRegister

    from podvm_gpu.steps.cc import step

    _register(world, monkeypatch, FakeRegister(refuse=True))
    ctx = world({"gpu": {"driver": "550.54.15"}})
    gate.attest_before_ready(ctx, "ready", guest="TDX")
    with pytest.raises(StepFailed) as err:
        step.bind_pass(ctx, "ready")
    assert str(err.value).startswith("binding broken: extending")
    assert "set back to not-ready" in str(err.value)
    assert [c[1:] for c in world.calls() if c[0].endswith("nvidia-smi")] == [
        ["conf-compute", "-srs", "0"]]


def test_nothing_is_bound_without_an_attestation_that_passed(world, monkeypatch):  # noqa: F811
    from rtmr_fake import FakeRegister

    from podvm_gpu.steps.cc import step

    register = FakeRegister()
    _register(world, monkeypatch, register)
    ctx = world({"gpu": {"driver": "550.54.15"}}, attestation="off")
    gate.attest_before_ready(ctx, "not-ready", guest="TDX")
    assert step.bind_pass(ctx, "not-ready") == "" and ctx.status.binding is None
    assert register.writes == []
