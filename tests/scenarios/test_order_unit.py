"""The ordering rule's judge (scenarios/order.py, issue 46 item 2): which calls of a call log open a
GPU inside the window from the first ``modprobe nvidia`` to persistenced's readiness mark. Every
scenario test applies it to its world (expect.judge_boot, judge_check); these hold the judge
itself to the cases it must catch: a parallel branch, an early start, a daemon never ready."""

import json
from pathlib import Path
from types import SimpleNamespace

from scenarios import effects as fx
from scenarios import order
from scenarios.world import Call

MODPROBE_AT = 100.0
READY_AT = 105.0


def call(argv, started, ended=None, answer="rule 1", run="boot"):
    return Call(id=str(started), pid=1, run=run, argv=argv, started=started, ended=ended,
                rc=None if ended is None else 0, answer=answer)


def test_what_opens_a_gpu_is_the_agents_nvml_clients_and_the_fabric_managers_start():
    for argv in (["nvidia-smi", "-q"], ["nvidia-smi", "conf-compute", "-grs"],
                 ["nvidia-ctk", "cdi", "generate", "--output=/x"], ["nvattest", "attest"],
                 ["nv-fabricmanager", "-c", "/etc/fm.cfg"]):
        assert order.opens_gpu(argv), argv
    for argv in (["nv-fabricmanager", "--version"], ["nvidia-ctk", "--version"],
                 ["nvidia-ctk", "system", "create-device-nodes"], ["modprobe", "nvidia"],
                 ["nvidia-persistenced", "--persistence-mode"], []):
        assert not order.opens_gpu(argv), argv
    assert order.loads_driver(["modprobe", "nvidia", "NVreg_X=1"])
    assert not order.loads_driver(["modprobe", "nvidia_uvm"])


def test_a_client_inside_the_window_is_named_with_both_marks():
    calls = [call(["modprobe", "nvidia"], MODPROBE_AT, MODPROBE_AT + 1),
             call(["nvidia-smi", "-q"], MODPROBE_AT + 2, MODPROBE_AT + 3)]
    problems = order.early_clients(calls, MODPROBE_AT, READY_AT)
    assert len(problems) == 1
    assert "boot nvidia-smi -q opens a GPU before persistenced" in problems[0]
    assert "2.000 s after the first modprobe nvidia, 3.000 s before" in problems[0]


def test_a_parallel_branch_still_running_across_the_mark_counts_by_its_start():
    # a branch that started before readiness and ended after it: its start decides
    calls = [call(["nvidia-ctk", "cdi", "generate"], READY_AT - 0.01, READY_AT + 4),
             call(["nvidia-smi", "conf-compute", "-f"], READY_AT, READY_AT + 1),
             call(["nvidia-smi", "conf-compute", "-e"], READY_AT + 0.5, None)]
    problems = order.early_clients(calls, MODPROBE_AT, READY_AT)
    assert [p.split(" opens")[0].split(": ", 1)[1] for p in problems] == \
        ["boot nvidia-ctk cdi generate"]


def test_an_early_start_still_running_at_the_load_counts_and_one_that_ended_does_not():
    calls = [call(["nvidia-smi", "-L"], MODPROBE_AT - 5, MODPROBE_AT - 4),
             call(["nvidia-smi", "-q"], MODPROBE_AT - 1, MODPROBE_AT + 0.5),
             call(["nvattest", "attest"], MODPROBE_AT - 1, None)]
    problems = order.early_clients(calls, MODPROBE_AT, READY_AT)
    assert len(problems) == 2
    assert all("started before the driver's load and still ran at it" in p for p in problems)
    assert "nvidia-smi -L" not in " ".join(problems)


def test_no_readiness_keeps_the_window_open_and_no_load_means_no_window():
    late = [call(["nvidia-smi", "-q"], MODPROBE_AT + 600, MODPROBE_AT + 601, run="check")]
    problems = order.early_clients(late, MODPROBE_AT, None)
    assert problems and "check nvidia-smi -q" in problems[0]
    assert "persistenced never became ready" in problems[0]
    assert order.early_clients(late, None, None) == []


def test_a_refused_call_opens_nothing():
    refused = [call(["nvidia-smi", "-q", "-d", "FABRIC"], MODPROBE_AT + 1, MODPROBE_AT + 1.01,
                    answer="harness refusal")]
    assert order.early_clients(refused, MODPROBE_AT, READY_AT) == []


def test_a_driver_loaded_before_the_agent_opens_the_window_at_the_worlds_start():
    assert order.preloaded({"proc/modules": "virtio 1 0 - Live 0x0\nnvidia 16384 0 - Live 0x0\n"})
    assert order.preloaded({"proc/modules": {"content": "nvidia 1 0 - Live 0x0\n"}})
    assert not order.preloaded({"proc/modules": "nvidia_uvm 1 0 - Live 0x0\n"})
    assert not order.preloaded({})


def test_the_world_judge_reads_the_first_load_and_the_marks_time(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"marked_at": {order.READY_MARK: READY_AT}}))
    calls = [call(["modprobe", "nvidia"], MODPROBE_AT, MODPROBE_AT + 1),
             call(["modprobe", "nvidia"], MODPROBE_AT + 50, MODPROBE_AT + 51, run="rerun"),
             call(["nvidia-smi", "-q"], MODPROBE_AT + 1, MODPROBE_AT + 2),
             call(["nvidia-smi", "-q"], READY_AT + 1, READY_AT + 2)]
    world = SimpleNamespace(calls=lambda: calls, case=SimpleNamespace(files={}),
                            layout=SimpleNamespace(state=str(state)))
    assert len(order.world_problems(world, calls)) == 1
    state.write_text(json.dumps({"applied": []}))  # never ready
    assert len(order.world_problems(world, calls)) == 2


def test_an_effect_records_when_its_first_application_began(tmp_path):
    layout = fx.Layout(str(tmp_path))
    Path(layout.root).mkdir()
    state = fx.initial_state([])
    effects = fx.Effects(layout, {"pci": [], "pci_late": []}, state, ["/bin/x"])
    effects.apply({"cc_ready_state": "ready"})
    first = state["marked_at"]["cc_ready_state=ready"]
    effects.apply({"cc_ready_state": "ready"})
    assert state["marked_at"]["cc_ready_state=ready"] == first > 0
