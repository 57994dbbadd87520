"""A GPU stuck in the kernel does not stop the watcher (issue 46 item 5): a killed client that
does not exit (state D: nvidia-smi stuck in the driver on B200 open modules 570/580,
open-gpu-kernel-modules#971) is reaped on a thread after a bound and named; the runner's refusal
of NVML clients ends once a later one exits 0, tried after NVML_RETRY_S; the watcher shows it
(watch.json, check's watch row, ``podvm_gpu_watch_nvml_hung``) as a warning, never a finding."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from podvm_gpu.errors import CommandError
from podvm_gpu.host import proc
from podvm_gpu.host.proc import Runner


def test_a_killed_client_whose_reaping_never_returns_is_left_to_a_thread_and_named(
        monkeypatch):
    release = threading.Event()
    real_wait = subprocess.Popen.wait

    def never(self, timeout=None):  # SIGKILL sent, but the process does not go (state D)
        if timeout is None:
            release.wait()
            return real_wait(self)
        time.sleep(min(timeout, 0.05))
        raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(proc, "REAP_BOUND_S", 0.2)
    monkeypatch.setattr(subprocess.Popen, "wait", never)
    runner = Runner()
    started = time.monotonic()
    try:
        with pytest.raises(CommandError) as err:
            runner.run(["sleep", "30"], timeout=0.3)
        elapsed = time.monotonic() - started
        assert elapsed < 3, elapsed  # before: proc.wait() without a bound, for good
        assert err.value.timed_out and "in the kernel (state D)" in str(err.value), err.value
        assert "reaped on a thread" in str(err.value)
        assert runner.unreaped == 1
        assert any(t.name.startswith("reap-") and t.is_alive() for t in threading.enumerate())
    finally:
        release.set()


def test_an_nvml_client_that_hangs_names_state_d_in_the_refusal(monkeypatch):
    monkeypatch.setattr(proc, "REAP_BOUND_S", 0.2)
    monkeypatch.setattr(proc, "_drain", lambda p: (p.kill(), p.wait(), ("", "", False))[2])
    runner = Runner(tool_paths={"nvidia-smi": "/bin/sleep"})
    with pytest.raises(CommandError):
        runner.run(["nvidia-smi", "30"], timeout=0.2)
    assert "in the kernel (state D)" in runner.nvml_hung
    with pytest.raises(CommandError) as refused:
        runner.run(["nvidia-smi", "0"], timeout=1)
    assert "not run" in str(refused.value) and "state D" in str(refused.value)


@pytest.fixture
def smi(tmp_path):
    """An nvidia-smi stand-in that hangs while ``hang`` exists, else prints ok and exits 0."""
    flag = tmp_path / "hang"
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then exec sleep 30; fi\necho ok\n")
    tool.chmod(0o755)
    flag.write_text("")
    return tool, flag


def test_a_poll_that_recovers_ends_the_refusal(smi, monkeypatch):
    tool, flag = smi
    monkeypatch.setattr(proc, "NVML_RETRY_S", 0.5)
    runner = Runner(tool_paths={"nvidia-smi": str(tool)})
    with pytest.raises(CommandError) as hung:
        runner.run(["nvidia-smi", "-q"], timeout=0.3)
    assert hung.value.timed_out and runner.nvml_refusing()
    with pytest.raises(CommandError) as refused:  # within the interval: not run
        runner.run(["nvidia-smi", "-q"], timeout=5)
    assert "not run" in str(refused.value) and refused.value.returncode is None
    flag.unlink()  # the GPU answers again
    time.sleep(0.6)
    assert not runner.nvml_refusing()  # the interval passed: one call goes through
    done = runner.run(["nvidia-smi", "-q"], timeout=5)
    assert done.stdout == "ok\n" and runner.nvml_hung == ""  # it exited 0: refusal over
    assert runner.run(["nvidia-smi", "-q"], timeout=5).returncode == 0


def test_a_retry_that_hangs_again_refuses_for_another_interval(smi, monkeypatch):
    tool, _flag = smi
    monkeypatch.setattr(proc, "NVML_RETRY_S", 0.4)
    runner = Runner(tool_paths={"nvidia-smi": str(tool)})
    for _ in range(2):
        with pytest.raises(CommandError) as hung:
            runner.run(["nvidia-smi", "-q"], timeout=0.2)
        assert hung.value.timed_out
        assert runner.nvml_refusing()
        time.sleep(0.45)


def test_the_watcher_records_the_refusal_and_its_end(tmp_path):
    from test_check_units import _watch_root

    from podvm_gpu import watchfile
    from podvm_gpu.check.units import watch_unit_check
    from podvm_gpu.metrics.families import watch_families
    from podvm_gpu.watch.command import Watcher

    root = _watch_root(tmp_path, "ready")
    watcher = Watcher.__new__(Watcher)
    watcher.root, watcher.log = root, lambda *a: None
    watcher.state = watchfile.new_state("2026-12-06T10:00:00Z")
    watcher.state["kmsg_seq"] = 3
    watcher.runner = Runner()
    watcher.runner.nvml_hung = "(nvidia-smi --query-remapped-rows) timed out after 10 s in " \
                               "the kernel (state D)"
    watcher._note_nvml()
    saved = watchfile.load(root)
    assert "state D" in saved["nvml_hung"]["what"]
    metric = {f.name: f.samples[0].value for f in watch_families(saved)}
    assert metric["podvm_gpu_watch_nvml_hung"] == 1
    row = watch_unit_check(root, vm=True)
    assert row.result == "warn" and "NVML clients refused since" in row.detail, row
    watcher.runner.nvml_hung = ""  # a later call exited 0
    watcher._note_nvml()
    saved = watchfile.load(root)
    assert saved["nvml_hung"] is None
    assert {f.name: f.samples[0].value for f in watch_families(saved)}[
        "podvm_gpu_watch_nvml_hung"] == 0
    assert watch_unit_check(root, vm=True).result == "pass"


def test_a_client_already_in_flight_when_another_hangs_does_not_end_the_refusal(tmp_path):
    """S35 under load (3 of 10 runs, 2026-12-06): the fabric wait's poll, started beside the CC
    step's hung ``conf-compute -f``, ended 0 just after the hang was marked and cleared it; the
    wait then polled on for its whole timeout instead of failing at once."""
    slow = tmp_path / "nvidia-smi"
    slow.write_text("#!/bin/sh\n[ \"$1\" = hang ] && exec sleep 30\nsleep 0.6\necho ok\n")
    slow.chmod(0o755)
    runner = Runner(tool_paths={"nvidia-smi": str(slow)})
    in_flight: list = []
    poll = threading.Thread(target=lambda: in_flight.append(runner.run(["nvidia-smi", "poll"],
                                                                       timeout=5)))
    seen = runner.spawns
    poll.start()  # started before the hang is marked, ends 0 after it
    runner.wait_for_spawn(seen, lambda: False, 5)
    with pytest.raises(CommandError) as hung:
        runner.run(["nvidia-smi", "hang"], timeout=0.2)
    poll.join()
    assert hung.value.timed_out and in_flight[0].returncode == 0
    assert runner.nvml_refusing(), "a client in flight beside the hung one cleared the mark"
    with pytest.raises(CommandError, match="not run"):
        runner.run(["nvidia-smi", "poll"], timeout=5)
