"""The ordering rule, judged over a world's call log (issue 46 item 2; docs/interface.md,
"The ordering rule"): between the first ``modprobe nvidia`` and persistenced's readiness nothing
opens a GPU.

NVIDIA (nvtrust#109): persistenced "needs to be the first entity to load the GPU kernel driver,
else it may load-and-reload"; in a confidential multi-GPU guest the driver then loses GPUs. So
every run of every world (boot, rerun and check) is held to it: a call that opens a GPU and
starts after the driver's load began, or started before it and was still running then (an early
start), and before persistenced's readiness mark, is a problem, whichever thread of the agent
made it (the parallel branches included: the log has every call, whoever its caller).

What opens a GPU: the agent's own list of NVML clients (``podvm_gpu.host.proc.nvml_client``:
nvidia-smi in every subcommand, ``nvidia-ctk cdi generate``, ``nvattest attest``) and the other
NVIDIA programs that open ``/dev/nvidia*`` or load libnvidia-ml (:data:`OTHER_GPU_OPENERS`). A
call nvidia-smi refuses before it loads NVML (``harness refusal``: an unknown field or ``-d``
type, fake_tool.refusal) opens nothing. What the agent loads in its own process is not in the
call log: the metrics exporter's gate (``podvm_gpu.metrics.exporter.nvml_gate``) has its own tests.
"""

from __future__ import annotations

import json
import shlex

from podvm_gpu.host.proc import nvml_client

READY_MARK = "daemon_ready=persistenced"  # effects.Effects.apply records when it began
# NVIDIA programs outside nvml_client's list that open the GPUs: the fabric manager (it opens
# every GPU's device node to train NVLink), and the diagnostics that load libnvidia-ml
# (nvidia-debugdump, DCGM's nv-hostengine and dcgmi, the MPS control daemon).
OTHER_GPU_OPENERS = ("nv-fabricmanager", "nvidia-debugdump", "nv-hostengine", "dcgmi",
                     "nvidia-cuda-mps-control")
# What those print without opening anything (the versions step asks nv-fabricmanager --version
# right after modprobe: it prints its own build's version and exits).
ONLY_PRINTS = ("--version", "-v", "--help", "-h")


def opens_gpu(argv: list[str]) -> bool:
    """True for a call (argv[0] the basename, as the call log has it) that opens a GPU."""
    if not argv:
        return False
    return nvml_client(argv) or (argv[0] in OTHER_GPU_OPENERS
                                 and not any(word in ONLY_PRINTS for word in argv[1:]))


def loads_driver(argv: list[str]) -> bool:
    """True for ``modprobe nvidia`` (with or without module parameters): the driver's load."""
    return argv[:2] == ["modprobe", "nvidia"]


def preloaded(files: dict) -> bool:
    """True when the case's ``proc/modules`` lists ``nvidia`` before any run (a driver loaded
    before the agent: its load began before the world's first call)."""
    value = files.get("proc/modules") or ""
    text = value.get("content", "") if isinstance(value, dict) else value
    return any(line.split()[:1] == ["nvidia"] for line in str(text).splitlines())


def early_clients(calls: list, loaded_at: float | None, ready_at: float | None) -> list[str]:
    """Problems: the calls of ``calls`` that open a GPU inside the window.

    Args:
        calls: the calls to judge (``scenarios.world.Call``: ``argv``, ``started``, ``ended``
            (None: no exit recorded), ``answer``, ``run``), seconds on ``time.time()``'s clock.
        loaded_at: when the driver's load began (the first ``modprobe nvidia`` call's start;
            ``float("-inf")`` for a driver loaded before the world's first run), None when it
            never began (no window: nothing to judge).
        ready_at: when persistenced's readiness mark began, None when it never came (the window
            stays open).

    Returns:
        one line per offending call: its run, argv, and when it started against both marks.
    """
    if loaded_at is None:
        return []
    problems = []
    for call in calls:
        if not opens_gpu(call.argv) or call.answer.startswith("harness refusal"):
            continue
        if ready_at is not None and call.started >= ready_at:
            continue
        inside = call.started >= loaded_at
        early = not inside and (call.ended is None or call.ended > loaded_at)
        if not (inside or early):
            continue
        when = ("started before the driver's load and still ran at it" if early else
                f"started {call.started - loaded_at:.3f} s after the first modprobe nvidia")
        ready = ("persistenced never became ready" if ready_at is None else
                 f"{ready_at - call.started:.3f} s before persistenced's readiness")
        problems.append(f"ordering rule (interface.md; nvtrust#109): {call.run} "
                        f"{shlex.join(call.argv)} opens a GPU before persistenced: {when}, {ready}")
    return problems


def world_problems(world, calls: list) -> list[str]:
    """:func:`early_clients` for ``calls`` (one run's) in ``world`` (``scenarios.world.World``):
    the window from the world's first ``modprobe nvidia`` (any run) to the readiness mark in its
    ``state.json``."""
    everything = world.calls()
    loads = [call.started for call in everything if loads_driver(call.argv)]
    loaded_at = float("-inf") if preloaded(world.case.files) else (min(loads) if loads else None)
    with open(world.layout.state) as f:
        ready_at = (json.load(f).get("marked_at") or {}).get(READY_MARK)
    return early_clients(calls, loaded_at, ready_at)
