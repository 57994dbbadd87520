"""The SIGKILL loop (issue 10): at least 300 SIGKILLs of the boot at random points, then recovery.

The product process (umockdev-run's child, as the scenario harness starts it) is killed, over
and over, in the worlds of the 1-GPU (P02) and HGX (P03) scenarios. Two kinds of kill points:

- ``random``: a delay drawn uniformly from 0 to 1.1 x the scenario's measured boot time;
- ``write``: as soon as one of the atomic writes' temporary files is seen in the run or spec
  folder, after a random number of them: a kill in the middle of a write, which random
  delays seldom hit (a write takes about 0.3 ms of a boot of a second or two).

After each kill: ``status.json`` and ``/var/run/cdi/nvidia.yaml`` are absent or complete (the
product's own readers parse them; the spec passes its CDI validation, and a ready one its
ready-spec check), and no file that a CDI reader loads (``*.yaml``, ``*.json`` in /var/run/cdi
and /etc/cdi) is there but the agent's own spec. A world takes a few kills in a row (a killed
boot's leftovers meet the next boot), then a recovery boot must end ready and leave no
temporary file at all; a boot that ends before its kill point is such a recovery boot, and
ends the world's series.

``PODVM_GPU_KILLS`` (default 300) sets the number of kills, ``PODVM_GPU_KILL_SEED`` replays a
run's kill points (the seed is printed, and named in every failure; the machine's timing is
not replayed), ``PODVM_GPU_KILL_JOBS`` the worlds killed at once (default: the CPU count + 1: most of a kill
is waiting).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from scenarios.world import World

from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.cdi.ready import check_ready_spec
from podvm_gpu.errors import CdiSpecError
from podvm_gpu.host.fs import Root
from podvm_gpu.status import StatusUnreadable, load_status
from reliability.faults import SCENARIOS, final_state_problems, temp_files

KILLS = int(os.environ.get("PODVM_GPU_KILLS", "300"))
JOBS = int(os.environ.get("PODVM_GPU_KILL_JOBS", (os.cpu_count() or 1) + 1))
TIME_LIMIT_S = 900  # the loop's bound; about 3 minutes here with 3 jobs on a busy machine
SERIES = 8  # kills in one world before its recovery boot
WRITE_SHARE = 0.3  # share of kills aimed at a write
SCAN_DIRS = ("/var/run/cdi", "/etc/cdi")


@dataclasses.dataclass
class Tally:
    """What the loop did, for the assertion and docs/reliability.md."""

    kills: int = 0
    finished_first: int = 0  # boots that ended before their kill point
    recoveries: int = 0
    mid_write: int = 0  # kills that left a temporary file behind
    where: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    modes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    problems: list = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def product_child(umockdev_pid: int, deadline: float) -> int | None:
    """The pid of umockdev-run's child (the product), None if it has none by ``deadline``."""
    path = f"/proc/{umockdev_pid}/task/{umockdev_pid}/children"
    while time.monotonic() < deadline:
        try:
            children = Path(path).read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.0005)
    return None


def wait_for_writes(world: World, count: int, process, deadline: float) -> None:
    """Return when the ``count``-th atomic write is under way (a temporary file appears in the
    run or spec folder), the boot ended, or ``deadline`` passed; the folders are listed as
    fast as Python can, so most returns come while the temporary file is still there."""
    folders = [world.path("/run/podvm-gpu"), world.path("/var/run/cdi")]
    writes, present_before = 0, False
    while time.monotonic() < deadline and process.poll() is None:
        present = False
        for folder in folders:
            try:
                present = present or any(n.endswith(".tmp") for n in os.listdir(folder))
            except OSError:
                continue
        if present and not present_before:
            writes += 1
            if writes >= count:
                return
        present_before = present


def after_kill_problems(world: World) -> list[str]:
    """What must hold right after a kill (see the module docstring)."""
    problems = []
    root = Root(world.layout.root)
    try:
        load_status(root)
    except StatusUnreadable as err:
        problems.append(f"status.json is not complete: {err}")
    spec_path = Path(world.path("/var/run/cdi/nvidia.yaml"))
    if spec_path.exists():
        try:
            spec = parse_spec(spec_path.read_bytes(), source="/var/run/cdi/nvidia.yaml")
        except CdiSpecError as err:
            problems.append(f"the spec is not complete: {err}")
        else:
            if spec.device_names() != ["unavailable"]:
                problems += [f"the ready spec fails the ready-spec check: {p}" for p in
                             check_ready_spec(spec, root, list(range(world.case.gpu_count)))]
    for host_dir in SCAN_DIRS:
        folder = world.path(host_dir)
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        loaded = [n for n in names if n.endswith((".yaml", ".json"))
                  and not (host_dir == "/var/run/cdi" and n == "nvidia.yaml")]
        if loaded:
            problems.append(f"files a CDI reader loads in {host_dir}: {loaded}")
    return problems


def where_killed(world: World, previous_start: str | None) -> str:
    """The step the kill landed in, from status.json (``before status``: nothing written yet)."""
    try:
        status = load_status(Root(world.layout.root))
    except StatusUnreadable:
        return "unreadable"
    if status is None or status.get("started_at") == previous_start:
        return "before status"
    if status["state"] != "running":
        return f"ending ({status['state']})"
    running = [s["name"] for s in status.get("steps", []) if s.get("result") == "running"]
    return running[-1] if running else "between steps"


def calibrate(scenario) -> float:
    """The wall time of one whole boot of a fresh world (and a check that it ends ready)."""
    with World(scenario.case()) as world:
        run = world.run("boot")
        assert run.status and run.status["state"] == "ready", run.stderr
        return run.wall_s


def kill_series(scenario, boot_s: float, rng: random.Random, tally: Tally, quota, seed: int,
                deadline: float) -> None:
    """Kill boots of one fresh world until ``SERIES`` kills or the quota, then boot it to the
    end and judge the recovery; a boot that ends before its kill point is such a boot to the
    end already, is judged as the recovery, and ends the series."""
    with World(scenario.case()) as world:
        previous_start = None
        for _ in range(SERIES):
            if not quota() or time.monotonic() > deadline:
                break
            mode = "write" if rng.random() < WRITE_SHARE else "random"
            delay = rng.uniform(0, 1.1 * boot_s)
            writes = rng.randint(1, 25)
            outcome = {"killed": False}

            def kill(process, mode=mode, delay=delay, writes=writes, outcome=outcome):
                started = time.monotonic()
                pid = product_child(process.pid, started + 10)
                if mode == "write":
                    wait_for_writes(world, writes, process, started + 30)
                else:
                    time.sleep(max(0.0, started + delay - time.monotonic()))
                if pid is not None and process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        outcome["killed"] = True

            run = world.run("boot", during=kill)
            if not outcome["killed"]:
                with tally.lock:
                    tally.finished_first += 1
                judge_recovery(world, run, tally, scenario, seed)
                return
            left_temp = bool(temp_files(world.layout.root))
            where = where_killed(world, previous_start)
            problems = after_kill_problems(world)
            with tally.lock:
                tally.kills += 1
                tally.modes[mode] += 1
                tally.where[where] += 1
                tally.mid_write += left_temp
                tally.problems += [f"{scenario.name} kill {tally.kills} ({mode}, {where}, "
                                   f"seed {seed}): {p}" for p in problems]
            try:
                previous_start = (load_status(Root(world.layout.root)) or {}).get("started_at")
            except StatusUnreadable:
                previous_start = None
        judge_recovery(world, world.run("boot"), tally, scenario, seed)


def judge_recovery(world: World, run, tally: Tally, scenario, seed: int) -> None:
    """A boot that ran to its end after kills: ready, and everything final_state_problems
    asks of any boot's end (no temporary file left anywhere included)."""
    problems = final_state_problems(world, run, budget_s=240)
    if (run.status or {}).get("state") != "ready":
        problems.append(f"the recovery boot ended {(run.status or {}).get('state')!r}: "
                        f"{(run.status or {}).get('reason')}")
    with tally.lock:
        tally.recoveries += 1
        tally.problems += [f"{scenario.name} recovery (seed {seed}): {p}" for p in problems]


@pytest.mark.slow
def test_300_sigkills_at_random_points_leave_nothing_torn_and_the_next_boot_recovers():
    seed = int(os.environ.get("PODVM_GPU_KILL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"kill loop seed {seed} (PODVM_GPU_KILL_SEED={seed} replays its kill points)")
    scenarios = [s for s in SCENARIOS if s.name in ("P02", "P03")]
    boot_s = {s.name: calibrate(s) for s in scenarios}
    tally = Tally()
    deadline = time.monotonic() + TIME_LIMIT_S
    started = time.monotonic()

    def quota() -> bool:
        with tally.lock:
            return tally.kills < KILLS

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while quota() and time.monotonic() < deadline:
            scenario = scenarios[rng.randrange(len(scenarios))]
            kill_series(scenario, boot_s[scenario.name], rng, tally, quota, seed, deadline)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(max(JOBS, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    print(f"{tally.kills} kills ({dict(tally.modes)}) in {took:.0f} s, {tally.mid_write} in the "
          f"middle of a write, {tally.recoveries} recovery boots ({tally.finished_first} of them "
          f"boots that ended before their kill point); calibration {boot_s}; kills by step: "
          f"{dict(tally.where.most_common())}")

    assert not tally.problems, "\n".join(tally.problems[:30])
    assert tally.kills >= KILLS, f"only {tally.kills} kills within {TIME_LIMIT_S} s (seed {seed})"
    assert tally.mid_write > 0, "no kill landed in the middle of a write: the write kills missed"
