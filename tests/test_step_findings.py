"""The decisions boot and check share (issue 27): each step computes one finding, boot's ``run``
acts on it and check's row renders it, so a decision is tested here once, not in both copies.

- persistenced: :class:`podvm_gpu.steps.persistenced.Seen` (pid file and socket -> state);
- fabricmanager: :func:`podvm_gpu.gpufacts.judge.fabric_state` (the GPUs' fabric states
  against the VM's GPUs; issue 44: a function of gpufacts, no class), the row's words
  (:func:`podvm_gpu.steps.fabric.step.not_ready`) and :func:`podvm_gpu.steps.fabric.fabric_kind.kind_of`;
- cdi: :mod:`podvm_gpu.gpufacts.health`'s judges (the health gate's findings: worst level and action).
"""

from __future__ import annotations

import pytest

from podvm_gpu.gpufacts import finding as F
from podvm_gpu.gpufacts.health import judge_ecc, judge_remapper
from podvm_gpu.gpufacts.judge import fabric_state
from podvm_gpu.gpufacts.smi import FabricState
from podvm_gpu.gpufacts.words import FAIL, OK, WARN
from podvm_gpu.steps.fabric import fabric_kind
from podvm_gpu.steps.fabric.step import not_ready
from podvm_gpu.steps.persistenced import Seen


@pytest.mark.parametrize("pid, socket, state", [
    (None, False, Seen.NOT_RUNNING),
    (None, True, Seen.NOT_RUNNING),  # a socket left by an earlier daemon does not count
    (4242, False, Seen.STARTING),
    (4242, True, Seen.READY),
])
def test_persistenced_is_ready_only_running_with_its_socket(pid, socket, state):
    assert Seen(socket, pid).state == state
    assert Seen(socket, pid).ready == (state == Seen.READY)


def test_without_a_socket_the_pid_file_is_not_read_for_readiness():
    """The boot's wait asks every 10 ms: a stat, and the pid file only once the socket is there."""
    reads = []

    assert not Seen(False, lambda: reads.append(1) or 4242).ready
    assert reads == []
    assert Seen(True, lambda: reads.append(1) or 4242).ready and reads == [1]


GPUS = ["0000:18:00.0", "0000:2a:00.0"]


def state(gpu: str, fabric: str, status: str) -> FabricState:
    return FabricState(gpu, fabric, status)


def test_the_fabric_is_ready_when_every_gpu_of_the_vm_is_completed_success():
    waiting, unhealthy, ready = fabric_state([state("00000000:18:00.0", "Completed", "Success"),
                                              state("00000000:2A:00.0", "Completed", "Success")],
                                             GPUS)

    assert ready and waiting == [] and unhealthy == []


def test_a_gpu_nvidia_smi_does_not_list_keeps_the_fabric_not_ready():
    states = [state("00000000:18:00.0", "Completed", "Success")]
    waiting, _, ready = fabric_state(states, GPUS)

    assert not ready
    assert waiting == ["0000:2a:00.0"]
    assert not_ready(states, waiting) == "0000:2a:00.0: no state"


def test_a_gpu_still_training_is_waiting_not_unhealthy():
    states = [state("00000000:18:00.0", "Completed", "Success"),
              state("00000000:2a:00.0", "In Progress", "N/A")]
    waiting, unhealthy, ready = fabric_state(states, GPUS)

    assert not ready and unhealthy == []
    assert not_ready(states, waiting) == "00000000:2a:00.0: State In Progress, Status N/A"


def test_completed_with_another_status_is_unhealthy():
    bad = state("00000000:2a:00.0", "Completed", "Failure")
    _, unhealthy, ready = fabric_state([state("00000000:18:00.0", "Completed", "Success"), bad],
                                       GPUS)

    assert not ready and unhealthy == [bad]


def test_no_state_reported_is_not_ready():
    waiting, _, ready = fabric_state([], GPUS)

    assert not ready and not_ready([], waiting) == "0000:18:00.0: no state, 0000:2a:00.0: no state"


def test_the_fabric_kind_falls_back_to_pci_only_without_a_detection():
    detected = fabric_kind.Fabric(fabric_kind.NVLINK5, [], [], [])

    assert fabric_kind.kind_of(detected, []) == fabric_kind.NVLINK5
    assert fabric_kind.kind_of(None, ["0000:05:00.0"]) == fabric_kind.NVSWITCH
    assert fabric_kind.kind_of(None, []) == fabric_kind.NONE


HEALTHY, REPLACE, RESET, RESET_WARNS = (OK, F.NONE), (FAIL, F.REPLACE), (FAIL, F.RESET), (WARN, F.RESET)


@pytest.mark.parametrize("remap, ecc, warns, outcome", [
    ([["18:00.0", "No", "No"]], [["18:00.0", "0", "[N/A]"]], False, HEALTHY),
    ([["18:00.0", "[N/A]", "[N/A]"]], [["18:00.0", "[N/A]", "No"]], False, HEALTHY),
    ([["18:00.0", "No", "Yes"]], [], True, REPLACE),  # whatever the config
    ([["18:00.0", "Yes", "No"]], [], False, RESET),
    ([["18:00.0", "Yes", "No"]], [], True, RESET_WARNS),
    ([], [["18:00.0", "2", "No"]], False, RESET),  # volatile uncorrectable ECC
    ([], [["18:00.0", "0", "Yes"]], True, RESET_WARNS),  # a page retirement pending
])
def test_the_health_gate_decides_replace_reset_or_healthy(remap, ecc, warns, outcome):
    found = judge_remapper(remap, warns) + judge_ecc(ecc, warns)
    action = next((a for a in (F.REPLACE, F.RESET) if any(f.action == a for f in found)), F.NONE)

    assert (F.worst(found), action) == outcome
