"""Boot, check and the exporter agree (issue 33): the same facts of one GPU, given to boot's
health gate and check's rows as nvidia-smi's answers and to the exporter as NVML's reading,
give one verdict on one scale (boot ok/warn/fail = check pass/warn/fail = podvm_gpu_health
0/10/20), ``health.reset_pending_warns`` included. Before issue 33 a pending row remap failed the
boot while the exporter only warned, and the exporter ignored ``health.reset_pending_warns``."""

from __future__ import annotations

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import smi, words
from podvm_gpu.gpufacts.reading import GpuReading, NvmlReading
from podvm_gpu.host.proc import Completed
from podvm_gpu.metrics import health_families
from podvm_gpu.steps.cdi import health
from podvm_gpu.steps.cdi import step as cdi_step

BUS = "00000000:18:00.0"
REFUSED_580 = 'Field "reset_status.reset_required" is not a valid field to query.\n\n'
# name -> (remap pending, remap failure, volatile uncorrectable ECC, retirement pending, action)
FACTS = {
    "healthy": (0, 0, 0, False, 0),
    "remap-pending": (1, 0, 0, False, 0),
    "remap-failure": (0, 1, 0, False, 0),
    "volatile-ecc": (0, 0, 3, False, 0),
    "retirement-pending": (0, 0, 0, True, 0),
    "action-gpu-reset": (0, 0, 0, False, 1),
    "action-node-reboot": (0, 0, 0, False, 2),
    "action-drain-p2p": (0, 0, 0, False, 3),
    "action-drain-and-reset": (0, 0, 0, False, 4),
    "action-recover-imex": (0, 0, 0, False, 5),
    "action-bus-reset": (0, 0, 0, False, 6),
    "action-system-reboot": (0, 0, 0, False, 7),
}
WORDS = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset",
         5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}
CHECK_VERDICT = {v: k for k, v in words.CHECK_STATE.items()}


class Runner:
    """nvidia-smi 580 answering the facts (tests/data/real/h200-580's forms)."""

    timeouts: dict = {}

    def __init__(self, facts):
        pending, failure, ecc, retire, action = facts
        self.answers = {
            tuple(smi.remap_argv()): (0, f"{BUS}, {'Yes' if pending else 'No'}, "
                                         f"{'Yes' if failure else 'No'}\n"),
            tuple(smi.ecc_argv()): (0, f"{BUS}, {ecc}, {'Yes' if retire else 'No'}\n"),
            tuple(smi.reset_argv()): (2, REFUSED_580),
            tuple(smi.action_argv()): (0, f"{BUS}, {WORDS[action]}\n"),
        }

    def run(self, argv, check=False, timeout=None):
        rc, out = self.answers[tuple(argv)]
        return Completed(argv=argv, returncode=rc, stdout=out, stderr="", duration_s=0.01)


class Config:
    def __init__(self, warns):
        self.health = type("Health", (), {"reset_pending_warns": warns})()


class BootCtx:
    def __init__(self, facts, warns):
        self.runner, self.config, self.warnings = Runner(facts), Config(warns), []

    def harmless_timeout(self, tool):
        return 5.0

    def warn(self, text):
        self.warnings.append(text)


class CheckFacts:
    def __init__(self, facts, warns):
        self.runner, self.config = Runner(facts), Config(warns)

    def not_reached(self, step):
        return None

    def needs_driver(self, name):
        return None


def boot_verdict(facts, warns) -> str:
    ctx = BootCtx(facts, warns)
    try:
        health.gate(ctx)
    except StepFailed:
        return words.FAIL
    return words.WARN if ctx.warnings else words.OK


def check_verdict(facts, warns) -> str:
    check = CheckFacts(facts, warns)
    rows = [cdi_step.row_remapper_row(check), cdi_step.memory_errors_row(check),
            cdi_step.recovery_action_row(check)]
    return words.worst(*(CHECK_VERDICT.get(row.result, words.OK) for row in rows))


def exporter_verdict(facts, warns) -> str:
    pending, failure, ecc, retire, action = facts
    gpu = GpuReading(0)
    gpu.up, gpu.pci_bus_id, gpu.recovery_action = True, BUS, action
    gpu.values.update({"DCGM_FI_DEV_ROW_REMAP_PENDING": pending,
                       "DCGM_FI_DEV_ROW_REMAP_FAILURE": failure,
                       "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ecc,
                       "DCGM_FI_DEV_RETIRED_PENDING": int(retire)})
    reading = NvmlReading(True)
    reading.gpus.append(gpu)
    family = health_families.agent_health_family(reading, lambda g: ["0", "GPU-x", BUS, "nvidia0"],
                                                 warns)
    scores = [sample.value for sample in family.samples]
    by_score = {v: k for k, v in words.SCORE.items()}
    return words.worst(*(by_score[int(s)] for s in scores))


EXPECTED = {  # name -> (verdict, verdict with health.reset_pending_warns)
    "healthy": ("ok", "ok"), "remap-pending": ("fail", "warn"), "remap-failure": ("fail", "fail"),
    "volatile-ecc": ("fail", "warn"), "retirement-pending": ("fail", "warn"),
    "action-gpu-reset": ("fail", "warn"), "action-node-reboot": ("fail", "fail"),
    "action-drain-p2p": ("warn", "warn"), "action-drain-and-reset": ("fail", "warn"),
    "action-recover-imex": ("warn", "warn"), "action-bus-reset": ("fail", "warn"),
    "action-system-reboot": ("fail", "fail"),
}


@pytest.mark.parametrize("warns", [False, True], ids=["default", "reset_pending_warns"])
@pytest.mark.parametrize("name", sorted(FACTS))
def test_boot_check_and_the_exporter_agree_on_the_same_facts(name, warns):
    facts = FACTS[name]
    verdicts = {"boot": boot_verdict(facts, warns), "check": check_verdict(facts, warns),
                "exporter": exporter_verdict(facts, warns)}

    assert verdicts == dict.fromkeys(verdicts, EXPECTED[name][warns]), verdicts


def test_dcgms_own_family_keeps_dcgms_meaning_for_a_pending_remap():
    """docs/metrics.md: DCGM_EXP_GPU_HEALTH_STATUS warns (10) for a pending remap, as DCGM does;
    podvm_gpu_health says the agent's verdict (20)."""
    gpu = GpuReading(0)
    gpu.up, gpu.pci_bus_id = True, BUS
    gpu.values.update({"DCGM_FI_DEV_ROW_REMAP_PENDING": 1, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0})

    assert health_families.health_results(gpu, [])["MEM"] == (10, "DCGM_FR_PENDING_ROW_REMAP")
    assert exporter_verdict((1, 0, 0, False, 0), False) == words.FAIL


@pytest.mark.parametrize("answer, result, said", [
    ("[N/A], [N/A]", "skip", "no ECC counters"),
    ("garbage, maybe", "warn", "not read as a value"),
    ("-1, No", "warn", "not read as a value"),
    ("0, [N/A]", "pass", "volatile uncorrectable ECC 0, retirement pending [N/A]"),  # 580's H200
])
def test_the_memory_errors_row_says_what_it_cannot_read(answer, result, said):
    """A newcomer's finding: ``[N/A]``, ``garbage``, ``-1`` all passed the row (judge_ecc never
    said a value it could not read), while the row-remapper row skips N/A and warns on a
    value it cannot read; the boot's gate now warns on it too."""
    check = CheckFacts(FACTS["healthy"], False)
    check.runner.answers[tuple(smi.ecc_argv())] = (0, f"{BUS}, {answer}\n")
    row = cdi_step.memory_errors_row(check)
    assert row.result == result and said in row.detail, row
    if result == "warn":
        ctx = BootCtx(FACTS["healthy"], False)
        ctx.runner.answers[tuple(smi.ecc_argv())] = (0, f"{BUS}, {answer}\n")
        health.gate(ctx)
        assert any("ECC answered" in w and "not read as a value" in w for w in ctx.warnings), \
            ctx.warnings
