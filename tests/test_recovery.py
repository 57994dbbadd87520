"""Reset status and recovery action (podvm_gpu/gpufacts/health.py, steps/cdi/recovery.py;
issue 28): each value's verdict, the Debian nvidia-smi's refusal of ``gpu_recovery_action`` as
"not offered", and the health gate that carries them (boot-level: scenarios S101-S104)."""

from __future__ import annotations

import pytest

from podvm_gpu.gpufacts import finding as F
from podvm_gpu.gpufacts import health, smi
from podvm_gpu.host.proc import Completed
from podvm_gpu.steps.cdi import recovery

# Every Debian nvidia-smi, 535.261.03 to 555.58.02 (../shared/nvidia-smi-real.md), exit 2
DEBIAN_REFUSAL = 'Field "gpu_recovery_action" is not a valid field to query.\n\n'


class Runner:
    """Answers each argv with (rc, stdout); records what it ran."""

    def __init__(self, answers):
        self.answers, self.ran = answers, []

    def run(self, argv, check=False, timeout=None):
        self.ran.append(argv)
        rc, out = self.answers[tuple(argv)]
        return Completed(argv=argv, returncode=rc, stdout=out, stderr="", duration_s=0.01)


def answers(reset=(0, "00000000:18:00.0, No, No\n"), action=(2, DEBIAN_REFUSAL)):
    return {tuple(smi.reset_argv()): reset, tuple(smi.action_argv()): action}


class Found:
    """The findings of gpufacts/health.py's read_recovery, by what the gate does with each."""

    def __init__(self, findings):
        self.fatal = [f.what for f in findings if f.action == F.REPLACE]
        self.reset = [f.what for f in findings if f.action == F.RESET]
        self.warn = health.said(findings, "note")
        self.unread = health.said(findings, "unread")
        self.read = health.said(findings, *health.READ)


def read(**kw) -> Found:
    return Found(health.read_recovery(health.ask, Runner(answers(**kw)), 5, False))


def test_the_queries_are_their_own_never_fields_of_the_ecc_query():
    assert smi.reset_argv() == [
        "nvidia-smi", "--query-gpu=pci.bus_id,reset_status.reset_required,"
        "reset_status.drain_and_reset_recommended", "--format=csv,noheader"]
    assert smi.action_argv() == ["nvidia-smi", "--query-gpu=pci.bus_id,gpu_recovery_action",
                                      "--format=csv,noheader"]
    assert not set(smi.ECC_FIELDS) & {"gpu_recovery_action", "reset_status.reset_required"}


def test_debian_nvidia_smis_refusal_of_the_field_is_not_offered_and_no_warning():
    found = read()
    assert found.unread == [] and found.fatal == [] and found.reset == [] and found.warn == []
    assert found.read == ["00000000:18:00.0 reset required No, drain and reset No",
                          "recovery action not offered by this nvidia-smi"]


def test_another_failure_of_the_action_query_is_unread_with_its_words():
    found = read(action=(1, "Unknown Error\n"))
    assert len(found.unread) == 1
    assert found.unread[0].startswith("recovery action not read (nvidia-smi --query-gpu=")
    assert "Unknown Error" in found.unread[0]


def test_a_lost_gpu_is_never_an_unread_warning():
    with pytest.raises(health.Broken, match="GPU is lost"):
        read(action=(15, "Unable to determine the device handle for GPU0000:18:00.0: GPU is "
                         "lost.  Reboot the system to recover this GPU\n"))


@pytest.mark.parametrize("value, where", [
    ("None", "read"), ("0", "read"),
    ("GPU Reset", "reset"), ("1", "reset"), ("Reset", "reset"),
    ("Drain and Reset", "reset"), ("4", "reset"),
    ("Node Reboot", "fatal"), ("2", "fatal"),
    ("Drain P2P", "warn"), ("3", "warn"),
])
def test_each_recovery_action_has_its_verdict(value, where):
    found = read(action=(0, f"00000000:18:00.0, {value}\n"))
    lists = {"fatal": found.fatal, "reset": found.reset, "warn": found.warn}
    for name, got in lists.items():
        assert bool(got) == (name == where), (name, got)
    if where == "reset":
        assert found.reset[0].endswith("GPU reset needed")


def test_an_action_not_understood_and_na_are_not_verdicts():
    found = read(action=(0, "00000000:18:00.0, Quarantine\n00000000:29:00.0, [N/A]\n"))
    assert found.unread == ["GPU 00000000:18:00.0: recovery action 'Quarantine' not understood"]
    assert "00000000:29:00.0 recovery action N/A" in found.read
    assert not (found.fatal or found.reset or found.warn)


@pytest.mark.parametrize("row, resets", [
    ("Yes, No", 1), ("No, Yes", 1), ("Yes, Yes", 2), ("No, No", 0), ("[N/A], [N/A]", 0),
    ("True, False", 1),
])
def test_reset_required_and_drain_recommended_each_need_a_reset(row, resets):
    found = read(reset=(0, f"00000000:18:00.0, {row}\n"))
    assert len(found.reset) == resets
    assert all(line.endswith("GPU reset needed") for line in found.reset)


def test_an_unanswered_reset_query_is_unread_not_a_failure():
    found = read(reset=(2, 'Field "reset_status.reset_required" is not a valid field to query.\n\n'))
    assert found.unread and found.unread[0].startswith("reset status not read")
    assert not (found.fatal or found.reset)


# --- issue 33: what nvidia-smi 580 answers (tests/data/real/h200-580) ---------------------------

REFUSAL_580 = 'Field "reset_status.reset_required" is not a valid field to query.\n\n'


def test_580s_refused_reset_status_is_no_warning_when_the_recovery_action_answers():
    """A real H200 on 580 refused the reset status (deprecated since 570) and answered the
    recovery action: every boot and check warned "reset status not read" before issue 33."""
    found = read(reset=(2, REFUSAL_580), action=(0, "00000000:00:06.0, None\n"))

    assert found.unread == [] and not (found.fatal or found.reset or found.warn)
    assert found.read == ["reset status not offered by this nvidia-smi (deprecated since 570: "
                          "the recovery action says it)", "00000000:00:06.0 recovery action None"]


def test_a_refused_reset_status_still_warns_when_the_recovery_action_does_not_answer():
    found = read(reset=(2, REFUSAL_580), action=(0, "garbage\n"))

    assert [line.split(" (")[0] for line in found.unread] == ["reset status not read",
                                                              "recovery action not read"]


@pytest.mark.parametrize("value, where", [
    ("Recover IMEX Domain", "warn"), ("5", "warn"), ("recover imex domain", "warn"),
    ("Bus Reset", "reset"), ("6", "reset"),
    ("System Reboot", "fatal"), ("7", "fatal"), ("SYSTEM REBOOT", "fatal"),
    ("GPU RESET", "reset"), ("node reboot", "fatal"), ("Reboot", "fatal"),
    ("1, Reset", "reset"),  # NVIDIA/DCGM#263: a real nvidia-smi printed the number and the word
])
def test_the_recovery_actions_5_to_7_and_every_label_in_any_case_have_their_verdict(value, where):
    """Actions 5-7 were known to the exporter but not to the boot (issue 33)."""
    found = read(action=(0, f"00000000:18:00.0, {value}\n"))
    lists = {"fatal": found.fatal, "reset": found.reset, "warn": found.warn}

    assert found.unread == []
    for name, got in lists.items():
        assert bool(got) == (name == where), (name, got)


def test_a_word_no_table_knows_is_a_warning_that_says_it_verbatim():
    found = read(action=(0, "00000000:18:00.0, Recalibrate Lasers\n"))

    assert found.unread == ["GPU 00000000:18:00.0: recovery action 'Recalibrate Lasers' not "
                            "understood"]


class Facts:
    """check's facts, as much of them as the recovery-action row reads."""

    class config:
        class health:
            reset_pending_warns = False

    def __init__(self, runner):
        self.runner = runner
        runner.timeouts = {}

    def not_reached(self, step):
        return None

    def needs_driver(self, name):
        return None


def test_the_check_row_shows_what_it_read_beside_what_was_refused():
    """Issue 35 item 4: on the real H200 (580) the row showed only that the reset status was
    refused, not that the recovery action was read as None; its hint was only a file name."""
    runner = Runner(answers(reset=(2, REFUSAL_580), action=(0, "00000000:00:06.0, None\n")))
    row = recovery.check_row(Facts(runner))

    assert row.result == "pass", row
    assert "00000000:00:06.0 recovery action None" in row.detail
    assert "reset status not offered" in row.detail


def test_a_warning_row_names_what_it_read_and_the_command_to_run():
    runner = Runner(answers(reset=(1, "Unknown Error\n"), action=(0, "00000000:00:06.0, None\n")))
    row = recovery.check_row(Facts(runner))

    assert row.result == "warn"
    assert row.detail.startswith("reset status not read (")
    assert row.detail.endswith("; read: 00000000:00:06.0 recovery action None")
    assert "nvidia-smi --query-gpu=pci.bus_id,gpu_recovery_action --format=csv" in row.hint
