"""Every end of a boot is a final state (issue 8): SIGTERM and SIGINT in every step that runs a
tool or waits, spec and status writes that fail, and two boots at once on one root.

The scenario worlds (tests/scenarios) run the real ``podvm-gpu boot`` under umockdev with fake
tools; P02 (one H100 PCIe, every tool succeeds) is the base, with one tool made to hang so that
the signal arrives while that step is in flight. The daemon lifetime under a real systemd is
proven by the boot tests (test_boot_nspawn.py, test_boot_qemu.py).
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from scenarios.fake_tool import argv_matches
from scenarios.world import DATA, SHARED, World, load_case
from schemas import assert_status_conforms

HANG_S = 60
# step -> (the call that is in flight in that step, how it is made to take long)
IN_FLIGHT = {
    "modules": (["modprobe", "nvidia"], "hang"),
    "device-nodes": (["nvidia-ctk", "system", "create-device-nodes"], "hang"),
    "persistenced": (["nvidia-persistenced"], "hang"),  # spawned, not ready: the wait runs
    "fabricmanager": (["nvidia-smi", "--query-gpu=pci.bus_id,fabric.state,fabric.status"],
                      "hang"),
    "confidential-computing": (["nvidia-smi", "conf-compute", "-f"], "hang"),
    "cdi": (["nvidia-ctk", "cdi", "generate"], "hang"),
}
AFTER_PERSISTENCED = ("fabricmanager", "confidential-computing", "cdi")


def p02():
    name = "P02-one-h100-pcie-ready.yaml"
    return load_case(next(p for p in (SHARED / "cases" / name, DATA / "cases" / name)
                          if p.exists()))


def with_slow_call(case, argv: list[str], how: str, delay_s: float = HANG_S):
    """A copy of ``case`` whose ``argv`` call takes ``delay_s`` (or, for persistenced, whose
    daemon starts but never becomes ready)."""
    case = copy.deepcopy(case)
    rules = [rule for rule in case.tools if rule["argv"] == argv]
    for rule in rules:
        if how == "never-ready":
            rule["effects"] = []
        else:
            rule["delay_s"] = delay_s
    if not rules:  # a query the harness answers: a rule of its own that only hangs
        case.tools.insert(0, {"argv": argv, "rc": 0, "stdout": "", "stderr": "",
                              "delay_s": delay_s, "effects": [], "only_before": {}})
    return case


def product_pid(umockdev: subprocess.Popen, timeout_s: float = 10) -> int:
    """The product's own pid: the child of umockdev-run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == umockdev.pid:
                return int(entry)
        time.sleep(0.01)
    raise AssertionError("umockdev-run started no product")


def wait_for_call(world: World, argv: list[str], ended: bool = False, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        calls = [c for c in world.calls() if argv_matches(argv, c.argv)]
        if calls and (not ended or calls[0].ended is not None):
            return calls[0]
        time.sleep(0.02)
    raise AssertionError(f"no call of {argv} within {timeout_s} s: {world.calls()}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("step", IN_FLIGHT)
def test_a_signal_in_any_step_ends_the_boot_failed_within_2_s_naming_signal_and_step(step, signum):
    argv, how = IN_FLIGHT[step]
    case = with_slow_call(p02(), argv, how)
    took = {}

    def interrupt(process):
        wait_for_call(world, argv)
        if step == "persistenced":
            time.sleep(0.3)  # well inside the wait for the socket
        pid = product_pid(process)
        started = time.monotonic()
        os.kill(pid, signum)
        process.wait(timeout=10)
        took["s"] = time.monotonic() - started

    with World(case) as world:
        run = world.run("boot", during=interrupt)
        name = signal.Signals(signum).name

        assert took["s"] < 2, f"{name} took {took['s']:.2f} s to end the boot"
        assert run.rc == 1, run.stderr
        assert "Traceback" not in run.stderr, run.stderr
        status = run.status
        assert status["state"] == "failed" and status["finished_at"], status
        assert_status_conforms(status)
        # After persistenced three steps run at once: the reason names the earliest in flight
        # and the others; each is failed with the signal.
        reason = status["reason"]
        assert reason.startswith(f"{step}: interrupted by {name}") or (
            step in AFTER_PERSISTENCED and f"interrupted by {name}" in reason
            and step in reason), reason
        # the cause the reason offers is the signal's: Ctrl-C is not a stopped unit (issue 21)
        cause = "(Ctrl-C, or kill -INT)" if signum == signal.SIGINT else "(the unit was stopped"
        assert f"interrupted by {name} {cause}" in reason, reason
        results = {s["name"]: (s["result"], s["message"]) for s in status["steps"]}
        assert results[step][0] == "failed" and name in results[step][1], results[step]
        assert "running" not in [r for r, _ in results.values()], "every step has an end"
        spec = yaml.safe_load(Path(world.path("/var/run/cdi/nvidia.yaml")).read_text())
        assert [d["name"] for d in spec["devices"]] == ["unavailable"]
        assert "PODVM_GPU_STATE=failed" in spec["devices"][0]["containerEdits"]["env"]
        daemons = {d["pid"] for d in run.daemons}
        if step in AFTER_PERSISTENCED:
            assert daemons and daemons <= run.alive_at_exit, "the daemon is left alone"
        if step == "persistenced":  # the daemon still starting up is one too, never killed
            daemons |= {c.pid for c in run.calls if c.argv[0] == "nvidia-persistenced"}
            assert daemons <= run.alive_at_exit, "a daemon initialising GPUs is never killed"
        # the tool in flight was ended with the boot; nothing but the daemons is left
        assert run.alive_at_exit <= daemons, (run.alive_at_exit, daemons)


def test_a_second_boot_waits_for_the_lock_writes_nothing_meanwhile_and_starts_no_daemon_again():
    case = with_slow_call(p02(), ["nvidia-ctk", "cdi", "generate"], "hang", delay_s=2)
    second = {}

    def start_second_boot(process):
        wait_for_call(world, ["nvidia-persistenced"], ended=True)
        before = Path(world.path("/run/podvm-gpu/status.json")).read_text()
        err = open(Path(world.layout.out, "second.stderr"), "w+")
        out = open(Path(world.layout.out, "second.stdout"), "w+")
        second["process"] = world.start_product(world.product_argv(), out, err)
        second["pid"] = product_pid(second["process"])
        deadline = time.monotonic() + 10
        while "another boot holds" not in Path(err.name).read_text():
            assert time.monotonic() < deadline, "the second boot never said it waits"
            time.sleep(0.02)
        time.sleep(0.3)
        second["status_meanwhile"] = Path(world.path("/run/podvm-gpu/status.json")).read_text()
        second["status_before"] = before
        second["files"] = (out, err)

    with World(case) as world:
        first = world.run("boot", during=start_second_boot)
        assert second["process"].wait(timeout=30) == 0, Path(second["files"][1].name).read_text()
        # the daemons' launchers are not waited for (a detached spawn: the step waits for the
        # daemon's socket, not its launcher's exit, which a loaded machine may delay)
        # (first.calls is every call of a "boot" run the world logged when the first ended: a
        # second boot quick to its first call has one there too; it is not the first's)
        first_end = max(c.ended for c in first.calls if c.ended and c.argv[0] not in
                        ("nvidia-persistenced", "nv-fabricmanager") and c.ppid != second["pid"])
        first_pid = {c.ppid for c in world.calls() if c.ppid != second["pid"]}
        second_calls = [c for c in world.calls() if c.ppid == second["pid"]]

        assert first.rc == 0 and first.status is not None
        # while it waited, the second boot wrote nothing, not even "running"
        meanwhile = json.loads(second["status_meanwhile"])
        assert meanwhile["started_at"] == json.loads(second["status_before"])["started_at"]
        # it ran its steps only after the first boot was done, and started no daemon again
        assert second_calls and min(c.started for c in second_calls) >= first_end
        assert len(first_pid) == 1
        started = [c for c in world.calls() if c.argv[0] == "nvidia-persistenced"]
        assert len(started) == 1, started
        assert not [c for c in second_calls if c.argv[0] in ("modprobe", "nvidia-persistenced")]
        final = json.loads(Path(world.path("/run/podvm-gpu/status.json")).read_text())
        assert final["state"] == "ready" and final["started_at"] != meanwhile["started_at"]
        spec = yaml.safe_load(Path(world.path("/var/run/cdi/nvidia.yaml")).read_text())
        assert {"0", "all"} <= {d["name"] for d in spec["devices"]}
        for f in second["files"]:
            f.close()


# --- the lock, and writes that fail: the real command on the CPU-VM device tree -----------------

def boot(podvm, root: Path, empty_path: str, timeout: float = 30):
    return podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path},
                 timeout=timeout)


def status_of(root: Path) -> dict:
    return json.loads((root / "run/podvm-gpu/status.json").read_text())


def test_a_boot_that_never_gets_the_lock_ends_within_its_budget_writing_nothing(tmp_path, podvm,
                                                                              empty_path):
    (tmp_path / "etc/podvm-gpu").mkdir(parents=True)
    (tmp_path / "etc/podvm-gpu/config.yaml").write_text("budget_s: 1\n")
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    with open(tmp_path / "run/podvm-gpu/boot.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        done = boot(podvm, tmp_path, empty_path)
        took = time.monotonic() - started

    assert done.returncode == 1
    assert 1 <= took < 5, took
    assert "another boot still holds /run/podvm-gpu/boot.lock after 1 s" in done.stderr
    assert sorted(os.listdir(tmp_path / "run/podvm-gpu")) == ["boot.lock"]
    assert not (tmp_path / "var").exists()


def test_a_killed_boot_leaves_the_lock_free(tmp_path, podvm, empty_path):
    """flock is the kernel's: the holder's death releases it, so no stale lock blocks a boot."""
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    holder = subprocess.Popen(["python3", "-c", "import fcntl,sys,time; f=open(sys.argv[1],'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); time.sleep(60)",
                               str(tmp_path / "run/podvm-gpu/boot.lock")], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"1"
    holder.kill()
    holder.wait()

    done = boot(podvm, tmp_path, empty_path, timeout=10)

    assert done.returncode == 0, done.stderr
    assert status_of(tmp_path)["state"] == "no-gpu"


def test_a_spec_that_cannot_be_written_still_ends_with_a_final_failed_status(tmp_path, podvm,
                                                                             empty_path):
    """``<root>/var/run`` a link to itself: every path through it is ELOOP."""
    (tmp_path / "var").mkdir()
    os.symlink("/var/run", tmp_path / "var/run")

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    status = status_of(tmp_path)
    assert status["state"] == "failed" and status["finished_at"]
    assert_status_conforms(status)
    assert status["reason"].startswith("detect: no NVIDIA GPU on PCI")
    assert "cdi: cannot write /var/run/cdi/nvidia.yaml: Too many levels of symbolic links" \
        in status["reason"]
    status_cmd = podvm(["status", "--root", str(tmp_path)], tree="cpu-vm")
    assert status_cmd.returncode == 1


def test_a_spec_folder_that_is_a_file_ends_failed_naming_it(tmp_path, podvm, empty_path):
    (tmp_path / "var/run").mkdir(parents=True)
    (tmp_path / "var/run/cdi").write_text("not a folder\n")

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 1
    status = status_of(tmp_path)
    assert status["state"] == "failed"
    assert "cdi: cannot write /var/run/cdi/nvidia.yaml" in status["reason"]
    assert (tmp_path / "var/run/cdi").read_text() == "not a folder\n"


def test_a_status_that_cannot_be_written_still_leaves_a_failed_unavailable_spec(tmp_path, podvm,
                                                                                empty_path):
    """The reverse: status.json is a directory, so no status can be written; the spec says
    failed and why, and the boot exits 1."""
    (tmp_path / "run/podvm-gpu/status.json").mkdir(parents=True)

    done = boot(podvm, tmp_path, empty_path)

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    spec = yaml.safe_load((tmp_path / "var/run/cdi/nvidia.yaml").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert "PODVM_GPU_STATE=failed" in env
    reason = next(e for e in env if e.startswith("PODVM_GPU_REASON="))
    assert "status: cannot write /run/podvm-gpu/status.json" in reason
    assert reason.count("status: cannot write") == 1, reason  # once, though both writes failed
    assert "failed: status: cannot write" in done.stderr


def test_the_report_of_a_boot_whose_status_cannot_be_written_has_no_running_step(
        tmp_path, podvm, empty_path):
    """Found by a newcomer: ``boot --json`` printed state failed with detect still running."""
    (tmp_path / "run/podvm-gpu/status.json").mkdir(parents=True)
    done = podvm(["boot", "--root", str(tmp_path), "--json"], tree="cpu-vm",
                 env={"PATH": empty_path})
    doc = json.loads(done.stdout)
    assert doc["state"] == "failed"
    assert [(s["name"], s["result"]) for s in doc["steps"]] == [("detect", "failed")], doc
    assert_status_conforms(doc)


def test_the_final_state_line_goes_to_the_kernel_log(tmp_path, podvm, empty_path):
    """The console prints the kernel log: one line with state and reason, as a daemon's
    notice (a FIFO stands in for /dev/kmsg, which only a real kernel has)."""
    (tmp_path / "dev").mkdir()
    os.mkfifo(tmp_path / "dev/kmsg")
    reader = os.open(tmp_path / "dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        done = boot(podvm, tmp_path, empty_path)
        line = os.read(reader, 4096).decode()
    finally:
        os.close(reader)

    assert done.returncode == 0, done.stderr
    assert line.startswith("<29>podvm-gpu[") and line.endswith("\n"), line
    assert "]: no-gpu: detect: no NVIDIA GPU on PCI (3 devices scanned)" in line


def test_a_running_state_no_boot_will_finish_is_named_so(tmp_path, podvm, empty_path):
    """Found by a newcomer: a boot killed by SIGKILL (the OOM killer) leaves ``running``, and
    ``status`` and ``check`` called it a slow boot; ``status --wait`` sat out its timeout.
    The kernel's /proc/locks says no boot holds the lock: status names that, ``--wait`` returns
    within about a second (exit 3), and check fails its status row. While a boot holds the
    lock, the same state is a boot in progress."""
    import sys

    (tmp_path / "etc/podvm-gpu").mkdir(parents=True)
    (tmp_path / "etc/podvm-gpu/config.yaml").write_text(
        "detect: {expected_gpus: 1, late_gpu_wait_s: 30}\n")
    booting = subprocess.Popen([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(tmp_path)],
                               stderr=subprocess.DEVNULL, env={**os.environ, "PATH": empty_path})
    deadline = time.monotonic() + 10
    while not (tmp_path / "run/podvm-gpu/status.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status_of(tmp_path)["state"] == "running"

    def status(*args):
        return subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--root", str(tmp_path),
                               *args], capture_output=True, text=True, timeout=30)

    alive = status()
    assert (alive.returncode, alive.stdout) == (3, "running\n"), alive
    started = time.monotonic()
    assert status("--wait", "--timeout", "1.5").returncode == 3
    assert time.monotonic() - started >= 1.4  # a live boot is waited for

    booting.kill()
    booting.wait()
    gone = status()
    assert gone.returncode == 3
    assert gone.stdout.startswith("running: no boot holds /run/podvm-gpu/boot.lock"), gone.stdout
    started = time.monotonic()
    waited = status("--wait", "--timeout", "30")
    assert waited.returncode == 3 and time.monotonic() - started < 5, waited
    check = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--root", str(tmp_path),
                            "--json"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": empty_path})
    row = next(c for c in json.loads(check.stdout)["checks"] if c["name"] == "status")
    assert row["result"] == "fail" and "no boot holds" in row["detail"], row


def test_a_running_state_without_its_lock_file_is_one_no_boot_will_finish(tmp_path, podvm, empty_path):
    """Found by a newcomer (issue 21): ``status.json`` says ``running`` and ``boot.lock`` is gone
    (a /run emptied by hand, a root copied without it). ``status --wait --timeout 10`` sat out
    the 10 s and check said "still running"; with the lock file there and free it was found in
    0.06 s. No lock file is the same fact: no boot holds it."""
    import sys

    run_dir = tmp_path / "run/podvm-gpu"
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps(
        {"version": 1, "state": "running", "reason": None, "warnings": [], "gpus": [],
         "nvswitches": [], "driver_version": None, "cdi": None,
         "steps": [{"name": "detect", "result": "running", "message": "", "duration_s": 0}]}))
    assert not (run_dir / "boot.lock").exists()

    started = time.monotonic()
    waited = subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--root", str(tmp_path),
                             "--wait", "--timeout", "10"], capture_output=True, text=True,
                            timeout=30)
    assert waited.returncode == 3 and time.monotonic() - started < 5, waited
    assert waited.stdout.startswith("running: no boot holds /run/podvm-gpu/boot.lock"), waited
    check = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--root", str(tmp_path),
                            "--json"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": empty_path})
    row = next(c for c in json.loads(check.stdout)["checks"] if c["name"] == "status")
    assert row["result"] == "fail" and "no boot holds" in row["detail"], row


def test_a_dry_run_that_could_not_write_the_root_says_so_and_exits_1(tmp_path, monkeypatch,
                                                                     capsys):
    """Issue 47 item 22: run as a user who cannot write the root, ``boot --dry-run`` said it
    "would write the unavailable spec and the status"; the boot then failed Permission denied.
    (The user is stood in for by ``os.access`` saying no for the root's folders.)"""
    import os

    from podvm_gpu.boot import run_boot

    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and os.fspath(path).startswith(str(tmp_path)):
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    code = run_boot(str(tmp_path), dry_run=True)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "cannot write" in out and "would write the unavailable spec" not in out, out


def test_the_lock_wait_is_its_own_line_not_detect_time(tmp_path, podvm, empty_path):
    """Issue 47 item 9: a second boot counted its wait for the lock in detect's time
    (``detect failed in 7.341 s``): the wait is its own line and figure."""
    import fcntl
    import threading

    lock = tmp_path / "run/podvm-gpu/boot.lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(1.5, lambda: os.close(fd)).start()
    done = boot(podvm, tmp_path, empty_path)
    assert done.returncode == 0, done.stderr
    detect = status_of(tmp_path)["steps"][0]
    assert detect["name"] == "detect" and detect["duration_s"] < 1.0, detect
    assert "got /run/podvm-gpu/boot.lock after" in done.stderr, done.stderr
