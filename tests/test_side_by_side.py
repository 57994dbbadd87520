"""Tool calls that may overlap do (issue 38): the CC step's four conf-compute queries in a boot,
and ``check``'s rows, read from the fake-tool log of a world (tests/scenarios). No timing
threshold: the delayed fakes only give the calls time to meet; the assertions are about order
(each call started before the others ended), which a sequential agent can never produce."""

from __future__ import annotations

import copy
import itertools

import pytest
from scenarios.world import DATA, World, _rule, load_case

CC_QUERIES = [["nvidia-smi", "conf-compute", q] for q in ("-f", "-d", "-e", "-mgm")]
FABRIC_QUERY = ["nvidia-smi", "--query-gpu=pci.bus_id,fabric.state,fabric.status",
                "--format=csv,noheader"]
DELAY_S = 1.0
HEALTH_QUERIES = [(["nvidia-smi", "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
                    "remapped_rows.failure"], "00000000:04:00.0, 0, 0\n"),
                  (["nvidia-smi", "--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total,"
                    "retired_pages.pending"], "00000000:04:00.0, 0, [N/A]\n")]
GENERATE = ["nvidia-ctk", "cdi", "generate"]


def overlap(a, b) -> bool:
    """Each of the two calls started before the other one ended."""
    return a.started < b.ended and b.started < a.ended


@pytest.fixture(scope="module")
def runs(umockdev_run):
    """P02 with the CC queries, the generation, the fabric query and two health queries taking
    DELAY_S each: its boot and a check."""
    case = copy.deepcopy(load_case(DATA / "cases" / "P02-one-h100-pcie-ready.yaml"))
    for rule in case.tools:
        if rule["argv"] in CC_QUERIES or rule["argv"] in (GENERATE, ["nvidia-persistenced"]):
            rule["delay_s"] = DELAY_S  # persistenced: ready at the end of its delay
    # the fabric query is the harness's to answer; a rule of rc 0 only adds its delay
    case.tools.insert(0, _rule({"argv": FABRIC_QUERY, "delay_s": DELAY_S}, []))
    for argv, stdout in HEALTH_QUERIES:  # a health rule answers with its own stdout
        case.tools.insert(0, _rule({"argv": argv, "delay_s": DELAY_S, "stdout": stdout}, []))
    with World(case) as world:
        boot = world.run("boot")
        check = world.run("check")
    assert (boot.status or {}).get("state") == "ready", boot.stderr[-2000:]
    assert check.rc in (0, 1), check.stderr[-2000:]
    return boot, check


def calls_of(run, argv: list[str]):
    found = [c for c in run.calls if c.argv[:len(argv)] == argv]
    assert found and all(c.ended is not None for c in found), (argv, run.calls)
    return found


@pytest.mark.parametrize("phase", ["boot", "check"])
def test_the_cc_queries_run_side_by_side(runs, phase):
    run = dict(zip(("boot", "check"), runs))[phase]
    queries = [calls_of(run, argv)[0] for argv in CC_QUERIES]
    for a, b in itertools.combinations(queries, 2):
        assert overlap(a, b), (a.argv, b.argv)


def test_the_health_gates_queries_run_side_by_side_beside_the_generation(runs):
    boot, _check = runs
    (remap,), (ecc,) = (calls_of(boot, argv) for argv, _stdout in HEALTH_QUERIES)
    assert overlap(remap, ecc)
    assert "remap pending 0" in next(s["message"] for s in boot.status["steps"]
                                     if s["name"] == "cdi")
    assert all(overlap(generate, remap) for generate in calls_of(boot, GENERATE)[:1])


def test_nvidia_ctks_version_is_read_while_persistenced_starts(runs):
    # not first in the cdi step (the longest lane), and not before the versions step said the
    # driver is usable (C04, C05, C25 forbid any nvidia-ctk call before that)
    from datetime import datetime

    boot, _check = runs
    steps = {s["name"]: s for s in boot.status["steps"]}

    def end(name: str) -> float:
        return datetime.fromisoformat(steps[name]["started_at"]).timestamp() \
            + steps[name]["duration_s"]

    (version,) = calls_of(boot, ["nvidia-ctk", "--version"])
    assert end("versions") < version.started < end("persistenced")
    (generate,) = calls_of(boot, GENERATE)
    assert version.ended < generate.started


def test_checks_rows_run_side_by_side_and_keep_their_order(runs):
    _boot, check = runs
    # the fabricmanager row's query and the confidential-computing row's run at once
    fabric = calls_of(check, FABRIC_QUERY)[0]
    assert all(overlap(fabric, calls_of(check, argv)[0]) for argv in CC_QUERIES)
    import json

    names = [row["name"] for row in json.loads(check.stdout)["checks"]]
    from podvm_gpu.check.vm import rows

    assert names == [n for n in rows() if n in names] and len(names) > 10


class Done:
    def __init__(self, returncode: int, output: str = ""):
        self.returncode, self.output = returncode, output


def test_the_answers_are_read_in_the_query_order():
    from podvm_gpu.errors import StepFailed
    from podvm_gpu.gpufacts import words
    from podvm_gpu.steps.cc import classify
    from podvm_gpu.steps.cc.query import answers

    first, second = classify.QUERIES[0], classify.QUERIES[1]

    def lost_then_broken(query):  # an exit 15 decides: what a later query raised is not read
        if query == first:
            return Done(words.NVSMI_GPU_LOST_RC)
        raise StepFailed(f"{query} broke")

    assert answers(lost_then_broken) == {first: (words.NVSMI_GPU_LOST_RC, "")}

    def both_raise(query):  # the earliest in the order is what a sequential ask raised
        if query in (first, second):
            raise StepFailed(f"{query} broke")
        return Done(0)

    with pytest.raises(StepFailed, match=f"^{first} broke"):
        answers(both_raise)


def test_a_call_started_ahead_does_not_outlive_a_boot_that_failed_before_its_step(
        umockdev_run):
    # nvidia-ctk's version is asked once the versions step passed; persistenced then fails and
    # the cdi step never reads it: the boot ends it, rather than leaving a hung call behind
    case = copy.deepcopy(load_case(DATA / "cases" / "P02-one-h100-pcie-ready.yaml"))
    for rule in case.tools:
        if rule["argv"] == ["nvidia-persistenced"]:
            rule.update(rc=1, delay_s=0.5, effects=[], stderr="persistenced: no GPU\n")
    case.tools.insert(0, _rule({"argv": ["nvidia-ctk", "--version"], "delay_s": 60}, []))
    with World(case) as world:
        boot = world.run("boot")
        (version,) = calls_of_started(world, ["nvidia-ctk", "--version"])
        assert boot.status["state"] == "failed" and "persistenced" in boot.status["reason"]
        assert boot.wall_s < 30, boot.wall_s
        assert not alive(version.pid), version  # ended with the boot (its group SIGKILLed)


def calls_of_started(world, argv):
    return [c for c in world.calls() if c.argv[:len(argv)] == argv]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
