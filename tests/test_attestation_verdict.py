"""The nvattest stand-in (tests/nvattest_standin.py) against ../shared/nvattest.md, and the agent's
own verdict (podvm_gpu/steps/cc/attest/verdict.py) over what it prints, one test per rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podvm_gpu.steps.cc.attest import verdict as v

STANDIN = Path(__file__).resolve().parent / "nvattest_standin.py"
NONCE = "5f1c0e7a9d3b2468ace013579bdf2468ace013579bdf2468ace013579bdf2468"
DRIVER = "580.159.03"


def nvattest(tmp_path, plan: dict, *args: str, timeout: float = 20):
    """Run the stand-in with ``plan``; (exit status, stdout, stderr)."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    env = {**os.environ, "NVATTEST_STANDIN_PLAN": str(plan_file)}
    done = subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def attest(tmp_path, plan: dict, device: str = "gpu", nonce: str = NONCE, *extra: str):
    return nvattest(tmp_path, plan, "attest", "--device", device, "--verifier", "local",
                    "--nonce", nonce, "--format", "json", *extra)


def judged(tmp_path, plan, devices=1, device="gpu", rp=False, driver=DRIVER, *extra):
    rc, out, err = attest(tmp_path, plan, device, NONCE, *extra)
    return v.judge(rc, out, err, device, v.Expect(NONCE, devices, driver, rp_policy=rp))


# --- the stand-in is true to nvattest.md ------------------------------------------------------

def test_standin_success_is_sorted_four_space_json_with_the_nonce_echoed_lowercase(tmp_path):
    rc, out, err = attest(tmp_path, {"gpus": 2}, "gpu", "0x" + NONCE.upper())
    doc = json.loads(out)
    assert rc == 0 and doc["result_code"] == 0 and doc["result_message"] == "Ok"
    assert out == json.dumps(doc, indent=4, sort_keys=True) + "\n"
    assert [c["eat_nonce"] for c in doc["claims"]] == [NONCE, NONCE]
    assert len(doc["claims"][0]) == 29  # nvattest.md 5.2: 29 keys without the PDI key
    assert doc["detached_eat"][0][0] == "JWT" and set(doc["detached_eat"][1]) == {"GPU-0", "GPU-1"}
    assert "Attesting GPUs" in err


@pytest.mark.parametrize("code, exit_status", [(2, 2), (509, 253), (500, 244), (600, 88),
                                               (104, 104)])
def test_standin_errors_print_empty_objects_and_exit_the_code_mod_256(tmp_path, code, exit_status):
    rc, out, err = attest(tmp_path, {"gpu": {"code": code}})
    doc = json.loads(out)
    assert rc == exit_status and doc["result_code"] == code
    assert doc["claims"] == {} and doc["detached_eat"] == {}
    assert "[error]" in err


def test_standin_measurement_mismatch_is_12_with_claims_and_null_secboot(tmp_path):
    rc, out, _ = attest(tmp_path, {"gpu": {"measres_fail": [0]}})
    doc = json.loads(out)
    assert rc == 12 and doc["claims"][0]["measres"] == "fail"
    assert doc["claims"][0]["secboot"] is None and doc["claims"][0]["dbgstat"] is None


def test_standin_rp_policy_turns_12_into_0_unless_it_rejects(tmp_path):
    policy = tmp_path / "p.rego"
    policy.write_text("package policy\n")
    rc, out, _ = attest(tmp_path, {"gpu": {"measres_fail": [0]}}, "gpu", NONCE,
                        "--relying-party-policy", str(policy))
    assert rc == 0 and json.loads(out)["result_code"] == 0
    rc, out, _ = attest(tmp_path, {"gpu": {"rp_rejects": True}}, "gpu", NONCE,
                        "--relying-party-policy", str(policy))
    assert rc == 11 and isinstance(json.loads(out)["claims"], list)


def test_standin_usage_errors_print_no_json(tmp_path):
    rc, out, err = nvattest(tmp_path, {}, "attest", "--device", "foo", "--format", "json")
    assert (rc, out) == (105, "") and "--device: foo not in {gpu,nvswitch}" in err
    rc, out, err = nvattest(tmp_path, {}, "attest", "--frobnicate")
    assert (rc, out) == (109, "")
    rc, out, err = nvattest(tmp_path, {}, "attest", "--nonce")
    assert rc == 114 and out == ""


def test_standin_bad_or_short_nonce_is_4(tmp_path):
    rc, out, _ = attest(tmp_path, {}, "gpu", "abcd")
    assert rc == 4 and json.loads(out)["result_message"] == "Bad Argument"


def test_standin_text_format_is_the_default_and_prints_nothing_on_stdout(tmp_path):
    rc, out, err = nvattest(tmp_path, {}, "attest", "--nonce", NONCE)
    assert rc == 0 and out == "" and "GPU attestation was successful" in err


def test_standin_version_logs_to_stderr(tmp_path):
    rc, out, err = nvattest(tmp_path, {}, "version")
    assert rc == 0 and out == "" and err.strip() == "nvattest 1.2.2 (Linux/x86_64)"


def test_standin_hangs_until_killed(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        attest_plan = {"gpu": {"hang": True}}
        nvattest(tmp_path, attest_plan, "attest", "--nonce", NONCE, "--format", "json",
                 timeout=1.5)


def test_standin_nvswitch_claims_carry_the_pdis(tmp_path):
    rc, out, _ = attest(tmp_path, {"nvswitches": [{"pdi": "0A", "gpu_pdis": ["1", "2"]}]},
                        "nvswitch")
    claim = json.loads(out)["claims"][0]
    assert rc == 0 and claim["x-nvidia-device-type"] == "nvswitch"
    assert claim["x-nvidia-version"] == "3.0" and "oemid" not in claim
    assert claim["x-nvidia-switch-pdi"] == "0A"


# --- the agent's verdict, one rule each --------------------------------------------------------

def test_a_passing_run_passes(tmp_path):
    verdict = judged(tmp_path, {"gpus": 2}, devices=2)
    assert verdict.ok and verdict.failure == "" and len(verdict.claims) == 2


def test_nvat_code_12_fails_naming_the_code_message_and_first_failed_claim(tmp_path):
    verdict = judged(tmp_path, {"gpus": 2, "gpu": {"measres_fail": [1]}}, devices=2)
    assert not verdict.ok and verdict.code == 12
    assert verdict.failure == ("NVAT result 12 (Overall Attestation Result is False): gpu 1: "
                               "measres 'fail' (measurement index 9 Firmware)")


def test_rp_mismatch_11_fails(tmp_path):
    policy = tmp_path / "p.rego"
    policy.write_text("package policy\n")
    verdict = judged(tmp_path, {"gpu": {"rp_rejects": True}}, 1, "gpu", True, DRIVER,
                     "--relying-party-policy", str(policy))
    assert not verdict.ok and verdict.code == 11
    assert verdict.failure.startswith("NVAT result 11 (Relying Party Policy Mismatch)")


def test_offline_2_without_claims_names_nvattests_first_error_line(tmp_path):
    verdict = judged(tmp_path, {"gpu": {"code": 2}})
    assert not verdict.ok and verdict.code == 2 and verdict.claims == []
    assert "Final libcurl error" in verdict.failure and "Internal Error" in verdict.failure


def test_gpu_not_in_cc_509(tmp_path):
    verdict = judged(tmp_path, {"gpu": {"code": 509}})
    assert not verdict.ok and "509 (GPU is neither in CC nor in PPCIe mode)" in verdict.failure


def test_a_foreign_nonce_fails_even_with_nvat_ok(tmp_path):
    verdict = judged(tmp_path, {"gpu": {"nonce": "foreign"}})
    assert not verdict.ok and verdict.code == 0
    assert "gpu 0: eat_nonce" in verdict.failure and "not the nonce this boot passed" in verdict.failure


def test_one_claim_for_two_gpus_fails(tmp_path):
    verdict = judged(tmp_path, {"gpus": 2, "gpu": {"claims": 1}}, devices=2)
    assert not verdict.ok and "1 gpu claim(s) for 2 gpu(s) on PCI" in verdict.failure


def test_more_claims_than_gpus_on_pci_fails(tmp_path):
    assert not judged(tmp_path, {"gpus": 2}, devices=1).ok


def test_a_revoked_cert_chain_fails_with_its_reason(tmp_path):
    plan = {"gpu": {"code": 0, "cert": {"0": {"x-nvidia-cert-ocsp-status": "revoked",
                                             "x-nvidia-cert-revocation-reason": "keyCompromise"}}}}
    verdict = judged(tmp_path, plan)
    assert not verdict.ok and 'x-nvidia-cert-ocsp-status "revoked" (keyCompromise)' in verdict.failure


def test_a_relying_party_policy_that_accepts_a_revoked_chain_does_not_pass_the_agent(tmp_path):
    policy = tmp_path / "p.rego"
    policy.write_text("package policy\n")
    plan = {"gpu": {"cert": {"0": {"x-nvidia-cert-ocsp-status": "revoked"}}}}
    verdict = judged(tmp_path, plan, 1, "gpu", True, DRIVER, "--relying-party-policy", str(policy))
    assert verdict.code == 0 and not verdict.ok  # NVAT said 0; the agent's rules stay


def test_a_cached_ocsp_response_passes_only_under_a_relying_party_policy_with_a_warning(tmp_path):
    policy = tmp_path / "p.rego"
    policy.write_text("package policy\n")
    plan = {"gpu": {"cert": {"0": {"x-nvidia-cert-ocsp-nonce-matches": False}}}}
    rc, out, err = attest(tmp_path, plan, "gpu", NONCE, "--relying-party-policy", str(policy))
    assert v.judge(rc, out, err, "gpu", v.Expect(NONCE, 1, DRIVER, rp_policy=True)).ok
    without = v.judge(rc, out, err, "gpu", v.Expect(NONCE, 1, DRIVER, rp_policy=False))
    assert not without.ok and "cached OCSP" in without.failure
    assert v.judge(rc, out, err, "gpu", v.Expect(NONCE, 1, DRIVER, rp_policy=True)).warnings


def test_the_driver_version_must_be_the_loaded_modules(tmp_path):
    verdict = judged(tmp_path, {"gpu": {"driver": "570.1.2"}})
    assert not verdict.ok and "driver version '570.1.2' in the claims, '580.159.03' loaded" \
        in verdict.failure


def test_claims_4_0_with_unknown_keys_pass(tmp_path):
    assert judged(tmp_path, {"gpu": {"claims_version": "4.0"}}).ok


def test_an_unknown_claims_version_fails_closed():
    claim = json.loads(json.dumps(_claim()))
    claim["x-nvidia-gpu-claims-version"] = "9.0"
    assert "claims version '9.0' unknown" in v.claim_failure(claim, "gpu", 0, v.Expect(NONCE, 1), [])


def test_a_false_boolean_claim_fails():
    claim = _claim()
    claim["x-nvidia-gpu-attestation-report-signature-verified"] = False
    assert v.claim_failure(claim, "gpu", 0, v.Expect(NONCE, 1), []) == \
        "gpu 0: x-nvidia-gpu-attestation-report-signature-verified false"


def test_exit_status_must_match_the_code(tmp_path):
    rc, out, err = attest(tmp_path, {})
    verdict = v.judge(1, out, err, "gpu", v.Expect(NONCE, 1, DRIVER))
    assert not verdict.ok and "nvattest exited 1" in verdict.failure


def test_no_json_is_a_failure_naming_stderr(tmp_path):
    rc, out, err = nvattest(tmp_path, {}, "attest", "--device", "foo", "--format", "json")
    verdict = v.judge(rc, out, err, "gpu", v.Expect(NONCE, 1))
    assert not verdict.ok and verdict.code is None
    assert "printed no JSON result (exit 105)" in verdict.failure


def test_claims_as_an_object_with_code_0_fails():
    out = json.dumps({"claims": {}, "detached_eat": {}, "result_code": 0, "result_message": "Ok"})
    assert not v.judge(0, out, "", "gpu", v.Expect(NONCE, 1)).ok


# --- Protected PCIe topology (nvtrust validate_topology.py, nvattest.md 9) --------------------

SW = [f"{i:016X}" for i in range(1, 5)]
GP = [f"{i:016X}" for i in range(16, 24)]


def _ppcie(gpus=8, switches=4):
    gpu_claims = [{"x-nvidia-gpu-switch-pdis": list(SW[:switches])} for _ in range(gpus)]
    switch_claims = [{"x-nvidia-switch-pdi": SW[i], "x-nvidia-switch-gpu-pdis": list(GP[:gpus])}
                     for i in range(switches)]
    return gpu_claims, switch_claims


def test_ppcie_topology_right():
    assert v.topology_failure(*_ppcie()) is None


def test_ppcie_a_gpu_naming_other_switches_fails():
    gpus, switches = _ppcie()
    gpus[3]["x-nvidia-gpu-switch-pdis"] = SW[:3] + ["00000000000000FF"]
    assert v.topology_failure(gpus, switches) == "gpu 3: x-nvidia-gpu-switch-pdis differ from gpu 0's"


def test_ppcie_a_switch_not_named_by_the_gpus_fails():
    gpus, switches = _ppcie()
    switches[2]["x-nvidia-switch-pdi"] = "00000000000000FF"
    assert "nvswitch 2: x-nvidia-switch-pdi" in v.topology_failure(gpus, switches)


def test_ppcie_a_switch_seeing_seven_of_eight_gpus_fails():
    gpus, switches = _ppcie()
    switches[1]["x-nvidia-switch-gpu-pdis"] = GP[:7]
    assert "nvswitch 1: x-nvidia-switch-gpu-pdis name 7 GPU(s), 8 attested" == \
        v.topology_failure(gpus, switches)


def test_ppcie_fewer_switches_attested_than_the_gpus_name_fails():
    gpus, switches = _ppcie()
    assert "4 switch PDI(s), 3 NVSwitch(es)" in v.topology_failure(gpus, switches[:3])


def test_ppcie_gpu_claims_without_pdis_fail():
    gpus, switches = _ppcie()
    del gpus[0]["x-nvidia-gpu-switch-pdis"]
    assert "gpu 0: no x-nvidia-gpu-switch-pdis" in v.topology_failure(gpus, switches)


def test_device_records_and_claims_digest(tmp_path):
    verdict = judged(tmp_path, {"gpus": [{"ueid": "42", "vbios": "96.00.AA.00.01"}]})
    assert v.device_records(verdict.claims) == [{
        "type": "gpu", "index": 0, "hwmodel": "GH100 A01 GSP BROM", "ueid": "42",
        "driver_version": DRIVER, "vbios_version": "96.00.AA.00.01", "measres": "success"}]
    digest = v.claims_sha256(verdict.claims)
    assert len(digest) == 64 and digest != v.claims_sha256([])


def _claim() -> dict:
    sys.path.insert(0, str(STANDIN.parent))
    import nvattest_standin

    return nvattest_standin.gpu_claim(0, {}, NONCE, {})
