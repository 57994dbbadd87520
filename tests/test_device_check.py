"""The device check script (bench/device_check.py, issue 33 item 5) against a fake nvidia-smi:
it refuses every command line that sets, captures the agent's reads in the format of
tests/data/real/h200-580/nvidia-smi-capture.json, times them alone and side by side, runs boot,
check, status and metrics, and keeps to its budget. No GPU was lent to the session that wrote
it: it has not run on one."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "tests" / "data" / "real" / "h200-580" / "nvidia-smi-capture.json"


def _load():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "bench" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DEVICE = _load()


def load():
    return DEVICE


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A fake nvidia-smi first on PATH that logs each argv and answers ``ok``; ``SLOW_S`` in
    its environment makes it sleep that long."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (bin_dir / "nvidia-smi").write_text(
        f"#!{sys.executable}\nimport os, sys, time\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "time.sleep(float(os.environ.get('SLOW_S', '0')))\nprint('ok')\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return log


@pytest.mark.parametrize("argv", [
    ["nvidia-smi", "conf-compute", "-srs", "1"], ["nvidia-smi", "conf-compute", "-srs", "0"],
    ["nvidia-smi", "-pm", "1"], ["nvidia-smi", "--persistence-mode=1"], ["nvidia-smi", "-r"],
    ["nvidia-smi", "-e", "0"], ["nvidia-smi", "-mig", "1"], ["nvidia-smi", "mig", "-cgi", "9"],
    ["nvidia-smi", "-lgc", "1500"], ["nvidia-smi", "-pl", "300"], ["nvidia-smi", "-q", "-r"],
    ["nvidia-smi", "conf-compute", "-scc", "on"], ["nvidia-ctk", "cdi", "generate"],
    ["nvidia-smi", "--query-gpu=name", "--format=csv"],
])
def test_a_command_line_that_sets_or_is_unknown_is_refused(argv):
    with pytest.raises(load().Refused):
        load().refuse(argv)


def test_every_read_of_the_agent_and_of_the_earlier_capture_is_allowed():
    device = load()
    earlier = [entry["argv"] for entry in json.loads(REAL.read_text())
               if entry["argv"][0] == "nvidia-smi"]

    for argv in device.agent_reads() + earlier:
        device.refuse(argv)  # raises for a refused one
    assert ["nvidia-smi", "conf-compute", "-e"] in device.agent_reads(), "-e reads in conf-compute"


def test_the_run_captures_times_and_runs_the_agent_refusing_what_sets(tmp_path, fake_smi):
    device = load()
    out, root = tmp_path / "out", tmp_path / "root"
    root.mkdir()

    assert device.main(["--out", str(out), "--root", str(root), "--budget-s", "100"]) == 0

    capture = json.loads((out / "nvidia-smi-capture.json").read_text())
    assert [sorted(e) for e in capture] == [["argv", "exit", "seconds", "stderr", "stdout"]] * len(capture)
    assert [e["argv"] for e in capture] == device.allowed()
    assert all(e["exit"] == 0 and e["stdout"] == "ok\n" for e in capture)
    calls = fake_smi.read_text().splitlines()
    assert not any(word in line.split() for line in calls for word in ("-srs", "-pm", "-r"))
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings["side_by_side"]) == {"2 x fabric query", "4 x fabric query",
                                            "8 x fabric query"}
    assert {"podvm-gpu boot", "podvm-gpu check", "podvm-gpu status", "podvm-gpu metrics"} <= set(timings)
    status = json.loads((out / "podvm-gpu-status.json").read_text())
    assert status["state"] == "no-gpu", "a root without an NVIDIA function on its PCI"
    assert json.loads((out / "check.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["skipped"] == [] and run["boot"]["exit"] == 0


def test_the_run_keeps_to_its_budget_and_says_what_it_skipped(tmp_path, fake_smi, monkeypatch):
    monkeypatch.setenv("SLOW_S", "0.5")
    device = load()
    out = tmp_path / "out"
    (tmp_path / "root").mkdir()

    device.main(["--out", str(out), "--root", str(tmp_path / "root"), "--budget-s", "6"])

    run = json.loads((out / "run.json").read_text())
    assert run["skipped"], "a budget of 6 s cannot hold 25 slow calls and four agent runs"
    assert run["seconds"] < 6 + 2
    assert "boot" in run["skipped"]
