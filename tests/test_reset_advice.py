"""Reset advice that works (issue 46 item 6): a reset is refused while persistence holds the GPU
(``GPU 00000000:1A:00.0: In use by another client``, exit 255, until ``nvidia-smi -pm 0``:
NVSentinel PR #1692), and a confidential guest's GPU is replaced with its VM. One function makes
the sentence (gpufacts/judge.py ``reset_advice``); every site that advises a reset gives it."""

from __future__ import annotations

import pathlib
import re

import pytest
from test_gpufacts_agreement import BUS, FACTS, CheckFacts

from podvm_gpu.gpufacts import judge
from podvm_gpu.steps import detect
from podvm_gpu.steps.cdi import step as cdi_step

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_persistence_is_stopped_before_the_reset_of_the_named_gpu():
    said = judge.reset_advice(["0000:1a:00.0"], confidential=False)
    stop = said.index("stop podvm-gpu-persistenced.service")
    assert "nvidia-smi -pm 0" in said
    assert stop < said.index("nvidia-smi -r -i 00000000:1A:00.0")
    assert "replace the VM" not in said


def test_a_confidential_guest_replaces_the_vm_and_never_resets():
    said = judge.reset_advice(["0000:1a:00.0"], confidential=True)
    assert said.startswith("replace the VM") and "nvidia-smi" not in said


def test_a_guest_not_known_to_be_confidential_or_not_hears_both():
    said = judge.reset_advice([], confidential=None)
    assert "nvidia-smi -r -i <bus id>" in said and "in a confidential guest: replace the VM" \
        in said


def test_each_gpu_named_gets_its_own_reset_once():
    said = judge.reset_advice(["0000:01:00", "00000000:01:00.0", "0000:02:00.0"], False)
    assert said.count("nvidia-smi -r -i") == 2 and "00000000:02:00.0" in said


def facts_for(name, confidential):
    check = CheckFacts(FACTS[name], False)
    check.confidential = confidential
    return check


@pytest.mark.parametrize("confidential", [True, False, None])
@pytest.mark.parametrize("row, name", [
    (cdi_step.row_remapper_row, "remap-pending"),
    (cdi_step.memory_errors_row, "volatile-ecc"),
    (cdi_step.memory_errors_row, "retirement-pending"),
    (cdi_step.recovery_action_row, "action-gpu-reset"),
    (cdi_step.recovery_action_row, "action-bus-reset")])
def test_every_check_row_that_asks_for_a_reset_gives_the_one_sentence(row, name, confidential):
    got = row(facts_for(name, confidential))
    assert got.result == "fail", got
    assert got.hint.startswith(judge.reset_advice([BUS], confidential)), got.hint


class PciFacts:
    class config:
        class detect:
            expected_gpus = 0

    coming = []
    nvswitches = []

    def __init__(self, root, confidential):
        self.root, self.confidential, self.scanned = root, confidential, 3
        self.gpus = [type("Gpu", (), {"name": "H100", "pci_address": "0000:01:00.0"})()]
        self.messages = ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05",
                         "NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off "
                         "the bus."]


@pytest.mark.parametrize("confidential", [True, False])
def test_the_pci_row_of_a_fatal_kernel_record_gives_the_one_sentence(tmp_path, confidential):
    from podvm_gpu.host.fs import Root

    facts = PciFacts(Root(str(tmp_path)), confidential)
    row = detect.pci_row(facts)
    assert row.result == "fail", row
    assert row.hint.endswith(judge.reset_advice(["0000:01:00"], confidential)), row.hint


def test_no_other_place_writes_its_own_reset_command():
    # the sentence comes from one function: a bare "nvidia-smi -r" elsewhere in the package or
    # in operating.md is a site that escaped it
    own = REPO / "podvm_gpu" / "gpufacts" / "judge.py"
    for path in (REPO / "podvm_gpu").rglob("*.py"):
        if path != own:
            assert not re.search(r"nvidia-smi -r\b(?! -i)", path.read_text()), path
    operating = (REPO / "docs" / "operating.md").read_text()
    for m in re.finditer(r"nvidia-smi -r\b", operating):
        near = operating[max(0, m.start() - 300):m.start()]
        assert "podvm-gpu-persistenced" in near or "-pm 0" in near, operating[m.start() - 300:
                                                                              m.end() + 40]
