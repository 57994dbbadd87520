"""gpufacts/finding.py: the one finding type every judge of GPU facts returns (issue 44 item 1)."""

import pytest

from podvm_gpu.gpufacts import finding as F
from podvm_gpu.gpufacts.words import FAIL, OK, WARN


def test_a_finding_normalises_its_gpu_to_nvmls_form_so_sources_compare_equal():
    xid = F.finding(FAIL, "Xid 79", gpu="0000:01:00", kind="xid", code=79)
    smi = F.finding(FAIL, "lost", gpu="00000000:01:00.0")
    assert xid.gpu == smi.gpu == "00000000:01:00.0"
    assert xid.fatal and xid.code == 79 and xid.action == F.NONE


def test_a_reset_needed_fails_unless_health_reset_pending_warns_then_warns():
    failing = F.reset_needed("GPU 00000000:01:00.0: a row remap is pending", "0000:01:00.0", False)
    warning = F.reset_needed("GPU 00000000:01:00.0: a row remap is pending", "0000:01:00.0", True)
    assert (failing.level, failing.action, failing.fatal) == (FAIL, F.RESET, True)
    assert (warning.level, warning.action, warning.fatal) == (WARN, F.RESET, False)


def test_the_worst_level_of_findings_is_on_the_one_scale():
    assert F.worst([]) == OK
    assert F.worst([F.finding(WARN, "a"), F.finding(FAIL, "b"), F.finding(OK, "c")]) == FAIL


@pytest.mark.parametrize("level, action", [("fatal", F.NONE), (FAIL, "reboot")])
def test_a_level_or_action_off_the_scale_is_refused(level, action):
    with pytest.raises(ValueError):
        F.finding(level, "x", action=action)
