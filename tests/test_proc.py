"""Running external tools (podvm_gpu.host.proc.Runner; contract section 3: every external command
has a timeout, a daemon is never killed, its log is ours).

Real processes (sh, sleep, true) on a PATH of this machine; each test takes well under a second.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from podvm_gpu.errors import CommandError
from podvm_gpu.host.proc import Runner


@pytest.fixture
def umask_077():
    """A strict umask, as a hardened unit may have: modes must not depend on it."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def spawn_and_wait(runner: Runner, argv: list[str], log: Path) -> None:
    proc = runner.spawn(argv, str(log))
    assert proc.wait(timeout=10) == 0


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie no PID 1 has reaped yet counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until_dead(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- spawn: the daemon's log ----------------------------------------------------------------------

def test_spawn_does_not_truncate_the_file_a_symlinked_log_names(tmp_path, umask_077):
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    log = tmp_path / "daemon.log"
    os.symlink(victim, log)

    spawn_and_wait(Runner(), ["sh", "-c", "echo from-the-daemon"], log)

    assert victim.read_text() == "precious\n"
    assert not log.is_symlink()
    info = os.lstat(log)
    assert stat.S_ISREG(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o644  # 0644 whatever the umask
    assert log.read_text() == "from-the-daemon\n"


def test_spawn_makes_a_log_of_mode_0644_also_where_one_of_mode_0666_was(tmp_path):
    log = tmp_path / "daemon.log"
    log.write_text("an earlier run's output, world-writable\n")
    os.chmod(log, 0o666)

    spawn_and_wait(Runner(), ["sh", "-c", "echo new"], log)

    assert stat.S_IMODE(os.lstat(log).st_mode) == 0o644
    assert log.read_text() == "new\n"


def test_spawn_makes_a_new_log_of_mode_0644_under_a_strict_umask(tmp_path, umask_077):
    log = tmp_path / "daemon.log"

    spawn_and_wait(Runner(), ["true"], log)

    assert stat.S_IMODE(os.lstat(log).st_mode) == 0o644


# --- a tool path set in the config ----------------------------------------------------------------

def not_executable(tmp_path: Path) -> Path:
    tool = tmp_path / "nvidia-persistenced"
    tool.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(tool, 0o644)
    return tool


def test_run_with_a_configured_tool_path_that_is_not_executable_names_that_path(tmp_path):
    tool = not_executable(tmp_path)
    runner = Runner(tool_paths={"nvidia-persistenced": str(tool)})

    with pytest.raises(CommandError) as err:
        runner.run(["nvidia-persistenced", "--version"])

    assert str(tool) in str(err.value) and "set in the config" in str(err.value)
    assert "PATH" not in str(err.value)
    assert err.value.returncode is None


def test_spawn_with_a_configured_tool_path_that_is_not_executable_names_that_path(tmp_path):
    tool = not_executable(tmp_path)
    runner = Runner(tool_paths={"nvidia-persistenced": str(tool)})

    with pytest.raises(CommandError) as err:
        runner.spawn(["nvidia-persistenced"], str(tmp_path / "daemon.log"))

    assert str(tool) in str(err.value) and "set in the config" in str(err.value)


def test_a_tool_missing_from_path_says_so(tmp_path):
    runner = Runner(env={"PATH": str(tmp_path)})

    with pytest.raises(CommandError) as err:
        runner.run(["nvidia-smi", "-L"])

    assert str(err.value) == "nvidia-smi: not found on PATH"


# --- run: timeouts and failures -------------------------------------------------------------------

def test_run_kills_the_whole_process_group_on_timeout_and_keeps_partial_output(tmp_path):
    pids = tmp_path / "pids"
    script = (f"echo $$ > {pids}; sleep 60 & echo $! >> {pids}; "
              "echo partial-out; echo partial-err >&2; wait")
    started = time.monotonic()

    with pytest.raises(CommandError) as err:
        Runner().run(["sh", "-c", script], timeout=0.5)

    elapsed = time.monotonic() - started
    shell, grandchild = (int(p) for p in pids.read_text().split())
    try:
        assert err.value.timed_out and err.value.returncode is None
        assert err.value.timeout_s == pytest.approx(0.5)
        assert "partial-out" in err.value.stdout and "partial-err" in err.value.stderr
        assert elapsed < 5
        assert wait_until_dead(shell), f"the shell {shell} survived the timeout"
        assert wait_until_dead(grandchild), f"its child {grandchild} (sleep 60) survived"
    finally:
        for pid in (grandchild, shell):  # a regression must not leave them behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_run_of_a_command_that_exits_non_zero_raises_with_rc_and_stderr():
    with pytest.raises(CommandError) as err:
        Runner().run(["sh", "-c", "echo out; echo 'no such device' >&2; exit 3"])

    assert err.value.returncode == 3 and not err.value.timed_out
    assert err.value.stdout == "out\n"
    assert err.value.stderr == "no such device\n"
    assert err.value.last_line() == "no such device"


def test_run_without_check_returns_the_non_zero_status():
    done = Runner().run(["sh", "-c", "exit 4"], check=False)

    assert done.returncode == 4


def test_at_next_spawn_runs_once_after_the_next_process_started_then_on_start():
    runner, seen = Runner(), []
    runner.at_next_spawn.append(lambda: seen.append(("next", runner.spawns)))
    runner.run(["true"], on_start=lambda: seen.append(("started", runner.spawns)))
    runner.at_next_spawn.append(lambda: seen.append(("next", runner.spawns)))
    runner.run(["true"], on_start=lambda: seen.append(("started", runner.spawns)))
    runner.run(["true"])
    assert seen == [("next", 1), ("started", 1), ("next", 2), ("started", 2)]
    assert runner.at_next_spawn == []


def test_no_hook_runs_for_a_tool_that_cannot_start(tmp_path):
    runner, seen = Runner(env={"PATH": str(tmp_path)}), []
    runner.at_next_spawn.append(lambda: seen.append("next"))
    with pytest.raises(CommandError, match="not found"):
        runner.run(["no-such-tool"], on_start=lambda: seen.append("started"))
    assert seen == [] and runner.spawns == 0 and len(runner.at_next_spawn) == 1


def test_what_on_start_raises_ends_the_call_it_started():
    runner = Runner()

    def refuse():
        raise RuntimeError("can't start new thread")

    started = time.monotonic()
    with pytest.raises(RuntimeError):
        runner.run(["sleep", "30"], on_start=refuse)
    assert time.monotonic() - started < 10 and not runner._live


def test_wait_for_spawn_returns_at_the_next_start_or_when_done():
    import threading

    runner = Runner()
    threading.Timer(0.05, lambda: runner.run(["true"])).start()
    runner.wait_for_spawn(0, lambda: False, 30)  # would sit out 30 s without the start
    assert runner.spawns == 1
    done = []
    threading.Timer(0.05, lambda: (done.append(1), runner.wake())).start()
    started = time.monotonic()
    runner.wait_for_spawn(runner.spawns, lambda: bool(done), 30)
    assert done and time.monotonic() - started < 10


def test_a_daemons_start_runs_what_waits_for_the_next_start(tmp_path):
    runner, seen = Runner(), []
    runner.at_next_spawn.append(lambda: seen.append("next"))
    spawn_and_wait(runner, ["true"], tmp_path / "log")
    assert seen == ["next"] and runner.at_next_spawn == []


def test_what_waits_for_the_next_start_cannot_fail_the_call_it_rides_on():
    runner = Runner()

    def no_thread():
        raise RuntimeError("can't start new thread")

    runner.at_next_spawn.append(no_thread)
    assert runner.run(["true"]).returncode == 0
