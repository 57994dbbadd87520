"""The GPU facts package (issue 33): its words defined once, inside it, and the rules of its
tables. The structure tests read the package's source (AST), so a second N/A rule, bus-id
normaliser, failure table or nvidia-smi command line written elsewhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from smi_facts import smi_facts

from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.row import FAIL, PASS, WARN

PACKAGE = Path(__file__).resolve().parents[1] / "podvm_gpu"
FACTS = PACKAGE / "gpufacts"
OUTSIDE = sorted(p for p in PACKAGE.rglob("*.py") if FACTS not in p.parents)


def trees():
    return [(p.relative_to(PACKAGE), ast.parse(p.read_text())) for p in OUTSIDE]


def constants(tree) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_no_nvidia_smi_command_line_is_written_outside_the_package():
    """Every argv the agent runs is built in gpufacts/smi.py (boot --dry-run names them)."""
    found = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts and \
                    isinstance(node.elts[0], ast.Constant) and node.elts[0].value == "nvidia-smi":
                found.append(f"{path}:{node.lineno}")

    assert found == []


def test_the_na_rule_is_written_once_inside_the_package():
    found = [f"{path}: {value!r}" for path, tree in trees() for value in constants(tree)
             if value.strip().lower() in ("n/a", "[n/a]", "not supported")]

    assert found == []


def test_the_bus_id_normaliser_is_defined_once_inside_the_package():
    """No function of another module builds NVML's 8-digit form or is a bus-id normaliser
    (steps/fabric/parse.py and metrics/families.py had one each)."""
    found = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("bus_id"):
                found.append(f"{path}: def {node.name}")
            if isinstance(node, ast.FormattedValue) and isinstance(node.format_spec, ast.JoinedStr) \
                    and any(isinstance(v, ast.Constant) and v.value == "08X" for v in node.format_spec.values):
                found.append(f"{path}:{node.lineno} :08X")

    assert found == []


def test_the_failure_table_is_defined_once_inside_the_package():
    """No module outside names an exit status of nvidia-smi by a number of its own (readers.py,
    steps/cc/classify.py and steps/cdi/step.py had their own), nor a table of them."""
    found = []
    for path, tree in trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, int):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(n.endswith("_RC") for n in names):
                    found.append(f"{path}:{node.lineno} {names}")
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == 15
                                                  for k in node.keys) and \
                    any(isinstance(v, ast.Constant) and "lost" in str(v.value).lower() for v in node.values):
                found.append(f"{path}:{node.lineno} a table of exit statuses")

    assert found == []


def test_the_verdict_scale_is_one_mapping_for_boot_check_and_the_exporter():
    assert words.SCORE == {words.OK: 0, words.WARN: 10, words.FAIL: 20}
    assert words.CHECK_STATE == {words.OK: PASS, words.WARN: WARN, words.FAIL: FAIL}
    assert words.worst(words.OK, words.FAIL, words.WARN) == words.FAIL
    assert words.worst() == words.OK


def test_the_failure_table_keeps_nvidia_smis_status_apart_from_nvmls_code():
    assert words.NVSMI_EXIT[15] == "GPU is lost"
    assert words.NVSMI_EXIT[255] == ("unknown error (NVML 1, 10, 16, 22, 25, 26, 27, 28, 29, "
                                     "999, or a foreign library)")
    assert words.NVSMI_BROKEN == (9, 12, 15, 17, 18)
    assert 28 not in words.NVSMI_EXIT, "NVML 28 is seen as exit 255"
    assert {25, 26, 27, 28, 29} <= set(words.NVML_RETURN)
    assert words.nvml_text(27) == "NVML 27 (NOT_READY: not ready yet)"
    assert words.NVML_RETURN[16].broken and words.NVML_RETURN[16].smi_exit == 255


@pytest.mark.parametrize("given, nvml", [("0000:01:00", "00000000:01:00.0"),
                                         ("0000:3b:00.1", "00000000:3B:00.1"),
                                         ("00000000:C3:00.0", "00000000:C3:00.0"),
                                         (" 0000:c3:00.0 ", "00000000:C3:00.0"),
                                         ("garbage", "garbage")])
def test_bus_ids_take_nvmls_form(given, nvml):
    assert words.bus_id(given) == nvml


@pytest.mark.parametrize("value, expected", [("[N/A]", True), ("N/A", True), ("n/a", True),
                                             ("[Not Supported]", True), ("", True), (None, True),
                                             ("0", False), ("No", False), ("[GPU is lost]", False)])
def test_one_na_rule(value, expected):
    assert words.na(value) is expected


def test_a_failed_call_is_worded_one_way():
    said = words.failed_call(smi.reset_argv(), 2, 'Field "reset_status.reset_required" is not a '
                             'valid field to query.\n\n')

    assert said == ("nvidia-smi --query-gpu=pci.bus_id,reset_status.reset_required,"
                    "reset_status.drain_and_reset_recommended exit 2 (invalid argument (also an "
                    "option or --query-gpu field this nvidia-smi does not know)): Field "
                    "\"reset_status.reset_required\" is not a valid field to query.")


@pytest.mark.parametrize("value, name", [
    ("None", "None"), ("none", "None"), ("0", "None"), (0, "None"),
    ("GPU Reset", "GPU Reset"), ("Reset", "GPU Reset"), ("RESET", "GPU Reset"), ("1, Reset", "GPU Reset"),
    ("Reboot", "Node Reboot"), ("Node Reboot", "Node Reboot"), ("2", "Node Reboot"),
    ("Drain P2P", "Drain P2P"), ("drain and reset", "Drain and Reset"),
    ("Recover IMEX Domain", "Recover IMEX Domain"), ("Bus Reset", "Bus Reset"), (6, "Bus Reset"),
    ("System Reboot", "System Reboot"), ("7", "System Reboot")])
def test_every_recovery_action_label_is_known(value, name):
    assert judge.action_of(value).name == name


@pytest.mark.parametrize("value", ["Reset Soon", "8", "[N/A]", "", "Unknown Error"])
def test_a_recovery_word_no_table_knows_is_none(value):
    assert judge.action_of(value) is None


@pytest.mark.parametrize("number, verdict, warns", [
    (0, words.OK, words.OK), (1, words.FAIL, words.WARN), (2, words.FAIL, words.FAIL),
    (3, words.WARN, words.WARN), (4, words.FAIL, words.WARN), (5, words.WARN, words.WARN),
    (6, words.FAIL, words.WARN), (7, words.FAIL, words.FAIL)])
def test_each_recovery_action_has_one_verdict(number, verdict, warns):
    """A reset needed follows health.reset_pending_warns; a reboot fails whatever it says."""
    kind = judge.ACTION_BY_NUMBER[number].kind

    assert judge.verdict_of(kind, False) == verdict
    assert judge.verdict_of(kind, True) == warns


@pytest.mark.parametrize("value, kind", [
    ("Healthy", judge.FINE), ("HEALTHY", judge.FINE), ("N/A", judge.FINE), ("[N/A]", judge.FINE),
    ("Unhealthy", judge.FATAL), ("Limited Capacity", judge.NOTE),
    ("NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY", judge.NOTE),
    ("nvml_gpu_fabric_health_summary_unhealthy", judge.FATAL), (1, judge.FINE), (2, judge.FATAL),
    (3, judge.NOTE), ("Degraded", None), (9, None)])
def test_the_fabric_health_summary_has_one_reading(value, kind):
    assert judge.summary_kind(value) == kind


def test_the_cc_label_is_one_rule_for_nvidia_smi_and_nvml():
    from podvm_gpu.steps.cc.classify import CcAnswers

    for args in [(True, "on", True, judge.MGM_NONE), (True, "off", False, judge.MGM_PPCIE),
                 (True, "off", False, judge.MGM_NOT_OFFERED), (False, None, None, None),
                 (True, "value 7", None, None)]:
        finding = CcAnswers(mode=args[1], devtools=args[2], multi_gpu=args[3], capable=args[0])
        assert finding.label == judge.cc_label(*args)
    assert judge.cc_label(True, "on", True, judge.MGM_NONE) == "devtools"
    assert judge.cc_label(True, "value 7", None, None) is None


class _Smi:
    """nvidia-smi answering each argv with (rc, stdout); a missing one refuses its field."""

    def __init__(self, answers):
        self.answers = {tuple(argv): answer for argv, answer in answers}

    def run(self, argv, check=False, timeout=None):
        from podvm_gpu.host.proc import Completed

        rc, out = self.answers.get(tuple(argv), (2, f'Field "{argv[1]}" is not a valid field to '
                                                    'query.\n\n'))
        return Completed(argv=argv, returncode=rc, stdout=out, stderr="", duration_s=0.01)


def test_every_value_of_the_nvidia_smi_back_end_is_read_or_says_why_not():
    from podvm_gpu.gpufacts.facts import unread

    bus, lost = "00000000:18:00.0", "00000000:2A:00.0"
    facts = smi_facts(_Smi([
        (smi.remap_argv(), (0, f"{bus}, 1, 0\n{lost}, [GPU is lost], [GPU is lost]\n")),
        (smi.ecc_argv(), (3, "Not Supported\n")),
        (smi.action_argv(), (0, f"{bus}, 1, Reset\n")),
        (smi.fabric_argv(), (0, f"{bus}, state  In Progress, status N/A\n")),
    ]), 5)

    gpu = facts[bus]
    assert (gpu.remap_pending.value, gpu.remap_failure.value, gpu.recovery_action.value) == \
        (True, False, 1)
    assert gpu.ecc_volatile.why.startswith("nvidia-smi --query-gpu=pci.bus_id,ecc.errors."
                                           "uncorrected.volatile.total,retired_pages.pending exit 3")
    assert gpu.fabric_state.value == "In Progress" and gpu.fabric_success.value is False
    assert gpu.fabric_summary == unread("not offered by this nvidia-smi")
    assert facts[lost].lost.value is True
    assert judge.facts_verdicts(facts[lost], False) == {"gpu-lost": "fail"}
    assert judge.facts_verdicts(gpu, False) == {"gpu-lost": "ok", "memory": "fail",
                                                "recovery-action": "fail", "fabric": "fail"}
    assert judge.facts_verdicts(gpu, True)["memory"] == "warn"


def test_a_recovery_word_no_table_knows_is_kept_verbatim_and_warns():
    bus = "00000000:18:00.0"
    gpu = smi_facts(_Smi([(smi.action_argv(), (0, f"{bus}, Quarantine Rack\n"))]), 5)[bus]

    assert gpu.recovery_action.value == "Quarantine Rack"
    assert judge.facts_verdicts(gpu, False)["recovery-action"] == "warn"


def test_a_gpu_lost_in_any_query_has_reads_in_every_field():
    """[GPU is lost] in a row is never a value: the GPU is lost, and every field stays a Read."""
    bus = "00000000:18:00.0"
    lost = "[GPU is lost]"
    facts = smi_facts(_Smi([
        (smi.remap_argv(), (0, f"{bus}, {lost}, {lost}\n")),
        (smi.ecc_argv(), (0, f"{bus}, {lost}, {lost}\n")),
        (smi.action_argv(), (0, f"{bus}, {lost}\n")),
        (smi.fabric_health_argv(), (0, f"{bus}, {lost}\n")),
    ]), 5)[bus]

    assert facts.lost.value is True
    assert all(hasattr(getattr(facts, name), "why") for name in facts._fields[1:])
    assert judge.facts_verdicts(facts, False) == {"gpu-lost": "fail"}


def test_the_nvml_back_end_takes_a_gpu_down_from_the_failure_tables_nvml_column():
    """One table (gpufacts/words.py FAILURES): the NVML back end's "answers nothing more" is its
    broken codes and NVML 1, by the code pynvml's error carries, not a list of class names."""
    import pynvml

    from podvm_gpu.gpufacts.nvml import _down

    down = {code for code in (*words.NVML_RETURN, 2, 3, 999)
            if _down(pynvml.NVMLError(code))}

    assert down == {1, 9, 12, 15, 16, 17, 18}
