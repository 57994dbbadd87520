"""A fabric manager that starts and dies ends the fabric wait at once (issue 28, NVSentinel#883):
podvm_gpu/steps/fabric/fm_watch.py's pid-file and process check, one look at a time, on a temporary root
(the boot-level proof is scenario S100 and the fabric wait test below)."""

from __future__ import annotations

import time

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.host.daemons import Daemon
from podvm_gpu.host.fs import Root
from podvm_gpu.readers import FABRICMANAGER_PID
from podvm_gpu.steps.fabric import fm_watch
from podvm_gpu.steps.fabric.fm_watch import FmWatch


class FakeDaemon(Daemon):
    where = "pid 4242, output in nv-fabricmanager.log"

    def __init__(self, code, words=""):
        self.code, self.words = code, words

    def exit_status(self):
        return self.code

    def last_words(self):
        return self.words


def live(root, pid=4321, comm="nv-fabricmanage"):
    (root / "var/run/nvidia-fabricmanager").mkdir(parents=True, exist_ok=True)
    (root / FABRICMANAGER_PID.lstrip("/")).write_text(f"{pid}\n")
    (root / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
    (root / f"proc/{pid}/comm").write_text(comm + "\n")


def die(root, pid=4321):
    (root / f"proc/{pid}/comm").unlink()


def test_a_running_daemon_passes_and_a_managed_outside_fabric_has_nothing_to_watch(tmp_path):
    live(tmp_path)
    FmWatch(Root(tmp_path), FakeDaemon(0)).check("x")
    FmWatch(Root(tmp_path), None, None).check("x")
    (tmp_path / FABRICMANAGER_PID.lstrip("/")).unlink()
    FmWatch(Root(tmp_path), None, None).check("x")  # kind none: no fabric manager of ours


def test_a_first_process_still_running_is_not_judged_by_the_pid_file(tmp_path):
    FmWatch(Root(tmp_path), FakeDaemon(None)).check("x")  # no pid file yet: still starting


def test_exit_0_without_a_daemon_fails_after_the_grace_naming_the_words(tmp_path, monkeypatch):
    monkeypatch.setattr(fm_watch, "FM_STARTED_GRACE_S", 0.2)
    watch = FmWatch(Root(tmp_path), FakeDaemon(0, "cannot open /dev/nvidia-nvswitchctl"))
    watch.check("State In Progress")  # within the grace: the daemon may still write its pid
    time.sleep(0.25)
    with pytest.raises(StepFailed) as err:
        watch.check("State In Progress, Status N/A on 8 GPU(s)")
    assert str(err.value) == (
        "nv-fabricmanager exited 0 but no fabric manager runs (no live pid in "
        f"{FABRICMANAGER_PID} 0.2 s later): cannot open /dev/nvidia-nvswitchctl; last seen: "
        "State In Progress, Status N/A on 8 GPU(s)")


def test_a_pid_file_naming_another_program_is_no_fabric_manager(tmp_path, monkeypatch):
    monkeypatch.setattr(fm_watch, "FM_STARTED_GRACE_S", 0)
    live(tmp_path, comm="sshd")
    with pytest.raises(StepFailed, match="exited 0 but no fabric manager runs"):
        FmWatch(Root(tmp_path), FakeDaemon(0)).check("x")


def test_a_daemon_seen_running_that_dies_fails_at_the_next_look(tmp_path):
    live(tmp_path)
    daemon = FakeDaemon(0, "")
    watch = FmWatch(Root(tmp_path), daemon)
    watch.check("x")
    die(tmp_path)
    with pytest.raises(StepFailed) as err:
        watch.check("State In Progress, Status N/A on 8 GPU(s)")
    # the first process's exit 0 is the hand-over, not how the daemon ended: not named
    assert str(err.value) == ("nv-fabricmanager (pid 4321) is no longer running during the "
                              "fabric wait; last seen: State In Progress, Status N/A on 8 GPU(s)")


class LateRecord(FakeDaemon):
    """systemd's unit state read a moment after the pid vanished (UnitDaemon polls it)."""

    def __init__(self, code, words, after_s):
        super().__init__(code, words)
        self.at = time.monotonic() + after_s

    def exit_status(self):
        return self.code if time.monotonic() >= self.at else None


def test_systemds_record_of_the_daemons_end_is_named_when_it_comes_late(tmp_path):
    """Under systemd the unit's main process record says how the daemon ended (-9: SIGKILL),
    read up to SETTLE_S after the pid vanished."""
    live(tmp_path)
    watch = FmWatch(Root(tmp_path), LateRecord(-9, "fm: last line", after_s=0.3))
    watch.check("x")
    die(tmp_path)
    with pytest.raises(StepFailed) as err:
        watch.check("x")
    assert str(err.value) == ("nv-fabricmanager (pid 4321) was killed by SIGKILL during the "
                              "fabric wait: fm: last line; last seen: x")


def test_a_fabric_manager_found_running_that_dies_fails_without_a_started_daemon(tmp_path):
    live(tmp_path, pid=777)
    watch = FmWatch(Root(tmp_path), None, pid=777)
    watch.check("x")
    die(tmp_path, pid=777)
    with pytest.raises(StepFailed, match=r"^nv-fabricmanager \(pid 777\) is no longer running "
                                         r"during the fabric wait; last seen: x$"):
        watch.check("x")


def test_a_non_zero_exit_fails_at_once_with_its_words(tmp_path):
    with pytest.raises(StepFailed, match=r"^nv-fabricmanager exited with status 1: bad config; "
                                         r"last seen: x$"):
        FmWatch(Root(tmp_path), FakeDaemon(1, "bad config")).check("x")


def test_a_fabric_manager_that_dies_mid_wait_fails_the_boot_within_the_poll_plus_5_s():
    """The boot-level proof for a daemon that ran and died (S100 is the one that never ran):
    the P03 world (8 x H200, 4 NVSwitch) whose fabric stays In Progress with a 120 s wait and a
    1 s poll; once the wait has looked at the running fabric manager its process goes (its
    /proc/<pid>/comm under the root, what the boot reads, and the stand-in itself)."""
    import copy
    import os
    import signal
    import threading

    from scenarios.world import DATA, World, load_case

    world_case = copy.deepcopy(load_case(DATA / "cases" / "P03-hgx-h200-8gpu-4nvswitch-ready.yaml"))
    world_case.files["etc/podvm-gpu/config.yaml"] = (
        "fabricmanager: {ready_timeout_s: 120, per_gpu_s: 0, poll_s: 1}\n")
    fm = next(r for r in world_case.tools if r["argv"] == ["nv-fabricmanager"])
    fm["effects"] = [{"fabric": "in-progress"}]
    killed = {}

    def fabric_queries(calls: str) -> int:
        try:
            with open(calls) as f:
                return sum(1 for line in f if '"start"' in line and "fabric.state" in line)
        except OSError:
            return 0

    def kill_it(root: str, calls: str, stop: threading.Event) -> None:
        pid_file = os.path.join(root, FABRICMANAGER_PID.lstrip("/"))
        while not stop.is_set() and not os.path.exists(pid_file):
            time.sleep(0.05)
        seen = fabric_queries(calls)
        # two more fabric queries started: the first answered, the wait looked at the daemon
        while not stop.is_set() and fabric_queries(calls) < seen + 2:
            time.sleep(0.05)
        if stop.is_set():
            return
        pid = int(open(pid_file).read())
        os.unlink(os.path.join(root, f"proc/{pid}/comm"))
        os.kill(pid, signal.SIGKILL)
        killed["at"] = time.monotonic()

    with World(world_case) as world:
        stop = threading.Event()
        killer = threading.Thread(target=kill_it, args=(world.layout.root, world.layout.calls,
                                                        stop))
        killer.start()
        try:
            run = world.run("boot")
        finally:
            stop.set()
            killer.join()
        ended = time.monotonic()

    assert run.rc == 1, run.stderr
    reason = run.status["reason"]
    assert reason.startswith("fabricmanager: nv-fabricmanager (pid "), reason
    assert "is no longer running during the fabric wait; last seen: State In Progress" in reason
    assert "at" in killed
    assert ended - killed["at"] < 1 + 5, ended - killed["at"]
    step = next(s for s in run.status["steps"] if s["name"] == "fabricmanager")
    assert step["duration_s"] < 1 + 1 + 5, step
