"""Before the first step (docs/interface.md 3.1; issue 29 items 10, 17 and 22): a boot that
cannot hold its lock writes only the unavailable spec and the console line, and still prints a
valid document; boot's clean-up removes only its own temporary files; a file where a folder
should be is said in words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from schemas import assert_status_conforms

REPO = Path(__file__).resolve().parents[1]


def boot(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """Boot under ``root`` (no NVIDIA GPU on this machine) with ``<root>/dev/kmsg`` a FIFO;
    returns the run and the console line(s)."""
    return with_console(root, lambda: subprocess.run(
        [sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root), *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}))


def with_console(root: Path, start) -> tuple[subprocess.CompletedProcess, str]:
    """``start()`` (a boot under ``root``, returning its run) with ``<root>/dev/kmsg`` a FIFO
    (boot writes its console line into a FIFO or a character device only); returns the run and
    what reached the console."""
    (root / "dev").mkdir(exist_ok=True)
    os.mkfifo(root / "dev/kmsg")
    reader = os.open(root / "dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        done = start()
        try:
            console = os.read(reader, 65536).decode()
        except BlockingIOError:
            console = ""
    finally:
        os.close(reader)
    return done, console


@pytest.mark.parametrize("plant, reason", [
    (lambda r: (r / "run/podvm-gpu/boot.lock").mkdir(parents=True),
     "status: cannot open the boot lock /run/podvm-gpu/boot.lock: Is a directory"),
    (lambda r: (r / "run").write_text(""),
     "status: cannot make /run/podvm-gpu for the boot lock and the status: not a folder: a file "
     "is in its place ("),
], ids=["boot.lock a folder", "/run a file"])
def test_without_the_lock_only_the_spec_is_written_and_the_json_is_valid(tmp_path, plant, reason):
    plant(tmp_path)
    done, console = boot(tmp_path, "--json")
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert_status_conforms(printed)
    assert printed["state"] == "failed" and printed["reason"].startswith(reason), printed
    assert [s["name"] for s in printed["steps"]] == ["detect"]
    assert printed["steps"][0]["result"] == "skipped"
    assert not (tmp_path / "run/podvm-gpu/status.json").exists()
    spec = yaml.safe_load((tmp_path / "var/run/cdi/nvidia.yaml").read_text())
    assert spec["devices"][0]["containerEdits"]["env"][0] == "PODVM_GPU_STATE=failed"
    assert f"failed: {printed['reason']}" in console


def test_a_status_left_by_an_earlier_boot_is_not_written_without_the_lock(tmp_path):
    done, _ = boot(tmp_path)
    assert done.returncode == 0
    status = tmp_path / "run/podvm-gpu/status.json"
    before = status.read_bytes()
    (tmp_path / "run/podvm-gpu/boot.lock").unlink()
    (tmp_path / "run/podvm-gpu/boot.lock").mkdir()
    os.unlink(tmp_path / "dev/kmsg")
    done, _ = boot(tmp_path)
    assert done.returncode == 1
    assert status.read_bytes() == before


def test_the_clean_up_removes_only_boots_own_temporary_files(tmp_path):
    """Item 17: the clean-up removed every ``.*.tmp`` of /run/podvm-gpu, the running
    exporter's textfile temporary included (29 failed textfile writes over 100 boots)."""
    run_dir, cdi_dir = tmp_path / "run/podvm-gpu", tmp_path / "var/run/cdi"
    run_dir.mkdir(parents=True)
    cdi_dir.mkdir(parents=True)
    own = [run_dir / ".status.json.4242.tmp", run_dir / ".fabricmanager.cfg.17.tmp",
           cdi_dir / ".nvidia.yaml.99.tmp", cdi_dir / ".nvidia-imex.yaml.98.tmp",
           run_dir / ".nvattest-gpu.json.97.tmp", run_dir / ".nvattest-nvswitch.json.96.tmp"]
    others = [run_dir / ".metrics.prom.4243.tmp", run_dir / ".custom.prom.7.tmp",
              cdi_dir / ".other.yaml.5.tmp", run_dir / ".status.json.tmp"]
    for path in own + others:
        path.write_text("x")
    done, _ = boot(tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in own if p.exists()] == []
    assert [p.name for p in others if p.exists()] == [p.name for p in others]


@pytest.mark.parametrize("finding", [False, True])
def test_a_boot_leaves_the_watchers_file_and_its_temporary_alone(tmp_path, finding):
    """watch.json is the watcher's, written without the boot's lock: not in OWN_FILES (the
    comment there says why). A standing finding outlives the boot, which fails naming it."""
    from podvm_gpu.status import OWN_FILES
    from podvm_gpu.watchfile import WATCH_PATH, new_state

    assert os.path.basename(WATCH_PATH) not in OWN_FILES[os.path.dirname(WATCH_PATH)]
    run_dir = tmp_path / "run/podvm-gpu"
    run_dir.mkdir(parents=True)
    doc = new_state("2026-12-04T00:00:00Z")
    if finding:
        doc["finding"] = {"gpu": "0000:01:00.0", "reason": "watch: GPU 0000:01:00.0: Xid 79; "
                          "found at 2026-12-04T00:01:00Z (kernel log record 9)", "applied": True}
    watch, temporary = run_dir / "watch.json", run_dir / ".watch.json.4242.tmp"
    watch.write_text(json.dumps(doc))
    temporary.write_text("{")
    done, _ = boot(tmp_path)
    assert done.returncode == (1 if finding else 0), done.stderr
    assert json.loads(watch.read_text()) == doc and temporary.read_text() == "{"
    if finding:
        said = json.loads((run_dir / "status.json").read_text())["reason"]
        assert said.startswith("watch: a finding of the watcher stands: GPU 0000:01:00.0: Xid 79")


def test_config_compile_names_the_compiled_file_not_its_temporary(tmp_path, monkeypatch):
    """Item 22: on a full disk ``config --compile`` named no file; on a read-only file system
    it named the temporary file."""
    from podvm_gpu.config import load
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host import fs

    config = tmp_path / "config.yaml"
    config.write_text("budget_s: 100\n")

    def full(path, data, mode=0o644):
        raise OSError(28, "No space left on device", os.path.join(os.path.dirname(path),
                                                                  ".x.1.tmp"))

    monkeypatch.setattr(fs, "atomic_write", full)
    with pytest.raises(ConfigError) as err:
        load.compile_config(str(config))
    assert str(err.value) == f"{config}.compiled.json: cannot write: No space left on device"


def test_a_running_state_no_boot_finishes_names_a_failed_final_write_first():
    """Item 22: after a disk-full boot left ``running``, status blamed only SIGKILL, the OOM
    killer or a crash."""
    from podvm_gpu.status import ORPHANED

    assert "its final write failed, a full disk: the journal and the console line say so" \
        in ORPHANED


def boot_with_a_bug(root: Path, where: str) -> subprocess.CompletedProcess:
    """Boot in a child where ``podvm_gpu.boot.<where>`` raises (a bug, a broken install)."""
    code = ("import sys\n"
            "import podvm_gpu.boot as boot\n"
            "def broken(*args, **kwargs):\n"
            "    raise RuntimeError('a bug')\n"
            f"boot.{where} = broken\n"
            "from podvm_gpu.cli import main\n"
            f"sys.exit(main(['boot', '--root', {str(root)!r}]))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("where", ["channels_without_pci", "remove_leftovers"],
                         ids=["before the lock", "with the lock held"])
def test_a_bug_before_the_first_status_still_ends_failed_with_status_and_spec(tmp_path, where):
    """Item 1's other half: an exception before the first status write ended the boot with
    nothing written (kata-agent then waits out its own CDI timeout)."""
    done = boot_with_a_bug(tmp_path, where)
    assert done.returncode == 1, done.stderr
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert_status_conforms(status)
    assert status["state"] == "failed"
    assert status["reason"] == "detect: internal error: RuntimeError: a bug"
    spec = yaml.safe_load((tmp_path / "var/run/cdi/nvidia.yaml").read_text())
    assert spec["devices"][0]["containerEdits"]["env"][0] == "PODVM_GPU_STATE=failed"
