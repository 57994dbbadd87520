"""What a real H200 with driver 580.159.04 answered (tests/data/real/h200-580, issue 33): every
nvidia-smi command line of the capture that the agent runs goes through the nvidia-smi back end
(podvm_gpu/gpufacts/smi.py) and the decisions that boot and check make on it. The machine ended
``ready``; here its answers must give no warning of their own (the capture's status.json has the
two warnings of the code before issue 33: the missing modprobe's, which stays, and the refused
reset status, which is gone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from smi_facts import parse_fabric, smi_facts

from podvm_gpu.gpufacts import health, judge, smi, words
from podvm_gpu.host.proc import Completed
from podvm_gpu.steps.cc import classify
from podvm_gpu.steps.cc.query import answers as cc_answers
from podvm_gpu.steps.fabric.parse import health_summary

REAL = Path(__file__).resolve().parent / "data" / "real" / "h200-580"
CAPTURE = json.loads((REAL / "nvidia-smi-capture.json").read_text())
BY_ARGV = {tuple(entry["argv"]): entry for entry in CAPTURE}
BUS = "00000000:00:06.0"


class Replay:
    """A runner answering each argv with what the real nvidia-smi printed for it."""

    timeouts: dict = {}

    def __init__(self):
        self.ran = []

    def run(self, argv, check=False, timeout=None):
        self.ran.append(list(argv))
        entry = BY_ARGV[tuple(argv)]
        return Completed(argv=list(argv), returncode=entry["exit"], stdout=entry["stdout"],
                         stderr=entry["stderr"], duration_s=entry["seconds"])


# every command line the agent's nvidia-smi back end builds that reads (never -srs)
AGENT_ARGVS = [smi.fabric_argv(), smi.remap_argv(), smi.ecc_argv(), smi.reset_argv(),
               smi.action_argv(), smi.mig_mode_argv(), smi.mig_list_argv(), smi.full_query_argv(),
               *(smi.conf_compute_argv(q) for q in (*classify.QUERIES, "-grs"))]


def test_the_capture_holds_every_reading_command_line_of_the_agent_but_the_health_summary():
    """The capture was taken at main dd13d84, before 580's health summary was asked: its one
    argv the capture lacks (the --help-query-gpu text lists the field, so 580 answers it)."""
    missing = [argv for argv in AGENT_ARGVS if tuple(argv) not in BY_ARGV]

    assert missing == []
    assert tuple(smi.fabric_health_argv()) not in BY_ARGV
    assert '"fabric.health.summary"' in BY_ARGV[("nvidia-smi", "--help-query-gpu")]["stdout"]


def test_the_real_580_answers_every_query_on_stdout_and_refuses_only_the_reset_status():
    refused = [entry["argv"] for entry in CAPTURE if entry["argv"] in AGENT_ARGVS and entry["exit"]]

    assert refused == [smi.reset_argv()]
    assert words.NOT_A_FIELD in BY_ARGV[tuple(smi.reset_argv())]["stdout"]
    assert all(entry["stderr"] == "" for entry in CAPTURE if entry["argv"] in AGENT_ARGVS)


def test_the_health_gate_reads_580_with_no_warning():
    runner = Replay()
    rows, why = health.ask(runner, smi.remap_argv(), len(smi.REMAP_FIELDS), 5)
    found = health.judge_remapper(rows, False)
    rows, why = health.ask(runner, smi.ecc_argv(), len(smi.ECC_FIELDS), 5)
    found += health.judge_ecc(rows, False)
    recovery = health.read_recovery(health.ask, runner, 5, False)

    assert [f.level for f in found + recovery] == [words.OK] * len(found + recovery)
    assert [f.what for f in found] == [f"{BUS} remap pending No, failure No",  # 580's words
                                       f"{BUS} volatile uncorrectable ECC 0, retirement pending [N/A]"]
    assert f"{BUS} recovery action None" in health.said(recovery, "read")
    assert any(line.startswith("reset status not offered") for line in health.said(recovery, "not-offered"))


def test_the_recovery_action_580_prints_is_in_the_one_table():
    value = BY_ARGV[tuple(smi.action_argv())]["stdout"].split(",")[1].strip()
    action = judge.action_of(value)

    assert (action.number, action.kind) == (0, judge.FINE)
    assert judge.verdict_of(action.kind, False) == words.OK


def test_a_lone_580_gpu_reports_no_fabric_and_full_q_has_none_either():
    states = smi.parse_fabric_rows(BY_ARGV[tuple(smi.fabric_argv())]["stdout"])

    assert [tuple(s) for s in states] == [(BUS, "N/A", "N/A")]
    assert not any(s.supported for s in states)
    assert not judge.fabric_state(states, ["0000:00:06.0"])[2]  # not ready
    full = BY_ARGV[tuple(smi.full_query_argv())]["stdout"]
    assert [tuple(s) for s in parse_fabric(full)] == [(BUS, "N/A", "N/A")]
    assert smi.parse_cliques(full) == [], "N/A clique and cluster are left out"


def test_a_580_health_summary_of_na_passes():
    """What 580's -q prints for the fabric health of a lone GPU (``Summary : N/A``), through
    the query of its own as 580 would answer it."""
    class Ctx:
        runner, warnings = None, []

        def harmless_timeout(self, tool):
            return 5

        def warn(self, text):
            self.warnings.append(text)

    ctx = Ctx()
    # issue 44: 580's detail query, not in the capture, answered as its fabric query answers a
    # GPU without a fabric (N/A in every column)
    width = {tuple(smi.fabric_detail_argv()): len(smi.FABRIC_DETAIL_FIELDS) - 1}
    ctx.runner = type("R", (), {"run": lambda self, argv, check=False, timeout=None: Completed(
        argv=argv, returncode=0, stdout=f"{BUS}" + ", N/A" * width.get(tuple(argv), 1) + "\n",
        stderr="", duration_s=0.02)})()
    full = BY_ARGV[tuple(smi.full_query_argv())]["stdout"]

    assert "Summary                                    : N/A" in full
    assert health_summary(ctx) == "health summary N/A on 1 GPU(s)" and ctx.warnings == []


def test_mig_off_on_580_is_no_mig_problem():
    assert smi.mig_enabled(BY_ARGV[tuple(smi.mig_mode_argv())]["stdout"]) == []
    assert BY_ARGV[tuple(smi.mig_list_argv())]["exit"] == 0


def test_the_cc_queries_of_580_classify_as_off_and_not_ready():
    runner = Replay()
    finding = classify.from_smi(cc_answers(lambda q: runner.run(smi.conf_compute_argv(q))))
    grs = runner.run(smi.conf_compute_argv("-grs"))

    assert finding.label == "off" and finding.unreadable == {}
    assert finding.describe() == ("CC status: OFF, DevTools Mode: OFF, CC Environment: UNAVAILABLE, "
                                  "Multi-GPU Mode: None")
    assert smi.parse_ready_state(grs.stdout, grs.returncode) == "not-ready"


@pytest.mark.parametrize("argv", [e["argv"] for e in CAPTURE if e["exit"]],
                         ids=lambda a: " ".join(a[1:])[:40])
def test_every_refusal_of_the_capture_has_a_meaning_in_the_failure_table(argv):
    entry = BY_ARGV[tuple(argv)]

    assert entry["exit"] in words.NVSMI_EXIT
    said = words.failed_call(argv, entry["exit"], entry["stdout"])
    assert said.startswith(f"{' '.join(argv[:2])} exit {entry['exit']} (")


def test_the_captured_boot_warned_of_the_reset_status_that_no_longer_warns():
    """The status.json of that boot (code before issue 33): the refused reset status warned."""
    status = json.loads((REAL / "podvm-gpu-status.json").read_text())

    assert status["state"] == "ready"
    assert [w.split(":")[0] for w in status["warnings"]] == ["modules", "cdi"]
    assert "reset status not read" in status["warnings"][1]


def test_the_580_answers_as_value_types_and_their_verdicts():
    """The nvidia-smi back end's facts of the real H200 (gpufacts/facts.py): each value read or
    why not; the verdicts on them (gpufacts/judge.py) pass. The health summary, not in the
    capture, is answered as 580 answers a GPU without a fabric (``[N/A]``)."""
    from podvm_gpu.gpufacts.facts import unread

    class Replay580(Replay):
        def run(self, argv, check=False, timeout=None):
            if argv == smi.fabric_health_argv():
                return Completed(argv=argv, returncode=0, stdout=f"{BUS}, [N/A]\n", stderr="",
                                 duration_s=0.02)
            return super().run(argv, check, timeout)

    facts = smi_facts(Replay580(), 5)

    assert list(facts) == [BUS]
    gpu = facts[BUS]
    assert (gpu.lost.value, gpu.remap_pending.value, gpu.remap_failure.value,
            gpu.ecc_volatile.value, gpu.recovery_action.value) == (False, False, False, 0, 0)
    assert gpu.retired_pending == unread("N/A") and gpu.fabric_state == unread("N/A")
    assert gpu.fabric_summary == unread("N/A")
    assert judge.facts_verdicts(gpu, False) == {"gpu-lost": "ok", "memory": "ok",
                                                "recovery-action": "ok"}
