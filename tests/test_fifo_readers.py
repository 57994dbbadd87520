"""Issue 29 item 2: every file reader opens without blocking and refuses what is not a regular
file, by name (docs/interface.md 2.7). Each command runs with a timeout: before the fix each of
these hung for ever (``check``, ``check --image``) or held a GPU boot for its budget.

The readers: kata-agent's unit and drop-ins (``check``), podvm-gpu.service's drop-ins
(``check --image``), ``/etc/modprobe.d`` (``check --image``, and the modules step after a failed
modprobe), the module files ``modules.dep`` lists (``nvidia.ko.xz`` as a FIFO), and the installed
CDI spec (``check``'s ``cdi-spec`` row).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from boot.nvidia_image import KERNEL
from scenarios.world import DATA, World, load_case
from test_check_image import make_image

from podvm_gpu.host.fs import Root, file_kind, open_regular, read_bounded, unread

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 30  # a run that takes longer waited on a FIFO (each run here takes about a second)


def check_json(root: Path, *args: str, path: str | None = None) -> tuple[int, dict[str, dict]]:
    env = {**os.environ, "PATH": path or str(root / "usr/bin")}
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", *args, "--root", str(root),
                           "--json"], capture_output=True, text=True, env=env, timeout=LIMIT_S,
                          cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


# --- the reader itself --------------------------------------------------------------------------

def odd_files(folder: Path) -> dict[str, Path]:
    """A FIFO, a folder, a link, and (as root) a character device like /dev/null."""
    made = {"FIFO": folder / "fifo", "folder": folder / "folder", "link": folder / "link"}
    os.mkfifo(made["FIFO"])
    made["folder"].mkdir()
    (folder / "target").write_text("x")
    made["link"].symlink_to(folder / "target")
    if os.geteuid() == 0:
        made["character device"] = folder / "null"
        os.mknod(made["character device"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return made


def test_read_bounded_and_open_regular_refuse_each_odd_file_by_what_it_is(tmp_path):
    for kind, path in odd_files(tmp_path).items():
        for reader in (read_bounded, open_regular):
            with pytest.raises(OSError) as caught:
                reader(str(path))
            said = unread("/etc/x.conf", caught.value)
            assert said == f"/etc/x.conf is a {kind}" + (", not followed here" if kind == "link"
                                                         else ", not a regular file"), said


def test_root_read_or_why_names_the_host_path_and_follows_links_inside_the_root(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/real.conf").write_text("ok")
    (tmp_path / "etc/link.conf").symlink_to("/etc/real.conf")  # chroot-style: inside the root
    root = Root(tmp_path)
    assert root.read_or_why("/fifo") == (None, "/fifo is a FIFO, not a regular file")
    assert root.read_or_why("/etc/link.conf") == ("ok", "")
    assert file_kind(os.lstat(tmp_path / "etc/link.conf").st_mode) == "a link"


# --- check ----------------------------------------------------------------------------------------

def cpu_vm_with_kata(root: Path) -> Path:
    units = root / "etc/systemd/system"
    (units / "kata-agent.service.d").mkdir(parents=True)
    (units / "kata-agent.service").write_text(
        "[Service]\nExecStart=/usr/local/bin/kata-agent --config /etc/agent-config.toml\n")
    (root / "etc/agent-config.toml").write_text("cdi_timeout = { secs = 30, nanos = 0 }\n")
    return root


def test_check_names_a_fifo_drop_in_of_kata_agent_instead_of_waiting_on_it(tmp_path, podvm):
    root = cpu_vm_with_kata(tmp_path)
    os.mkfifo(root / "etc/systemd/system/kata-agent.service.d/50.conf")

    done = podvm(["check", "--root", str(root), "--json"], timeout=LIMIT_S)

    rows = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    said = "/etc/systemd/system/kata-agent.service.d/50.conf is a FIFO, not a regular file"
    assert said in rows["kata-agent-ordering"]["detail"], rows["kata-agent-ordering"]
    assert rows["kata-agent-cdi"]["result"] == "warn" and said in rows["kata-agent-cdi"]["detail"]


def test_check_names_a_fifo_as_the_installed_cdi_spec(tmp_path, podvm):
    (tmp_path / "var/run/cdi").mkdir(parents=True)
    os.mkfifo(tmp_path / "var/run/cdi/nvidia.yaml")

    done = podvm(["check", "--root", str(tmp_path), "--json"], timeout=LIMIT_S)

    row = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["cdi-spec"]
    assert row == {"name": "cdi-spec", "result": "fail", "detail": "/var/run/cdi/nvidia.yaml is "
                   "a FIFO, not a regular file", "hint": "run podvm-gpu boot: it replaces the file"}


# --- check --image --------------------------------------------------------------------------------

def test_check_image_names_a_fifo_drop_in_of_the_agent_unit(tmp_path):
    root = make_image(tmp_path)
    (root / "etc/systemd/system/podvm-gpu.service.d").mkdir(parents=True)
    os.mkfifo(root / "etc/systemd/system/podvm-gpu.service.d/50-x.conf")

    code, rows = check_json(root, "--image")

    row = rows["kata-agent-ordering"]
    assert row["result"] == "warn", row  # the unit's own Before= still orders it
    assert "/etc/systemd/system/podvm-gpu.service.d/50-x.conf is a FIFO, not a regular file" \
        in row["detail"] and "make each a regular file" in row["hint"]


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "folder"])
def test_check_image_fails_a_modprobe_d_entry_that_is_not_a_file_naming_it(tmp_path, make):
    root = make_image(tmp_path)
    (root / "etc/modprobe.d").mkdir(parents=True)
    make(root / "etc/modprobe.d/nvidia.conf")

    code, rows = check_json(root, "--image")

    row = rows["modules"]
    kind = "a FIFO" if make is os.mkfifo else "a folder"
    assert code == 1 and row["result"] == "fail", row
    assert row["detail"].startswith(f"/etc/modprobe.d/nvidia.conf is {kind}, not a regular file: "
                                    "kmod reads every *.conf"), row["detail"]


def test_check_image_names_a_module_file_modules_dep_lists_that_is_a_fifo(tmp_path):
    root = make_image(tmp_path)
    dkms = root / f"lib/modules/{KERNEL}/updates/dkms"
    (dkms / "nvidia.ko").unlink()
    os.mkfifo(dkms / "nvidia.ko.xz")
    (root / f"lib/modules/{KERNEL}/modules.dep").write_text(
        "updates/dkms/nvidia.ko.xz:\nupdates/dkms/nvidia-uvm.ko: updates/dkms/nvidia.ko.xz\n")

    code, rows = check_json(root, "--image")

    assert code == 1
    assert rows["modules"]["detail"] == (
        f"kernel {KERNEL}: modprobe nvidia reaches /lib/modules/{KERNEL}/updates/dkms/nvidia.ko.xz, "
        "which modules.dep names, is a FIFO, not a module file"), rows["modules"]
    compression = rows["module-compression"]
    assert compression["result"] == "fail" and "a FIFO, not a regular file" in compression["detail"]


# --- boot and check on a GPU VM whose modprobe failed ---------------------------------------------

def c06_with_fifos(world: World) -> None:
    """C06 (no module for the running kernel): a FIFO in /etc/modprobe.d and one named like the
    nvidia module in the running kernel's tree, where the modules step looks for a file that
    holds the module under another name."""
    os.makedirs(world.path("/etc/modprobe.d"), exist_ok=True)
    os.mkfifo(world.path("/etc/modprobe.d/nvidia.conf"))
    dkms = world.path("/lib/modules/6.8.0-1015-example/updates/dkms")
    os.makedirs(dkms)
    os.mkfifo(os.path.join(dkms, "nvidia.ko.xz"))
    os.mkfifo(os.path.join(dkms, "nvidia-current.ko"))


def test_a_gpu_boot_whose_modprobe_failed_names_the_missing_module_past_fifos():
    case = load_case(DATA / "cases/C06-no-module-for-running-kernel.yaml")
    with World(dataclasses.replace(case, id="C06-fifos")) as world:
        c06_with_fifos(world)
        boot = world.run("boot")
        check = world.run("check")

    assert boot.rc == 1 and boot.wall_s < 5, (boot.rc, boot.wall_s, boot.stderr[-2000:])
    assert boot.status["state"] == "failed"
    assert boot.status["reason"].startswith(
        "modules: no nvidia module for the running kernel 6.8.0-1015-example"), boot.status
    assert check.rc == 1 and check.wall_s < 10, (check.rc, check.wall_s)
    rows = {c["name"]: c for c in json.loads(check.stdout)["checks"]}
    assert rows["modules"]["result"] == "fail", rows["modules"]


def test_the_module_lock_write_fails_closed_on_a_fifo_instead_of_waiting(tmp_path):
    from podvm_gpu.errors import StepFailed
    from podvm_gpu.steps.modules.step import lock_module_loading

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    os.mkfifo(tmp_path / "proc/sys/kernel/modules_disabled")
    started = time.monotonic()
    with pytest.raises(StepFailed) as failed:
        lock_module_loading(Root(tmp_path))
    assert time.monotonic() - started < 5
    assert str(failed.value) == ("cannot lock module loading (modules.lock_after_boot): writing 1 "
                                 "to /proc/sys/kernel/modules_disabled failed: it is a FIFO, not a "
                                 "regular file")
    (tmp_path / "proc/sys/kernel/modules_disabled").unlink()
    (tmp_path / "proc/sys/kernel/modules_disabled").write_text("0\n")
    assert lock_module_loading(Root(tmp_path)).startswith("module loading locked")
    assert (tmp_path / "proc/sys/kernel/modules_disabled").read_text() == "1\n"
