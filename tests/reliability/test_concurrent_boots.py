"""Concurrent boots beyond tests/test_boot_ends.py (two boots, one waiting): three at once with a
``status --wait`` beside them, a lock holder killed while another boot waits, and waiting boots
that are killed or stopped while the holder runs. All on the 1-GPU world (P02).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from scenarios.world import World
from test_boot_ends import p02, product_pid, wait_for_call, with_slow_call

from reliability.faults import final_state_problems, temp_files

GENERATE = ["nvidia-ctk", "cdi", "generate"]


class Boot:
    """One product boot started in a world, its output in files of its own."""

    def __init__(self, world: World, name: str):
        self.out = Path(world.layout.out, f"{name}.stdout").open("w+")
        self.err = Path(world.layout.out, f"{name}.stderr").open("w+")
        self.process = world.start_product(world.product_argv(), self.out, self.err)
        self.pid = product_pid(self.process)

    def stderr(self) -> str:
        return Path(self.err.name).read_text()

    def wait_until_it_says(self, text: str, timeout_s: float = 15) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.stderr():
            assert time.monotonic() < deadline, f"never said {text!r}: {self.stderr()}"
            time.sleep(0.02)

    def finish(self, timeout_s: float = 60) -> tuple[int, dict | None]:
        rc = self.process.wait(timeout=timeout_s)
        text = Path(self.out.name).read_text()
        self.out.close()
        self.err.close()
        return rc, json.loads(text) if text.strip() else None


def status_wait(world: World) -> subprocess.Popen:
    """``podvm-gpu status --wait --json`` on the world's root, as a script polls it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-m", "podvm_gpu", "status", "--root",
                             world.layout.root, "--wait", "--timeout", "60", "--json"],
                            stdout=subprocess.PIPE, text=True, env=env)


def hang_once(world: World, argv: list[str]) -> Path:
    """The first call that starts with ``argv`` never answers; the later ones are the world's.
    Returns the file that call makes when it starts."""
    bin_dir = Path(world.layout.bin)
    (bin_dir / ".orig").mkdir(exist_ok=True)
    original = bin_dir / ".orig" / argv[0]
    (bin_dir / argv[0]).rename(original)
    marker = Path(world.layout.dir, "hung-once")
    args = " ".join(argv[1:])
    (bin_dir / argv[0]).write_text(
        f'#!/bin/sh\ncase "$*" in "{args}"*) if [ ! -e {marker} ]; then : > {marker}; exec '
        f"{shlex.quote(sys.executable)} -IS -c 'import time; time.sleep(3600)' "
        f'{world.layout.dir}/hung; fi;; esac\nexec {original} "$@"\n')
    (bin_dir / argv[0]).chmod(0o755)
    return marker


def test_three_boots_at_once_run_one_after_another_and_all_end_ready():
    case = with_slow_call(p02(), GENERATE, "hang", delay_s=1)
    with World(case) as world:
        watcher = status_wait(world)
        boots = [Boot(world, f"boot{i}") for i in range(3)]
        ends = [boot.finish() for boot in boots]
        watched = json.loads(watcher.communicate(timeout=60)[0])
        calls = world.calls()
        final = json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())

        assert [rc for rc, _doc in ends] == [0, 0, 0], [b.stderr() for b in boots]
        assert [doc["state"] for _rc, doc in ends] == ["ready"] * 3
        assert watcher.returncode == 0 and watched["state"] == "ready"
        # the lock runs them one at a time: no call of one boot overlaps another boot's calls
        spans = sorted((min(c.started for c in mine), max(c.ended for c in mine), i)
                       for i, mine in enumerate([c for c in calls if c.ppid == b.pid]
                                                for b in boots) if mine)
        assert len(spans) == 3, spans
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        # the first one set everything up; the others started nothing again
        assert len([c for c in calls if c.argv[0] == "nvidia-persistenced"]) == 1
        assert len({c.ppid for c in calls if c.argv[0] == "modprobe"}) == 1
        assert final == ends[spans[-1][2]][1]  # the status is the last boot's document
        assert not temp_files(world.layout.root)


def test_a_boot_killed_while_another_waits_for_the_lock_hands_it_over_at_once():
    case = p02()
    with World(case) as world:
        hung = hang_once(world, GENERATE)
        holder = Boot(world, "holder")
        deadline = time.monotonic() + 30
        while not hung.exists():
            assert time.monotonic() < deadline, holder.stderr()
            time.sleep(0.02)
        waiter = Boot(world, "waiter")
        waiter.wait_until_it_says("another boot holds")
        killed_at = time.time()
        os.kill(holder.pid, signal.SIGKILL)
        holder.process.wait(timeout=10)
        rc, doc = waiter.finish()
        calls = [c for c in world.calls() if c.ppid == waiter.pid]
        run = world.run("rerun")  # and a boot after both judges the root as any boot's end

        assert rc == 0 and doc["state"] == "ready", waiter.stderr()
        # flock is released by the kernel with the holder: the waiter starts within a poll
        assert calls and min(c.started for c in calls) - killed_at < 2, calls
        assert not [c for c in calls if c.argv[0] in ("modprobe", "nvidia-persistenced")]
        assert "got /run/podvm-gpu/boot.lock after" in waiter.stderr()
        assert not final_state_problems(world, run, budget_s=240)
        assert run.status["state"] == "ready"


def test_waiting_boots_that_are_killed_or_stopped_leave_the_holder_s_boot_alone():
    case = with_slow_call(p02(), GENERATE, "hang", delay_s=2)
    with World(case) as world:
        holder = Boot(world, "holder")
        wait_for_call(world, GENERATE)
        running = json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())
        killed, stopped = Boot(world, "killed"), Boot(world, "stopped")
        for boot in (killed, stopped):
            boot.wait_until_it_says("another boot holds")
        os.kill(killed.pid, signal.SIGKILL)
        os.kill(stopped.pid, signal.SIGTERM)
        stopped_rc, stopped_doc = stopped.finish(timeout_s=10)
        meanwhile = json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())
        rc, doc = holder.finish()
        killed.process.wait(timeout=10)

        assert stopped_rc == 1 and stopped_doc is None
        assert "stopped by SIGTERM before this boot began (nothing written)" in stopped.stderr()
        assert meanwhile["started_at"] == running["started_at"] and meanwhile["state"] == "running"
        assert rc == 0 and doc["state"] == "ready" and doc["started_at"] == running["started_at"]
        assert not [c for c in world.calls() if c.ppid in (killed.pid, stopped.pid)]
        assert not temp_files(world.layout.root)
