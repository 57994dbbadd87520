"""bench/run.py's critical path is the pipeline's dependency graph, not a list of calls (issue 38):
the same calls give the same yardstick whichever order or overlap the agent ran them in."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_run", module)
    spec.loader.exec_module(module)
    return module


def calls_of(durations: list[tuple[str, float]], side_by_side: bool = False):
    """``(start, end, argv)`` of calls one after another, or all started at once."""
    calls, t = [], 0.0
    for argv, took in durations:
        calls.append((t, t + took, argv.split()))
        t = t if side_by_side else t + took
    return calls


CHAIN = [("modprobe nvidia", 0.01), ("modprobe nvidia_uvm", 0.01),
         ("nvidia-ctk system create-device-nodes --control-devices", 0.02),
         ("nvidia-persistenced --persistence-mode", 0.05)]
CC = [(f"nvidia-smi conf-compute {q}", 0.02) for q in ("-f", "-d", "-e", "-mgm")]
HEALTH = [("nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending", 0.02),
          ("nvidia-smi --query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total", 0.02)]
FABRIC = [("nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status", 0.02)]


def test_the_lanes_after_persistenced_are_side_by_side(bench):
    # generate (0.1) is the longest lane: the CC queries and the health gate's (independent:
    # 0.02 each) and the fabric probe run beside it
    calls = calls_of(CHAIN + FABRIC + CC + HEALTH + [("nvidia-ctk cdi generate --mode=nvml", 0.1)])
    assert bench.critical_path(calls, nvswitch=False) == pytest.approx(0.09 + 0.1)


def test_a_health_gate_asked_one_query_after_another_is_the_agents_time(bench):
    # the gate's queries do not depend on each other: asked in sequence (0.08) they lengthen
    # the wall, not the yardstick, which stays at the generation's 0.05
    calls = calls_of(CHAIN + HEALTH + HEALTH + [("nvidia-ctk cdi generate --mode=nvml", 0.05)])
    assert bench.critical_path(calls, nvswitch=False) == pytest.approx(0.09 + 0.05)


def test_the_yardstick_does_not_move_with_the_agent(bench):
    # the CC queries one after another or side by side: the same critical path
    generate = [("nvidia-ctk cdi generate --mode=nvml", 0.01)]
    serial = calls_of(CHAIN + CC + generate)
    parallel = calls_of(CHAIN) + [(0.09, 0.11, argv.split()) for argv, _took in CC] + \
        [(0.09, 0.1, generate[0][0].split())]
    assert bench.critical_path(serial, False) == bench.critical_path(parallel, False) == \
        pytest.approx(0.09 + 0.02)


def test_setting_the_ready_state_waits_for_the_fabric(bench):
    # -srs 1 (and the -grs after it) follow the fabric's end, not only the CC queries
    calls = calls_of(CHAIN + [("nv-fabricmanager -c x", 1.0)] + FABRIC + CC
                     + [("nvidia-smi conf-compute -grs", 0.02),
                        ("nvidia-smi conf-compute -srs 1", 0.03),
                        ("nvidia-smi conf-compute -grs", 0.02)])
    assert bench.critical_path(calls, nvswitch=True) == pytest.approx(0.09 + 1.02 + 0.05)


def test_fabric_polls_before_it_was_ready_are_not_tool_time(bench):
    polls = [(0.2 + 0.1 * i, 0.21 + 0.1 * i, FABRIC[0][0].split()) for i in range(9)]
    calls = calls_of(CHAIN) + [(0.09, 1.09, ["nv-fabricmanager", "-c", "x"])] + polls
    assert bench.critical_path(calls, nvswitch=True) == pytest.approx(0.09 + 1.0 + 0.01)


def test_every_argv_the_agent_runs_has_its_node(bench):
    # a call the graph does not know would drop out of the yardstick: the dry-run plan's GPU calls
    for argv in (["nvidia-smi", "conf-compute", "-f"], ["nvidia-ctk", "cdi", "generate"],
                 ["nvidia-smi", "--query-gpu=pci.bus_id,gpu_recovery_action"],
                 ["nvidia-smi", "--query-gpu=pci.bus_id,reset_status.reset_required"],
                 ["nvidia-persistenced"], ["nv-fabricmanager", "--version"], ["modprobe", "x"]):
        assert bench.node_of(argv, False) in bench.GRAPH


@pytest.mark.parametrize("tree", ["h100-pcie", "hgx-h200-8gpu-4nvswitch"])
def test_every_call_of_the_dry_run_plan_has_its_node(bench, podvm, tmp_path, tree):
    # what boot --dry-run says a boot would run (the attestation too, with set_ready_state):
    # a call the graph has no node for would drop out of the yardstick unseen
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvattest").write_text("#!/bin/sh\nexit 99\n")
    (folder / "nvattest").chmod(0o755)
    root = tmp_path / "root"
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(
        "confidential_computing:\n  set_ready_state: true\n")
    done = podvm(["boot", "--dry-run", "--json", "--root", str(root)], tree=tree,
                 env={"PATH": str(folder)})
    assert done.returncode == 0, done.stderr
    commands = __import__("json").loads(done.stdout)["commands"]
    assert any(c[0] == "nvattest" for c in commands) and len(commands) > 10
    assert [c for c in commands if bench.node_of(c, False) is None] == []


def test_nvidia_ctks_version_is_a_lane_of_its_own(bench):
    # it needs neither driver nor GPU: read beside the chain it adds nothing; were it the
    # longest thing before the generation, the generation would wait for it
    version = [("nvidia-ctk --version", 0.01)]
    generate = [("nvidia-ctk cdi generate --mode=nvml", 0.1)]
    assert bench.node_of(["nvidia-ctk", "--version"], False) == "toolkit-version"
    assert bench.critical_path(calls_of(CHAIN + version + generate), False) == \
        pytest.approx(0.09 + 0.1)
    slow = [("nvidia-ctk --version", 0.5)]
    assert bench.critical_path(calls_of(CHAIN + slow + generate), False) == \
        pytest.approx(0.5 + 0.1)
