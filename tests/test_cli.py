"""The command line (podvm_gpu.cli, podvm_gpu.app, podvm_gpu.boot's output; contract section 1).

Argument parsing runs in-process; exit codes, the import cost of the CPU fast path and the
journal prefix run the real command in a subprocess under a umockdev device tree.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from podvm_gpu import __version__
from podvm_gpu.cli import fast_args, main
from podvm_gpu.host.fs import atomic_write

HEAVY = ("typer", "pydantic", "pyudev", "yaml", "json", "re", "enum", "argparse")


def fast_boot_args(args: list[str]) -> dict | None:
    """The hand parser's reading of a boot line, None when it leaves the line to argparse."""
    parsed = fast_args(args)
    assert parsed is None or parsed[0] == args[0]
    return parsed[1] if parsed else None


@pytest.fixture(autouse=True)
def no_product_env(monkeypatch):
    for name in ("PODVM_GPU_ROOT", "PODVM_GPU_CONFIG", "JOURNAL_STREAM"):
        monkeypatch.delenv(name, raising=False)


# --- fast_boot_args: the hand parser of the boot fast path ----------------------------------------

def test_plain_boot_gets_the_defaults():
    assert fast_boot_args(["boot"]) == {"root_dir": "/", "config": None, "json_out": False,
                                        "dry_run": False}


def test_options_with_equals_signs():
    assert fast_boot_args(["boot", "--root=/vm", "--config=/vm/c.yaml", "--json",
                           "--dry-run"]) == {"root_dir": "/vm", "config": "/vm/c.yaml",
                                             "json_out": True, "dry_run": True}


def test_options_with_separate_values():
    assert fast_boot_args(["boot", "--json", "--root", "/vm", "--config", "/c.yaml"]) == \
        {"root_dir": "/vm", "config": "/c.yaml", "json_out": True, "dry_run": False}


def test_environment_gives_the_defaults(monkeypatch):
    monkeypatch.setenv("PODVM_GPU_ROOT", "/image")
    monkeypatch.setenv("PODVM_GPU_CONFIG", "/image/podvm.yaml")

    parsed = fast_boot_args(["boot"])

    assert parsed["root_dir"] == "/image" and parsed["config"] == "/image/podvm.yaml"


def test_flags_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("PODVM_GPU_ROOT", "/image")

    assert fast_boot_args(["boot", "--root", "/other"])["root_dir"] == "/other"


@pytest.mark.parametrize("name", ["PODVM_GPU_ROOT", "PODVM_GPU_CONFIG"])
@pytest.mark.parametrize("command", [["boot"], ["status"], ["check"], ["boot", "--dry-run"]])
def test_an_empty_environment_value_is_a_usage_error_not_the_default(monkeypatch, capsys, name,
                                                                     command):
    """``PODVM_GPU_ROOT=`` used to mean ``/`` silently: a typo in a unit must not aim the boot
    at the real machine."""
    monkeypatch.setenv(name, "")

    assert main(command) == 2
    assert f"{name} is empty" in capsys.readouterr().err


def test_status_has_its_own_hand_parsed_form():
    assert fast_args(["status", "--wait", "--timeout=5", "--root", "/vm", "--json"]) == (
        "status", {"root_dir": "/vm", "config": None, "json_out": True, "wait": True,
                   "timeout": "5"})


@pytest.mark.parametrize("args", [
    [],
    ["status", "--verbose"],
    ["status", "--wait=yes"],
    ["check", "--verbose"],
    ["boot", "--verbose"],
    ["boot", "--help"],
    ["boot", "--root"],
    ["boot", "--root", "--json"],
    ["boot", "--json=yes"],
    ["boot", "extra"],
    ["--version"],
])
def test_anything_else_goes_to_the_full_parser(args):
    assert fast_boot_args(args) is None


# --- the argparse parser: version, help, usage errors ----------------------------------------------

def test_version_exits_0(capsys):
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_console_script_version_exits_0():
    script = Path(sys.executable).with_name("podvm-gpu")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "podvm_gpu"]

    done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0
    assert done.stdout.strip() == f"podvm-gpu {__version__}"


@pytest.mark.parametrize("args", [
    ["boot", "--verbose"],
    ["frobnicate"],
    ["status", "--timeout", "-1"],
    ["status", "--timeout", "soon"],
    ["boot", "--root"],
])
def test_usage_errors_exit_2(args, capsys):
    assert main(args) == 2
    assert "podvm-gpu: error: " in capsys.readouterr().err


@pytest.mark.parametrize("args, said", [
    (["status", "--wait", "--timeout="], "--timeout is empty"),
    (["status", "--wait", "--timeout", ""], "--timeout is empty"),
    (["status", "--wait", "--timeout", "\u0669\u0664"], "--timeout '\u0669\u0664' is not a number"),
    (["status", "--wait", "--timeout", "1_0"], "--timeout '1_0' is not a number"),
])
def test_an_empty_or_non_ascii_timeout_is_a_usage_error(args, said, capsys, tmp_path):
    """Issue 29 item 21: ``--timeout=`` meant 300 s, and float() takes Arabic-Indic digits."""
    assert main([*args, "--root", str(tmp_path)]) == 2
    assert f"podvm-gpu: error: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("value, said", [
    ("1e3", "--timeout '1e3' has an exponent: write the seconds as a plain number (1000, not 1e3)"),
    ("1.5E+2", "--timeout '1.5E+2' has an exponent"),
    ("inf", "--timeout 'inf' is not a number of seconds: give a plain number, 0 or more"),
    ("NaN", "--timeout 'NaN' is not a number of seconds"),
    ("-1", "--timeout '-1' is negative: give 0 or more seconds"),
    ("-0.5", "--timeout '-0.5' is negative"),
    ("+5", "--timeout '+5' is not a number of seconds (0 or more, in plain ASCII digits"),
    ("9" * 400, "--timeout '" + "9" * 40 + "...' is too large to be a number of seconds"),
])
def test_a_timeout_that_is_no_plain_number_of_seconds_is_said_as_what_it_is(value, said, capsys,
                                                                            tmp_path):
    """Issue 35's leftovers: ``--timeout 1e3`` waited 1000 s (float() takes an exponent) and
    ``inf`` was refused as 'not a number'; a user writes seconds as a plain number. (A final
    state: before, the values taken ended the wait at once, exit 0.)"""
    write_status(tmp_path, "no-gpu")
    assert main(["status", "--root", str(tmp_path), "--wait", f"--timeout={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: podvm-gpu status") and f"podvm-gpu: error: {said}" in err, err


@pytest.mark.parametrize("value, seconds", [("0", 0.0), ("300", 300.0), ("2.5", 2.5), (".5", 0.5),
                                            ("5.", 5.0), ("007", 7.0)])
def test_a_plain_timeout_is_taken_as_seconds(value, seconds):
    from podvm_gpu.cli import parse_timeout

    assert parse_timeout(value) == (seconds, None)


@pytest.mark.parametrize("args", [["--timeout", "5"], ["--timeout=5", "--json"],
                                  ["--json", "--timeout", "0"]])
def test_status_timeout_without_wait_is_a_usage_error_naming_both(args, capsys, tmp_path):
    """Issue 35's leftovers: ``status --timeout 5`` printed the state at once, the timeout
    silently ignored, where every other contradiction is refused (1.3)."""
    write_status(tmp_path, "no-gpu")
    assert main(["status", "--root", str(tmp_path), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: podvm-gpu status")
    assert "podvm-gpu: error: --timeout needs --wait: without --wait status reads the state " \
        "once and does not wait" in captured.err


@pytest.mark.parametrize("args, said", [
    (["check", "--image", "--attest"], "--image and --attest cannot be used together"),
    (["check", "--attest", "--json", "--image"], "--image and --attest cannot be used together"),
    (["metrics", "--pod-labels", "--listen", "127.0.0.1:0"], "--pod-labels and --listen cannot be used"),
    (["metrics", "--pod-labels", "--listen="], "--pod-labels and --listen cannot be used"),
    (["metrics", "--textfile", "--pod-labels"], "--pod-labels and --textfile cannot be used"),
    (["metrics", "--pod-labels", "--openmetrics"], "--pod-labels and --openmetrics cannot be used"),
    (["metrics", "--pod-labels", "--serve"], "--pod-labels and --serve cannot be used"),
])
def test_contradictory_options_are_a_usage_error_naming_both(args, said, capsys, tmp_path):
    """Issue 35 item 13: each of these ran one of the two and ignored the other silently."""
    assert main([*args, "--root", str(tmp_path)]) == 2
    assert f"podvm-gpu: error: {said}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, config, off", [
    (["--listen="], None, '--listen ""'),
    (["--listen", ""], None, '--listen ""'),
    (["--serve"], 'metrics: {listen: ""}\n', 'metrics.listen is ""'),
])
def test_nothing_to_serve_says_the_server_is_off_and_where(args, config, off, tmp_path):
    """Issue 35 item 12: "no listen address" did not say that "" had turned the server off."""
    if config:
        (tmp_path / "etc/podvm-gpu").mkdir(parents=True)
        (tmp_path / "etc/podvm-gpu/config.yaml").write_text(config)
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "metrics", *args, "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"podvm-gpu metrics: nothing to serve: the HTTP server is off ({off}) and the " \
        "textfile is off (metrics.textfile is false; --textfile turns it on)\n"


@pytest.mark.parametrize("command", [["config", "--json"], ["check", "--json"]])
def test_a_named_config_is_this_machines_file_never_taken_under_the_root(command, tmp_path):
    """Issue 35 item 20: one rule, said in interface.md 1.2: a file named on the command line
    (--config, --web-config) is a path on this machine as given; the default is under --root."""
    root = tmp_path / "root"
    named = tmp_path / "other.yaml"
    # check shows a config row only for a bad file: this machine's is bad there, the root's good
    named.write_text("budget_s: 77\n" if command[0] == "config" else "budget_s: soon\n")
    (root / named.parent.relative_to("/")).mkdir(parents=True)
    (root / named.relative_to("/")).write_text("budget_s: 55\n")  # the same path under the root
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", *command, "--root", str(root),
                           "--config", str(named)], capture_output=True, text=True, timeout=60)
    doc = json.loads(done.stdout)
    if command[0] == "config":
        assert doc["config"] == str(named) and doc["settings"]["budget_s"] == 77, doc
    else:
        row = next(c for c in doc["checks"] if c["name"] == "config")
        assert row["result"] == "fail" and row["detail"].startswith(f"{named}: budget_s"), row
    # and the help says so, where a new user looks first
    helped = subprocess.run([sys.executable, "-m", "podvm_gpu", command[0], "--help"],
                            capture_output=True, text=True, timeout=60).stdout
    assert "a path on this machine, never taken under --root" in " ".join(helped.split()), helped


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("boot", "status", "check"))


def test_boot_help_works(capsys):
    assert main(["boot", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--root" in out and "--config" in out and "--dry-run" in out and "--json" in out


def test_usage_error_exit_code_reaches_the_shell():
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--verbose"],
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 2
    assert "Traceback" not in done.stderr


# --- status ---------------------------------------------------------------------------------------

def write_status(root: Path, state: str, reason: str | None = None, warnings=()) -> None:
    """A status document in ``state``; a ready one is the real H200's (a ready document must
    keep the rules of ready, interface.md 4.4)."""
    path = root / "run" / "podvm-gpu" / "status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "state": state, "reason": reason, "steps": []}
    if state == "ready":
        doc = {**json.loads((Path(__file__).parent / "data/real/h200-580/podvm-gpu-status.json")
                            .read_text()), "confidential_computing": None}
    atomic_write(str(path), json.dumps({**doc, "warnings": list(warnings)}))


@contextlib.contextmanager
def boot_in_progress(root: Path):
    """Hold ``boot.lock`` as a live boot does: a ``running`` state is then one a boot will end
    (without the lock, or its file, no boot will: issue 21 item 3)."""
    lock = root / "run" / "podvm-gpu" / "boot.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.mark.parametrize("state, code", [("ready", 0), ("no-gpu", 0), ("failed", 1),
                                         ("running", 3)])
def test_status_exit_code_follows_the_state(tmp_path, state, code, capsys):
    write_status(tmp_path, state, reason="modules: boom" if state == "failed" else None)

    assert main(["status", "--root", str(tmp_path)]) == code
    assert capsys.readouterr().out.startswith(state)


def test_status_without_a_status_file_exits_3(tmp_path, capsys):
    assert main(["status", "--root", str(tmp_path)]) == 3
    assert "no status yet" in capsys.readouterr().out


def test_status_with_a_garbled_status_file_exits_3(tmp_path):
    (tmp_path / "run" / "podvm-gpu").mkdir(parents=True)
    (tmp_path / "run" / "podvm-gpu" / "status.json").write_text('{"state": "rea')

    assert main(["status", "--root", str(tmp_path)]) == 3


def test_status_reads_the_root_from_the_environment(tmp_path, monkeypatch):
    write_status(tmp_path, "failed", "drivers: nouveau")
    monkeypatch.setenv("PODVM_GPU_ROOT", str(tmp_path))

    assert main(["status"]) == 1


def test_status_prints_reason_and_warnings(tmp_path, capsys):
    write_status(tmp_path, "ready", warnings=["confidential-computing: ready state left unset"])

    main(["status", "--root", str(tmp_path)])

    out = capsys.readouterr().out.splitlines()
    assert out == ["ready", "warning: confidential-computing: ready state left unset"]


def test_status_json_prints_the_document(tmp_path, capsys):
    write_status(tmp_path, "failed", "modules: nvidia rejected")

    assert main(["status", "--root", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "failed" and doc["reason"] == "modules: nvidia rejected"


def test_status_exit_code_of_the_real_process(tmp_path):
    write_status(tmp_path, "failed", "modules: boom")

    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 1
    assert done.stdout.strip() == "failed: modules: boom"


def test_status_wait_times_out_with_3_while_running_saying_it_timed_out(tmp_path, capsys):
    write_status(tmp_path, "running")
    started = time.monotonic()

    with boot_in_progress(tmp_path):
        code = main(["status", "--root", str(tmp_path), "--wait", "--timeout", "0.5"])

    elapsed = time.monotonic() - started
    assert code == 3
    assert 0.5 <= elapsed < 3
    # issue 35 item 18: it printed only "running", as if the boot had stopped there
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("running")
    said = re.fullmatch(r"status --wait: timed out after (\d+\.\d) s \(--timeout 0\.5\) before a "
                        r"final state", lines[-1])
    assert said and 0.5 <= float(said.group(1)) < 3, lines


def test_status_wait_json_keeps_one_document_and_says_the_timeout_on_stderr(tmp_path, capsys):
    write_status(tmp_path, "running")
    with boot_in_progress(tmp_path):
        code = main(["status", "--root", str(tmp_path), "--wait", "--timeout", "0.2", "--json"])
    out, err = capsys.readouterr()
    assert code == 3
    assert json.loads(out)["state"] == "running"
    assert "status --wait: timed out after " in err and "(--timeout 0.2)" in err, err


def test_status_wait_returns_0_as_soon_as_ready_is_written(tmp_path):
    write_status(tmp_path, "running")
    timer = threading.Timer(0.4, write_status, args=(tmp_path, "ready"))
    started = time.monotonic()
    timer.start()
    try:
        with boot_in_progress(tmp_path):
            code = main(["status", "--root", str(tmp_path), "--wait", "--timeout", "20"])
    finally:
        timer.cancel()
        timer.join()

    elapsed = time.monotonic() - started
    assert code == 0
    assert 0.4 <= elapsed < 2


def test_status_wait_returns_1_when_boot_fails_meanwhile(tmp_path):
    timer = threading.Timer(0.2, write_status, args=(tmp_path, "failed", "cdi: boom"))
    timer.start()
    try:
        code = main(["status", "--root", str(tmp_path), "--wait", "--timeout", "20"])
    finally:
        timer.join()

    assert code == 1


# --- boot's CPU fast path: what it imports, prints and writes -------------------------------------

def imported_modules(importtime_log: str) -> set[str]:
    """Top-level package names from ``python -X importtime`` lines on stderr."""
    names = set()
    for line in importtime_log.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", line)
        if m:
            names.add(m.group(1).split(".")[0])
    return names


def interpreter_start_up_modules() -> set[str]:
    """What this interpreter imports for ``-c pass`` (an editable install's finder imports re)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True,
                          text=True, timeout=60)
    return imported_modules(done.stderr)


def test_cpu_fast_path_imports_no_heavy_module(tmp_path, podvm, empty_path):
    """Not even json, re, enum or argparse: each costs the fast path a noticeable share of its
    goal (bench/run.py)."""
    done = podvm(["boot", "--root", str(tmp_path)], tree="cpu-vm", python_args=["-X", "importtime"],
                 env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    names = imported_modules(done.stderr) - interpreter_start_up_modules()
    assert "podvm_gpu" in names  # the log was read
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_with_a_config_file_on_a_cpu_vm_boot_reads_it_with_yaml_alone(tmp_path, podvm,
                                                                      empty_path):
    """The config is validated without the GPU pipeline: PyYAML and the stdlib validator."""
    (tmp_path / "etc" / "podvm-gpu").mkdir(parents=True)
    (tmp_path / "etc" / "podvm-gpu" / "config.yaml").write_text("budget_s: 100\n")

    done = podvm(["boot", "--root", str(tmp_path)], tree="cpu-vm", python_args=["-X", "importtime"],
                 env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    names = imported_modules(done.stderr)
    assert "yaml" in names
    assert not names & {"pydantic", "pyudev", "typer", "argparse"}, names
    assert "podvm_gpu.boot.pipeline" not in done.stderr


def test_a_gpu_vm_takes_the_gpu_path_without_pyudev_or_ctypes(tmp_path, podvm, empty_path):
    """Discovery reads sysfs (host/sysfs.py): pyudev's import and its ``ldconfig -p`` run are
    paid only by the late-GPU wait's udev monitor."""
    done = podvm(["boot", "--root", str(tmp_path)], tree="h100-pcie",
                 python_args=["-X", "importtime"], env={"PATH": empty_path})

    names = imported_modules(done.stderr) - interpreter_start_up_modules()
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert status["gpus"] and "modules" in [s["name"] for s in status["steps"]]  # the GPU path
    unwanted = {"pyudev", "ctypes", "typer", "ipaddress", "shutil"}
    assert not names & unwanted, sorted(names & unwanted)


def test_cpu_boot_json_prints_the_status_document(tmp_path, podvm, empty_path):
    done = podvm(["boot", "--root", str(tmp_path), "--json"], tree="cpu-vm",
                 env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["version"] == 3 and doc["state"] == "no-gpu"
    assert doc["reason"] == "detect: no NVIDIA GPU on PCI (3 devices scanned)"
    assert doc["gpus"] == [] and doc["nvswitches"] == []
    assert [(s["name"], s["result"]) for s in doc["steps"]] == [("detect", "ok")]
    assert doc["finished_at"]
    on_disk = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert on_disk == doc


def test_cpu_boot_dry_run_changes_nothing(tmp_path, podvm, empty_path):
    root = tmp_path / "root"
    root.mkdir()

    done = podvm(["boot", "--root", str(root), "--dry-run"], tree="cpu-vm",
                 env={"PATH": empty_path})

    assert done.returncode == 0, done.stderr
    assert "dry run" in done.stdout
    assert list(root.iterdir()) == []


def test_log_lines_carry_a_syslog_priority_under_systemd(tmp_path, podvm, empty_path):
    done = podvm(["boot", "--root", str(tmp_path)], tree="cpu-vm",
                 env={"PATH": empty_path, "JOURNAL_STREAM": "8:12345"})

    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("<6>podvm-gpu: ") for line in lines), lines


def test_log_lines_have_no_priority_in_a_terminal(tmp_path, podvm, empty_path):
    done = podvm(["boot", "--root", str(tmp_path)], tree="cpu-vm", env={"PATH": empty_path})

    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("podvm-gpu: ") for line in lines), lines


def test_boot_that_cannot_write_its_status_exits_1(tmp_path, podvm, empty_path):
    (tmp_path / "run").write_text("not a folder")

    done = podvm(["boot", "--root", str(tmp_path)], tree="cpu-vm", env={"PATH": empty_path})

    assert done.returncode == 1
    assert "status" in done.stderr and "Traceback" not in done.stderr
    assert os.path.isfile(tmp_path / "run")


@pytest.mark.parametrize("args", [["boot", "--root="], ["boot", "--root", ""],
                                  ["boot", "--root", "relative/dir"],
                                  ["status", "--root", "relative"],
                                  ["check", "--image", "--root", "/nonexistent/root"]])
def test_an_empty_relative_or_missing_root_is_a_usage_error(args, tmp_path, monkeypatch):
    """A relative or empty root would put run/ and var/ in the current directory."""
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    assert list(tmp_path.iterdir()) == []


# --- boot --dry-run --json: one JSON document, nothing written ------------------------------------

def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, content and mtime."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, content)
    return found


@pytest.mark.parametrize("tree, config, state", [("cpu-vm", None, "no-gpu"),
                                                 ("cpu-vm", "budget_s: true\n", "failed"),
                                                 ("h100-pcie", None, None)],
                         ids=["no-gpu", "bad-config", "gpu"])
def test_boot_dry_run_json_prints_one_document_and_writes_nothing(tmp_path, podvm, empty_path,
                                                                   tree, config, state):
    root = tmp_path / "root"
    (root / "var" / "run" / "cdi").mkdir(parents=True)
    # a duplicate spec a real boot would rename aside
    (root / "var" / "run" / "cdi" / "toolkit.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    if config:
        (root / "etc" / "podvm-gpu").mkdir(parents=True)
        (root / "etc" / "podvm-gpu" / "config.yaml").write_text(config)
    before = snapshot(root)

    done = podvm(["boot", "--dry-run", "--json", "--root", str(root)], tree=tree,
                 env={"PATH": empty_path})

    assert done.returncode == (1 if state == "failed" else 0), done.stderr
    doc = json.loads(done.stdout)  # one document, nothing else on stdout
    assert doc["dry_run"] is True
    assert isinstance(doc["commands"], list)
    if state:
        assert doc["state"] == state
    else:
        assert [g["pci_address"] for g in doc["gpus"]] == ["0000:00:04.0"]
        # one GPU and no fabric: the driver trains no NVLink (issue 16, as NVRC does)
        assert ["modprobe", "nvidia", "NVreg_NvLinkDisable=1"] in doc["commands"]
    assert snapshot(root) == before


@pytest.mark.parametrize("with_file", [False, True])
def test_dry_run_plans_the_fabric_manager_exactly_as_boot_starts_it(tmp_path, podvm, empty_path,
                                                                    with_file):
    """-c only with a config file the root has (steps/fabric/step.py), in the plan as in the run:
    since issue 16 the copy under /run with the keys the VM's role needs (FABRIC_MODE=0, the
    rail policy), made from the stock file."""
    stock = tmp_path / "usr/share/nvidia/nvswitch/fabricmanager.cfg"
    cfg = tmp_path / "run/podvm-gpu/fabricmanager.cfg"
    if with_file:
        stock.parent.mkdir(parents=True)
        stock.write_text("LOG_LEVEL=4\n")

    done = podvm(["boot", "--dry-run", "--json", "--root", str(tmp_path)],
                 tree="hgx-h200-8gpu-4nvswitch", env={"PATH": empty_path})

    commands = json.loads(done.stdout)["commands"]
    fm = [c for c in commands if c[0] == "nv-fabricmanager" and "--version" not in c]
    assert fm == [["nv-fabricmanager", "-c", str(cfg)] if with_file else ["nv-fabricmanager"]]


@pytest.mark.parametrize("args, code", [(["status"], 3), (["status", "--json"], 3),
                                        (["check"], 1), (["config"], 1)])
def test_output_that_cannot_be_written_is_one_line_never_a_traceback(tmp_path, args, code):
    """Found by a newcomer: ``status >/dev/full`` gave a traceback and exit 1, which reads as
    ``failed``; status now exits 3 (no state reported), the others 1, with one line on stderr."""
    import subprocess

    subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(tmp_path)],
                   capture_output=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "podvm_gpu", *args, "--root", str(tmp_path)],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == code, done.stderr
    assert done.stderr == "podvm-gpu: error: cannot write the output: No space left on device\n"


# --- closed standard streams, Ctrl-C (issue 21 items 1 and 2) ------------------------------------

def _run_with_closed(fd: int, args: list[str], tmp_path: Path, script: bool = False):
    """The command with file descriptor ``fd`` closed when it starts, as systemd or a shell's
    ``>&-`` can start it; stderr is captured unless it is the one closed."""
    def close():
        os.close(fd)

    entry = [str(Path(sys.executable).with_name("podvm-gpu"))] if script else \
        [sys.executable, "-m", "podvm_gpu"]
    return subprocess.run([*entry, *args, "--root", str(tmp_path)], preexec_fn=close,
                          stdout=subprocess.PIPE if fd != 1 else None,
                          stderr=subprocess.PIPE if fd != 2 else None,
                          text=True, timeout=60, env={**os.environ, "PATH": "/nonexistent"})


@pytest.mark.parametrize("script", [False, True], ids=["python -m", "script"])
@pytest.mark.parametrize("args, boot_first, code", [
    (["boot"], False, 0),  # this machine has no NVIDIA GPU: no-gpu
    (["status"], False, 3),  # no status yet
    (["status"], True, 0),
    (["check"], True, 0),
    (["config"], False, 0),
    (["metrics"], False, 0),
])
def test_a_closed_stdout_changes_no_exit_code_and_prints_no_traceback(tmp_path, args, boot_first,
                                                                      code, script):
    """With stdout closed (``>&-``) every command printed ``AttributeError: 'NoneType' object
    has no attribute 'flush'``, and status exited 1, not its documented 3."""
    if boot_first:
        assert _run_with_closed(1, ["boot"], tmp_path, script).returncode == 0
    done = _run_with_closed(1, args, tmp_path, script)

    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


@pytest.mark.parametrize("script", [False, True], ids=["python -m", "script"])
def test_a_boot_with_stderr_closed_exits_as_its_state(tmp_path, script):
    """``boot 2>&-`` on a CPU VM exited 1 (the final flush of None), not 0 for no-gpu; and what
    the boot opens must not land on fd 2 either (the status file)."""
    done = _run_with_closed(2, ["boot"], tmp_path, script)

    assert done.returncode == 0
    assert done.stdout.startswith("no-gpu: ")
    assert json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())["state"] == "no-gpu"


def test_a_boot_with_stdin_closed_runs_its_tools_with_stdin_on_dev_null(tmp_path):
    done = _run_with_closed(0, ["boot"], tmp_path)

    assert done.returncode == 0, done.stderr


def test_ctrl_c_on_status_wait_is_one_line_and_exit_130(tmp_path):
    """``status --wait`` interrupted by Ctrl-C printed a KeyboardInterrupt traceback."""
    write_status(tmp_path, "running")
    with boot_in_progress(tmp_path):  # the wait goes on
        waiting = subprocess.Popen([sys.executable, "-m", "podvm_gpu", "status", "--root",
                                    str(tmp_path), "--wait", "--timeout", "60"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   # Ctrl-C from a terminal finds SIGINT at its default; a run
                                   # started with `&` in a script hands it down ignored
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(1.0)
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)

    assert waiting.returncode == 130, err
    assert err == "podvm-gpu: interrupted\n"


# --- verdicts that differ from boot's, small words (issue 21 items 4, 5, 10) --------------------

def _untrusted_root(tmp_path: Path) -> Path:
    root = tmp_path / "vm"
    root.mkdir()
    os.chmod(root, 0o777)  # another user could swap run/ for a link
    return root


@pytest.mark.parametrize("json_out", [False, True])
def test_a_dry_run_on_a_root_boot_refuses_says_so_and_exits_as_boot_would(tmp_path, json_out):
    """``boot --dry-run`` said "would write the unavailable spec and the status" and exited 0
    on a root the real boot refuses (writes nothing, exit 1)."""
    root = _untrusted_root(tmp_path)
    args = ["boot", "--dry-run", "--root", str(root), *(["--json"] if json_out else [])]
    real = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)

    dry = subprocess.run([sys.executable, "-m", "podvm_gpu", *args], capture_output=True,
                         text=True, timeout=60)

    assert real.returncode == 1 and os.listdir(root) == []
    assert dry.returncode == real.returncode
    out = json.loads(dry.stdout)["reason"] if json_out else dry.stdout
    assert f"refusing to write under {root}" in out and "would write the unavailable" not in out
    assert os.listdir(root) == []


def test_check_names_the_refusal_of_a_root_boot_refused(tmp_path):
    """Issue 35 item 7: after ``chmod 777`` on the root boot exits 1 ("refusing to write under
    ...") and writes nothing; check said only "boot has not run", hint ``systemctl status``.
    Its status row now names the refusal as boot does."""
    root = _untrusted_root(tmp_path)
    real = subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert real.returncode == 1 and f"refusing to write under {root}: " in real.stderr
    why = real.stderr.split(f"refusing to write under {root}: ", 1)[1].split(";")[0]

    check = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--root", str(root),
                            "--json"], capture_output=True, text=True, timeout=60)

    row = next(c for c in json.loads(check.stdout)["checks"] if c["name"] == "status")
    assert row["result"] == "fail" and check.returncode == 1
    assert row["detail"] == ("no /run/podvm-gpu/status.json: boot refuses to write under "
                             f"{root}: {why}"), row
    assert "go-w" in row["hint"]
    assert os.listdir(root) == []


def test_check_on_a_root_boot_has_not_run_on_still_says_so(tmp_path):
    check = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--root", str(tmp_path),
                            "--json"], capture_output=True, text=True, timeout=60)
    row = next(c for c in json.loads(check.stdout)["checks"] if c["name"] == "status")
    assert row["detail"] == "no /run/podvm-gpu/status.json: boot has not run", row


@pytest.mark.parametrize("how", ["mode 0664", "another owner"])
def test_config_gives_boots_verdict_on_a_file_boot_refuses(tmp_path, capsys, how):
    """``config`` said "valid" (exit 0) for a config boot refuses as untrusted."""
    path = tmp_path / "etc/podvm-gpu/config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("budget_s: 100\n")
    if how == "mode 0664":
        os.chmod(path, 0o664)
    else:
        os.chown(path, 1000, 1000)

    assert main(["config", "--root", str(tmp_path)]) == 1
    assert "not trusted" in capsys.readouterr().err
    assert main(["boot", "--root", str(tmp_path)]) == 1


def test_config_without_a_file_says_the_defaults_are_in_force_not_valid(tmp_path, capsys):
    assert main(["config", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"no config file at {tmp_path}/etc/podvm-gpu/config.yaml: the defaults")
    assert ": valid" not in out
    assert main(["config", "--root", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["present"] is False


def test_a_link_at_the_status_file_is_named_a_link(tmp_path, capsys):
    """It was reported as "Too many levels of symbolic links" (O_NOFOLLOW's ELOOP)."""
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    (tmp_path / "run/podvm-gpu/status.json").symlink_to("/etc/hostname")

    assert main(["status", "--root", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "is a symbolic link" in out and "Too many levels" not in out


@pytest.mark.parametrize("args, usage", [
    (["metrics", "--json"], "usage: podvm-gpu metrics"),
    (["config", "/x"], "usage: podvm-gpu config"),
    (["status", "--timeout", "soon"], "usage: podvm-gpu status"),
])
def test_a_subcommands_bad_argument_is_said_under_its_own_usage_line(args, usage, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "podvm-gpu: error: " in err


def test_status_json_of_an_unreadable_file_is_indented_as_the_interface_says(tmp_path, capsys):
    (tmp_path / "run/podvm-gpu").mkdir(parents=True)
    (tmp_path / "run/podvm-gpu/status.json").write_text("{nope")

    assert main(["status", "--root", str(tmp_path), "--json"]) == 3
    out = capsys.readouterr().out
    assert json.loads(out)["state"] is None and out.startswith("{\n  ")


@pytest.mark.parametrize("args", [["config"], ["check", "--image", "--json"], ["boot"]])
def test_a_config_with_a_key_given_twice_is_refused_by_config_check_image_and_boot(tmp_path,
                                                                                   capsys, args):
    path = tmp_path / "etc/podvm-gpu/config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("budget_s: 1\nbudget_s: 2\n")

    assert main([*args, "--root", str(tmp_path)]) == 1
    said = capsys.readouterr()
    assert "budget_s: duplicate key (lines 1 and 2)" in said.out + said.err


def test_a_dry_run_that_would_wait_in_vain_for_gpus_ends_as_that_boot_would(tmp_path):
    """Found by a newcomer: with ``detect.expected_gpus: 1`` on a machine without a GPU the dry
    run said ``no-gpu`` and exited 0, the boot ``failed`` and 1."""
    config = tmp_path / "etc/podvm-gpu/config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("detect: {expected_gpus: 1, late_gpu_wait_s: 1}\n")
    argv = [sys.executable, "-m", "podvm_gpu", "boot", "--root", str(tmp_path)]

    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=60)
    real = subprocess.run(argv, capture_output=True, text=True, timeout=60)

    assert real.returncode == 1 and real.stdout.startswith("failed: detect: timed out")
    assert dry.returncode == real.returncode, dry.stdout
    assert dry.stdout.startswith("dry run: failed: detect: ") and "would wait up to 1 s" in \
        dry.stdout, dry.stdout


@pytest.mark.parametrize("command, exits", [
    ("watch", ["Exit 0", "1 an error", "2 a bad config"]),
    ("metrics", ["Exit 0", "1 ", "2 a bad config"])])
def test_watch_and_metrics_help_list_their_exit_codes(command, exits):
    """Issue 47 item 18: ``watch --help`` listed exit 0 only; ``metrics --help`` none."""
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", command, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for words in exits:
        assert words in text, (words, text)
