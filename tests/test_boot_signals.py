"""Signals other than SIGTERM and SIGINT, and SIGINT while the program starts (issue 29 item
23; docs/interface.md 1.3 and 3.5): SIGHUP, SIGUSR1, SIGUSR2 and a SIGALRM from outside end the
boot ``failed`` with a final status and no temporary file left (their default action killed it
mid-boot: ``running`` and ``.tmp`` files); the GPU path's own budget timer is told apart from an
outside SIGALRM; SIGINT before boot's handler is one line and exit 1, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scenarios.world import World
from schemas import assert_status_conforms
from test_boot_ends import p02, product_pid, wait_for_call, with_slow_call

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def waiting_boot(root: Path) -> subprocess.Popen:
    """A CPU boot that waits (up to 30 s) for a GPU the config expects and never comes; returned
    once its status says it is waiting."""
    (root / "etc/podvm-gpu").mkdir(parents=True)
    (root / "etc/podvm-gpu/config.yaml").write_text(
        "detect: {expected_gpus: 1, late_gpu_wait_s: 30}\n")
    boot = subprocess.Popen([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    status = root / "run/podvm-gpu/status.json"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if "waiting up to" in status.read_text():
                return boot
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    boot.kill()
    raise AssertionError("the boot never started waiting")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                                    signal.SIGALRM], ids=lambda s: signal.Signals(s).name)
def test_a_stray_signal_ends_the_boot_failed_with_no_temporary_file(tmp_path, signum):
    boot = waiting_boot(tmp_path)
    os.kill(boot.pid, signum)
    out, err = boot.communicate(timeout=10)
    name = signal.Signals(signum).name
    assert boot.returncode == 1, err
    assert "Traceback" not in err
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert_status_conforms(status)
    assert status["state"] == "failed", status
    assert status["reason"].startswith(f"detect: interrupted by {name} ("), status["reason"]
    leftovers = [p.name for d in ("run/podvm-gpu", "var/run/cdi") for p in (tmp_path / d).iterdir()
                 if p.name.endswith(".tmp")]
    assert leftovers == []
    assert "PODVM_GPU_STATE=failed" in (tmp_path / "var/run/cdi/nvidia.yaml").read_text()


def test_an_outside_sigalrm_on_the_gpu_path_is_not_the_budget():
    """The budget's timer uses SIGALRM: an outside one (kill -ALRM) said the budget was spent."""
    argv = ["modprobe", "nvidia"]
    case = with_slow_call(p02(), argv, "hang")

    def interrupt(process):
        wait_for_call(world, argv)
        os.kill(product_pid(process), signal.SIGALRM)
        process.wait(timeout=10)

    with World(case) as world:
        run = world.run("boot", during=interrupt)
        assert run.rc == 1, run.stderr
        reason = run.status["reason"]
        assert reason.startswith("modules: interrupted by SIGALRM (kill -ALRM from outside"), reason
        assert "budget" not in reason


@pytest.mark.parametrize("command, code, said", [
    ("boot", 1, "podvm-gpu: error: stopped by SIGINT before this boot began (nothing written)"),
    ("status", 130, "podvm-gpu: interrupted"),
])
def test_sigint_before_boots_handler_is_one_line_and_the_documented_exit(tmp_path, command, code,
                                                                          said):
    """SIGINT at start-up gave a KeyboardInterrupt traceback, or exit 130 for boot (1.3: 1).
    Here it is raised where it lands in the worst case: as the command begins."""
    script = ("import sys, podvm_gpu.cli as cli\n"
              "real = cli._main\n"
              "def first(args):\n"
              "    raise KeyboardInterrupt\n"
              "cli._main = first\n"
              f"sys.exit(cli.main([{command!r}, '--root', {str(tmp_path)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=ENV)
    assert done.returncode == code
    assert done.stderr.strip() == said
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("entry", ["bin/podvm-gpu", "podvm_gpu/__main__.py"])
def test_sigint_while_the_program_loads_is_no_traceback(tmp_path, entry):
    """A KeyboardInterrupt during ``from podvm_gpu.cli import main`` (the program loading), in
    the installed script and in ``python -m podvm_gpu``'s entry."""
    for command, code in (("boot", 1), ("status", 130)):
        script = ("import runpy, sys\n"
                  "class Interrupting:\n"
                  "    def find_spec(self, name, path=None, target=None):\n"
                  "        if name == 'podvm_gpu.cli':\n"
                  "            raise KeyboardInterrupt\n"
                  "sys.meta_path.insert(0, Interrupting())\n"
                  f"sys.argv = ['podvm-gpu', {command!r}, '--root', {str(tmp_path)!r}]\n"
                  f"runpy.run_path({str(REPO / entry)!r}, run_name='__main__')\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=60, env=ENV)
        assert done.returncode == code, done.stderr
        assert done.stderr == "podvm-gpu: interrupted while starting\n"
