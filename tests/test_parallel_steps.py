"""The three steps after persistenced run at once (pipeline.py): the fabric wait, the CC step and
the spec's generation. What must hold (issue 12): the spec is installed only when all three
succeeded; a failure ends the boot as a sequential boot would, with the reason of the earliest
step in the step order that failed, whichever failed first in time; a failure stops the steps
after it at once. Each test is the 8 x H200 + 4 NVSwitch field case (P03) through the scenario
harness with tool times and answers changed.
"""

from __future__ import annotations

import copy

from scenarios.world import DATA, SHARED, World, load_case

UNKNOWN_CC = "CC status: PENDING\n"  # not on, not off: the CC step fails closed


def p03():
    name = "P03-hgx-h200-8gpu-4nvswitch-ready.yaml"
    return copy.deepcopy(load_case(next(p for p in (SHARED / "cases" / name,
                                                    DATA / "cases" / name) if p.exists())))


def rule(case, argv: list[str]) -> dict:
    return next(r for r in case.tools if r["argv"] == argv)


def steps_of(run) -> dict[str, dict]:
    return {s["name"]: s for s in run.status["steps"]}


def unavailable(world) -> bool:
    text = (world.layout.root + "/var/run/cdi/nvidia.yaml")
    with open(text, encoding="utf-8") as f:
        return "unavailable" in f.read()


def boot(case):
    with World(case) as world:
        run = world.run("boot")
        return run, world.calls(), unavailable(world)


def test_a_cc_failure_waits_for_the_fabric_as_a_sequential_boot_would():
    case = p03()
    rule(case, ["nvidia-smi", "conf-compute", "-f"])["stdout"] = UNKNOWN_CC
    rule(case, ["nv-fabricmanager"])["delay_s"] = 2.0  # the fabric completes 2 s after start

    run, calls, spec_unavailable = boot(case)

    assert run.status["state"] == "failed"
    assert run.status["reason"].startswith("confidential-computing: unknown CC status"), \
        run.status["reason"]
    steps = steps_of(run)
    assert steps["fabricmanager"]["result"] == "ok", steps["fabricmanager"]
    assert steps["fabricmanager"]["duration_s"] >= 2.0
    assert spec_unavailable


def test_when_both_fail_the_fabrics_reason_wins_though_cc_failed_first():
    case = p03()
    rule(case, ["nvidia-smi", "conf-compute", "-f"])["stdout"] = UNKNOWN_CC  # fails at once
    fm = rule(case, ["nv-fabricmanager"])
    fm["delay_s"], fm["effects"] = 1.5, [{"fabric": "insufficient-resources"}]

    run, _calls, spec_unavailable = boot(case)

    assert run.status["reason"].startswith("fabricmanager: "), run.status["reason"]
    assert "insufficient" in run.status["reason"].lower() or "unhealthy" in run.status["reason"]
    steps = steps_of(run)
    assert steps["confidential-computing"]["result"] == "failed"
    assert spec_unavailable


def test_a_fabric_failure_stops_a_slow_generation_at_once():
    case = p03()
    fm = rule(case, ["nv-fabricmanager"])
    fm["effects"] = [{"fabric": "insufficient-resources"}]
    # the fabric fails 1 s in, so the generation has surely started beside it (on a loaded
    # machine a fabric failed at once could stop the cdi step before nvidia-ctk ran at all,
    # and there would be no generation to see stopped)
    fm["delay_s"] = 1.0
    rule(case, ["nvidia-ctk", "cdi", "generate"])["delay_s"] = 60

    run, calls, spec_unavailable = boot(case)

    assert run.status["reason"].startswith("fabricmanager: "), run.status["reason"]
    assert run.wall_s < 20, run.wall_s  # not the 60 s of the generation
    cdi = steps_of(run)["cdi"]
    assert cdi["result"] == "skipped" and "fabricmanager failed" in cdi["message"], cdi
    (generate,) = [c for c in calls if c.argv[:3] == ["nvidia-ctk", "cdi", "generate"]]
    assert generate.rc is None or generate.signals, generate  # ended by the agent, not finished
    assert spec_unavailable


def test_a_failed_generation_waits_for_the_fabric_then_names_cdi():
    case = p03()
    rule(case, ["nv-fabricmanager"])["delay_s"] = 2.0
    gen = rule(case, ["nvidia-ctk", "cdi", "generate"])
    gen["rc"], gen["effects"], gen["stderr"] = 1, [], "level=error msg=\"failed to initialize NVML\"\n"

    run, _calls, spec_unavailable = boot(case)

    assert run.status["reason"].startswith("cdi: nvidia-ctk cdi generate failed (exit 1)"), \
        run.status["reason"]
    assert steps_of(run)["fabricmanager"]["result"] == "ok"
    assert spec_unavailable


def test_the_generation_runs_while_the_fabric_trains_and_the_spec_waits_for_it():
    case = p03()
    rule(case, ["nv-fabricmanager"])["delay_s"] = 2.0
    rule(case, ["nvidia-ctk", "cdi", "generate"])["delay_s"] = 1.0

    run, calls, spec_unavailable = boot(case)

    assert run.status["state"] == "ready", run.status["reason"]
    (fm,) = [c for c in calls if c.argv == ["nv-fabricmanager"] or
             c.argv[:1] == ["nv-fabricmanager"] and "--version" not in c.argv]
    (generate,) = [c for c in calls if c.argv[:3] == ["nvidia-ctk", "cdi", "generate"]]
    assert generate.started < fm.started + 2.0  # generated before the fabric completed
    assert generate.ended is not None and generate.ended < fm.started + 2.0
    assert not spec_unavailable
    assert run.status["cdi"]["devices"]


def _protected_pcie(case, fabric_delay_s: float):
    """P03 as a Protected PCIe HGX (CC off per GPU, -mgm Protected PCIe) whose ready state the
    agent may set, the fabric completing ``fabric_delay_s`` after the fabric manager starts."""
    for argv in (["nvidia-smi", "conf-compute", "-mgm"],
                 ["nvidia-smi", "conf-compute", "--get-multigpu-mode"]):
        rule(case, argv)["stdout"] = "Multi-GPU Mode: Protected PCIe\n"
    answer = {"rc": 0, "stderr": "", "delay_s": 0, "effects": []}
    case.tools[:0] = [  # nvidia-smi's words (../shared/nvidia-smi-real.md)
        {**answer, "argv": ["nvidia-smi", "conf-compute", "-grs"],
         "stdout": "\nConfidential Compute GPUs Ready state: not-ready\n\n"},
        {**answer, "argv": ["nvidia-smi", "conf-compute", "-srs", "1"], "stdout": "",
         "effects": [{"cc_ready_state": "ready"}]}]
    case.files["etc/podvm-gpu/config.yaml"] = "confidential_computing: {set_ready_state: true}\n"
    rule(case, ["nv-fabricmanager"])["delay_s"] = fabric_delay_s
    return case


def test_cc_is_read_beside_the_fabric_and_the_ready_state_set_only_after_it_succeeded():
    case = _protected_pcie(p03(), 2.0)

    run, calls, spec_unavailable = boot(case)

    assert run.status["state"] == "ready", run.status["reason"]
    (fm,) = [c for c in calls if c.argv[:1] == ["nv-fabricmanager"] and "--version" not in c.argv]
    (mode,) = [c for c in calls if c.argv == ["nvidia-smi", "conf-compute", "-f"]]
    (srs,) = [c for c in calls if c.argv[:3] == ["nvidia-smi", "conf-compute", "-srs"]]
    assert mode.started < fm.started + 2.0  # the CC state is read while the fabric trains
    assert srs.started >= fm.started + 2.0  # the ready state only once the fabric is up
    cc = steps_of(run)["confidential-computing"]
    assert "Protected PCIe" in cc["message"] and "after the fabric" in cc["message"], cc
    assert run.status["confidential_computing"]["mode"] == "ppcie"
    assert not spec_unavailable


def test_the_ready_state_is_never_set_when_the_fabric_fails():
    case = _protected_pcie(p03(), 1.0)
    rule(case, ["nv-fabricmanager"])["effects"] = [{"fabric": "insufficient-resources"}]

    run, calls, spec_unavailable = boot(case)

    assert run.status["reason"].startswith("fabricmanager: "), run.status["reason"]
    assert not [c for c in calls if c.argv[:3] == ["nvidia-smi", "conf-compute", "-srs"]]
    assert spec_unavailable


def test_a_signal_while_the_branches_are_being_started_stops_only_the_started_ones():
    # run_all starts the branches one after another (each once the one before has its first
    # call in flight); SIGTERM between two starts reached stop() with a branch not started
    # yet, whose join raised "cannot join thread before it is started" (a Traceback on stderr,
    # the boot's end named an internal error)
    import threading
    import types

    from podvm_gpu.boot.pipeline import Steps
    from podvm_gpu.host.proc import Runner

    ctx = types.SimpleNamespace(runner=Runner(), stopped_because="")
    steps = Steps(ctx, run=None)
    started = threading.Thread(target=lambda: None)
    started.start()
    steps.threads = [started, threading.Thread(target=lambda: None)]
    steps.stop("the boot is ending", wait_s=1.0)
    assert ctx.stopping.is_set() and ctx.runner.cancelled == "the boot is ending"
