"""The CC classification and decision (podvm_gpu/steps/cc/classify.py), from the real nvidia-smi's
answers (535.261.03 to 555.58.02, ../shared/nvidia-smi-real.md, quoted exactly here)."""

import pytest

from podvm_gpu.gpufacts import judge, smi
from podvm_gpu.steps.cc import classify

ON, OFF = (0, "CC status: ON\n"), (0, "CC status: OFF\n")
DEV_ON, DEV_OFF = (0, "DevTools Mode: ON\n"), (0, "DevTools Mode: OFF\n")
PROD, UNAVAILABLE = (0, "CC Environment: PRODUCTION\n"), (0, "CC Environment: UNAVAILABLE\n")
MGM_NONE, MGM_PPCIE = (0, "Multi-GPU Mode: None\n"), (0, "Multi-GPU Mode: Protected PCIe\n")
MGM_535 = (2, 'Option "-mgm" is not recognized.\n')
NOT_CAPABLE = (6, "No CC capable devices found.\n")
LOST_AFTER_HANDLE = (15, "NVML: Unable to get architecture: GPU is lost\nNo CC capable devices found.\n")
LOST_AT_HANDLE = (15, "Unable to determine the device handle for GPU0000:18:00.0: GPU is lost.  "
                      "Reboot the system to recover this GPU\n\n\n")
NO_DRIVER = (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running.\n\n")
TDX = "Intel TDX (/proc/cpuinfo flag tdx_guest)"
SNP = "AMD SEV-SNP (/proc/cpuinfo flag sev_snp)"


def finding(f=ON, d=DEV_OFF, e=PROD, mgm=MGM_NONE):
    return classify.from_smi({"-f": f, "-d": d, "-e": e, "-mgm": mgm})


def test_devtools_is_read_from_d_not_from_f():
    found = finding(f=ON, d=DEV_ON)
    assert (found.mode, found.devtools, found.label) == ("on", True, "devtools")
    verdict = classify.decide(found, None)
    assert verdict.outcome == classify.FAIL
    assert "DevTools Mode: ON" in verdict.reason and "allow_devtools" in verdict.fix


def test_devtools_fails_in_a_confidential_guest_and_is_allowed_only_by_its_key():
    assert classify.decide(finding(d=DEV_ON), TDX).outcome == classify.FAIL
    allowed = classify.decide(finding(d=DEV_ON), TDX, allow_devtools=True)
    assert allowed.outcome == classify.DEVTOOLS
    assert any("DevTools Mode: ON" in w for w in allowed.warnings)


def test_cc_on_is_confidential_on_535_without_mgm():
    found = finding(mgm=MGM_535)
    assert found.multi_gpu == judge.MGM_NOT_OFFERED and "-mgm" not in found.unreadable
    assert classify.decide(found, TDX).outcome == classify.CONFIDENTIAL


def test_protected_pcie_with_cc_off_is_confidential():
    found = finding(f=OFF, mgm=MGM_PPCIE)
    assert found.confidential and found.label == "ppcie"
    verdict = classify.decide(found, SNP)
    assert verdict.outcome == classify.CONFIDENTIAL and "Protected PCIe" in verdict.reason


@pytest.mark.parametrize("guest", [TDX, SNP])
def test_cc_off_in_a_confidential_guest_fails_naming_the_guest_the_mode_and_the_host(guest):
    verdict = classify.decide(finding(f=OFF), guest)
    assert verdict.outcome == classify.FAIL
    assert guest in verdict.reason and "CC status: OFF, Multi-GPU Mode: None" in verdict.reason
    assert "on the host" in verdict.fix and "allow_cc_off" in verdict.fix


def test_cc_off_in_a_confidential_guest_is_accepted_by_allow_cc_off_with_a_warning():
    verdict = classify.decide(finding(f=OFF), TDX, allow_cc_off=True)
    assert verdict.outcome == classify.SKIP and "allow_cc_off" in verdict.reason
    assert any(TDX in w for w in verdict.warnings)


def test_cc_off_on_a_regular_vm_is_skipped_without_a_warning():
    verdict = classify.decide(finding(f=OFF), None)
    assert (verdict.outcome, verdict.reason, verdict.warnings) == (classify.SKIP, "CC mode is off", [])


def test_535_off_with_unavailable_environment_says_cc_off_is_not_proven():
    found = finding(f=OFF, d=DEV_OFF, e=UNAVAILABLE, mgm=MGM_535)
    assert found.off_unproven
    regular = classify.decide(found, None)
    assert regular.outcome == classify.SKIP and "not proven" in regular.reason
    assert any("not proven" in w for w in regular.warnings)
    closed = classify.decide(found, TDX)
    assert closed.outcome == classify.FAIL and "not proven" in closed.reason


def test_550_off_with_unavailable_environment_means_what_it_says():
    found = finding(f=OFF, e=UNAVAILABLE, mgm=MGM_NONE)  # 550 prints failures as failures
    assert not found.off_unproven
    assert classify.decide(found, None).reason == "CC mode is off"


@pytest.mark.parametrize("answer", [LOST_AFTER_HANDLE, LOST_AT_HANDLE])
def test_a_lost_gpu_is_judged_by_exit_15_before_its_no_cc_capable_words(answer):
    found = classify.from_smi({"-f": answer})
    assert found.lost and found.capable
    verdict = classify.decide(found, None)
    assert verdict.outcome == classify.FAIL and "GPU is lost" in verdict.reason


def test_exit_6_no_cc_capable_is_not_capable_skipped_on_a_regular_vm_failed_in_a_guest():
    found = finding(f=NOT_CAPABLE, d=NOT_CAPABLE, e=NOT_CAPABLE, mgm=NOT_CAPABLE)
    assert not found.capable and found.label == "unsupported"
    assert classify.decide(found, None).outcome == classify.SKIP
    assert classify.decide(found, SNP).outcome == classify.FAIL


def test_exit_9_is_the_driver_not_answering():
    verdict = classify.decide(classify.from_smi({"-f": NO_DRIVER}), None)
    assert verdict.outcome == classify.FAIL and "communicate with the NVIDIA driver" in verdict.reason


@pytest.mark.parametrize("query, answer", [
    ("-d", (3, "Failed to display Conf. Compute DevTools Mode: Not Supported\n")),
    ("-e", (255, "Failed to display Conf. Compute Environment: Unknown Error\n")),
])
def test_an_unreadable_query_on_a_confidential_gpu_fails_closed_in_a_guest_and_warns_elsewhere(
        query, answer):
    found = finding(**{{"-d": "d", "-e": "e"}[query]: answer})
    assert query in found.unreadable and found.unreadable[query].startswith(f"exit {answer[0]}")
    assert classify.decide(found, TDX).outcome == classify.FAIL
    regular = classify.decide(found, None)
    assert regular.outcome == classify.CONFIDENTIAL and regular.warnings


def test_550_failed_f_query_is_unknown_never_off():
    found = finding(f=(255, "Failed to display Conf. Compute CC feature status: Unknown Error\n"))
    assert found.mode is None
    assert classify.decide(found, TDX).outcome == classify.FAIL
    assert classify.decide(found, None).outcome == classify.SKIP


def test_an_unknown_cc_status_word_fails_closed():
    verdict = classify.decide(finding(f=(0, "CC status: PENDING\n")), None)
    assert verdict.outcome == classify.FAIL and "not read as off" in verdict.reason


def test_an_unreadable_mgm_with_cc_off_does_not_rule_out_protected_pcie():
    found = finding(f=OFF, mgm=(255, "Failed to display Conf. Compute Multi-GPU Mode: Unknown Error\n"))
    assert found.multi_gpu is None and not found.confidential
    verdict = classify.decide(found, None)
    assert verdict.outcome == classify.SKIP and "Protected PCIe is not ruled out" in verdict.reason


def test_long_options_answer_as_the_short_ones():
    assert smi.parse_multi_gpu("Multi-GPU Mode: Protected PCIe\n") == judge.MGM_PPCIE
    assert classify.smi_unrecognized_option('Option "--get-multigpu-mode" is not recognized.\n') \
        == "--get-multigpu-mode"


def test_the_finding_goes_into_the_status_as_the_schema_says():
    from schemas import assert_status_conforms

    from podvm_gpu.model import Status, Step, StepResult

    status = Status()
    status.steps.append(Step("detect"))
    status.steps[0].result = StepResult.OK
    status.confidential_computing = finding(f=OFF, mgm=MGM_PPCIE)
    doc = status.to_dict()
    assert doc["confidential_computing"]["mode"] == "ppcie"
    assert doc["confidential_computing"]["confidential"] is True
    assert_status_conforms(doc)
    status.confidential_computing = classify.from_smi({"-f": LOST_AT_HANDLE})
    assert_status_conforms(status.to_dict())


# --- nvidia-smi conf-compute --------------------------------------------------------------------

@pytest.mark.parametrize("text, mode", [
    ("CC status: ON\n", "on"),
    ("CC status: OFF\n", "off"),
    ("CC status : On\n", "on"),
    ("CC status: DEVTOOLS\n", "devtools"),
])
def test_parse_cc_mode(text, mode):
    assert smi.parse_cc_mode(text) == mode


def test_parse_cc_mode_is_none_without_the_label():
    assert smi.parse_cc_mode("No CC capable devices found\n") is None


@pytest.mark.parametrize("text", [
    "Confidential Compute GPUs Ready state: not-ready\n",
    "Confidential Compute GPUs Ready state: NOT_READY\n",
    "Confidential Compute GPUs Ready state: not ready\n",
])
def test_not_ready_never_reads_as_ready(text):
    assert smi.parse_ready_state(text) == "not-ready"


def test_ready_reads_as_ready():
    assert smi.parse_ready_state("Confidential Compute GPUs Ready state: ready\n") == "ready"
    assert smi.parse_ready_state("Confidential Compute GPUs Ready state: READY\n") == "ready"


def test_unknown_ready_state_is_returned_as_it_is():
    assert smi.parse_ready_state("Confidential Compute GPUs Ready state: pending\n") == "pending"
    assert smi.parse_ready_state("Unknown Error\n") is None


@pytest.mark.parametrize("words", ["No CC capable devices found.\n",  # the real 535-555
                                   "No CC capable devices found\n"])  # field reports (C22)
def test_not_capable_real_program_with_period_and_field_report_without(words):
    found = classify.from_smi({q: (6, words) for q in classify.QUERIES})
    assert not found.capable and not found.unreadable


def test_the_invented_cc_status_devtools_is_an_unknown_word_that_fails_closed():
    """No real nvidia-smi prints ``CC status: DEVTOOLS`` (the project's old S30/S31 did)."""
    verdict = classify.decide(finding(f=(0, "CC status: DEVTOOLS\n")), None, allow_devtools=True)
    assert verdict.outcome == classify.FAIL and "not read as off" in verdict.reason
