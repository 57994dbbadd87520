"""Symlink and permission attacks (issue 10), through the real command in scenario worlds.

A link is planted at every path boot writes or creates (the status file and its temporary name,
the lock, the spec and its temporary name, the daemons' log files, the rename target of a
duplicate spec, the kernel log it writes its console line to, a GPU's device node, and the
folders /run/podvm-gpu and /var/run/cdi themselves), pointing out of the root, at a victim that
exists or at one that does not. Boot must never write through one: each victim is left as it
was (bytes and time) and none is created. Files are 0644 and folders 0755 whatever the umask
boot was started with. A root, a folder boot writes into, or a tool that another user owns or
can write is refused. (Configs another user could write, configured tool paths and planted
temporary names at a fixed pid: tests/test_hostile_inputs.py, tests/test_fs.py.)
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from scenarios.world import World

from reliability.faults import SCENARIOS, final_state_problems

LAUNCHER = Path(__file__).with_name("plant_and_boot.py")
OTHER_UID = 65534  # nobody


def scenario_case(name: str):
    return next(s for s in SCENARIOS if s.name == name).case()


@pytest.fixture
def launcher(monkeypatch):
    """Run the product through plant_and_boot.py: ``launcher(plant={...}, umask=0o077)``."""
    monkeypatch.setenv("PODVM_GPU_CMD", f"{sys.executable} {LAUNCHER}")

    def configure(plant: dict | None = None, umask: int | None = None) -> None:
        monkeypatch.setenv("PODVM_GPU_PLANT", json.dumps(plant or {}))
        if umask is None:
            monkeypatch.delenv("PODVM_GPU_UMASK", raising=False)
        else:
            monkeypatch.setenv("PODVM_GPU_UMASK", f"{umask:o}")

    return configure


class Victims:
    """Files and a folder outside the world's root that a planted link points at."""

    def __init__(self, world: World):
        self.dir = Path(world.layout.dir, "victim")
        self.dir.mkdir()
        self.before: dict[str, tuple] = {}

    def existing(self, name: str) -> str:
        path = self.dir / name
        path.write_text(f"victim {name}: must stay as it is\n")
        os.utime(path, (1_000_000_000, 1_000_000_000))
        return str(path)

    def dangling(self, name: str) -> str:
        return str(self.dir / name)

    def snapshot(self) -> dict:
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, stat.S_IMODE(p.stat().st_mode))
                for p in sorted(self.dir.iterdir())}


def boot(world: World, victims: Victims):
    before = victims.snapshot()
    run = world.run("boot")
    assert victims.snapshot() == before, "a victim outside the root was written, made or removed"
    return run


FILE_LINKS = ("/run/podvm-gpu/status.json", "/run/podvm-gpu/.status.json.{pid}.tmp",
              "/run/podvm-gpu/boot.lock", "/var/run/cdi/nvidia.yaml",
              "/var/run/cdi/.nvidia.yaml.{pid}.tmp", "/run/podvm-gpu/nvidia-persistenced.log",
              "/var/run/cdi/toolkit.yaml.disabled-by-podvm-gpu")
DUPLICATE = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: x\n  containerEdits:\n" \
            "    env: [A=1]\n"


@pytest.mark.parametrize("first", ["existing", "dangling"])
def test_links_at_every_file_boot_writes_are_never_written_through(launcher, first):
    """Half the links name a victim that exists, half one that does not (swapped in the other
    run); absolute and relative targets alternate. The boot still ends ready."""
    case = scenario_case("P02")
    case.files["var/run/cdi/toolkit.yaml"] = DUPLICATE
    with World(case) as world:
        victims = Victims(world)
        plant = {}
        for i, path in enumerate(FILE_LINKS):
            name = path.rsplit("/", 1)[1].format(pid="pid")
            kind = first if i % 2 == 0 else {"existing": "dangling", "dangling": "existing"}[first]
            target = getattr(victims, kind)(name)
            if i % 3 == 1:  # relative: climbs out of the root as the kernel reads it
                target = os.path.relpath(target, world.path(os.path.dirname(path)))
            plant[path] = target
        launcher(plant)
        run = boot(world, victims)
        problems = final_state_problems(world, run, budget_s=240)

        assert not problems, problems
        assert run.status["state"] == "ready", run.status
        root = Path(world.layout.root)
        for path in FILE_LINKS:
            real = root / path.lstrip("/")
            if "{pid}" in path:
                assert not list(real.parent.glob(real.name.replace("{pid}", "*")))
                continue
            assert real.is_file() and not real.is_symlink(), path
        assert any("toolkit.yaml also defined nvidia.com/gpu; renamed" in w
                   for w in run.status["warnings"])


@pytest.mark.parametrize("folder", ["/run/podvm-gpu", "/var/run/cdi"])
def test_a_link_in_place_of_a_folder_boot_writes_into_stays_inside_the_root(launcher, folder):
    with World(scenario_case("P02")) as world:
        victims = Victims(world)
        victims.existing("status.json")
        victims.existing("nvidia.yaml")
        launcher({folder: str(victims.dir)})
        run = boot(world, victims)
        problems = final_state_problems(world, run, budget_s=240)

        assert not problems, problems
        assert run.status["state"] == "ready", run.status
        # the absolute target is taken under the root, as in the VM where the root is /
        assert Path(world.layout.root, str(victims.dir).lstrip("/")).is_dir()


# path -> (scenario, the reason's start when the boot must fail); None: it ends ready
ONE_LINK = {
    "/dev/kmsg": ("P02", None),  # the console line is not written through it
    "/dev/nvidia0": ("P02", "device-nodes: /dev/nvidia0 exists but is a symlink"),
    "/run/podvm-gpu/nv-fabricmanager.log": ("P03", None),
}


@pytest.mark.parametrize("path", ONE_LINK)
def test_a_link_in_place_of_the_console_a_gpu_node_or_a_daemon_log_is_never_followed(
        launcher, path):
    name, reason = ONE_LINK[path]
    with World(scenario_case(name)) as world:
        victims = Victims(world)
        launcher({path: victims.existing(os.path.basename(path))})
        run = boot(world, victims)
        problems = final_state_problems(world, run, budget_s=240)

        assert not problems, problems
        if reason:
            assert run.status["reason"].startswith(reason), run.status["reason"]
            return
        assert run.status["state"] == "ready", run.status
        if path.endswith(".log"):
            assert Path(world.path(path)).is_file() and not Path(world.path(path)).is_symlink()


# --- modes whatever the umask ----------------------------------------------------------------------

MADE_FILES = ("/run/podvm-gpu/status.json", "/run/podvm-gpu/boot.lock",
              "/run/podvm-gpu/nvidia-persistenced.log", "/var/run/cdi/nvidia.yaml")
MADE_DIRS = ("/run", "/run/podvm-gpu", "/var/run/cdi")


@pytest.mark.parametrize("umask", [0o077, 0o000, 0o027], ids=["077", "000", "027"])
def test_the_gpu_path_makes_files_0644_and_folders_0755_whatever_the_umask(launcher, umask):
    with World(scenario_case("P02")) as world:
        launcher(umask=umask)
        run = world.run("boot")

        assert run.status["state"] == "ready", run.status
        modes = {p: stat.S_IMODE(os.stat(world.path(p)).st_mode) for p in MADE_FILES + MADE_DIRS}
        assert modes == {**dict.fromkeys(MADE_FILES, 0o644), **dict.fromkeys(MADE_DIRS, 0o755)}


# --- a root, a folder or a tool another user owns or can write ---------------------------------------

def boot_cpu(podvm, root: Path, empty_path: str):
    return podvm(["boot", "--root", str(root)], tree="cpu-vm", env={"PATH": empty_path})


@pytest.mark.parametrize("how", ["root-owned-by-another-user", "root-world-writable",
                                 "run-owned-by-another-user", "var-run-cdi-group-writable",
                                 "var-run-cdi-another-users-link-in-a-sticky-folder",
                                 "run-podvm-gpu-another-users-link-in-a-sticky-folder"])
def test_boot_refuses_to_write_under_a_root_another_user_could_change(tmp_path, podvm,
                                                                      empty_path, how):
    """Another user who can change a folder on the way can swap a part of the path for a link
    between boot's checks and its writes, and make root write anywhere."""
    root = tmp_path / "root"
    root.mkdir()
    if how == "root-owned-by-another-user":
        os.chown(root, OTHER_UID, OTHER_UID)
    elif how == "root-world-writable":
        root.chmod(0o777)
    elif how == "run-owned-by-another-user":
        (root / "run").mkdir()
        os.chown(root / "run", OTHER_UID, OTHER_UID)
    elif how == "var-run-cdi-group-writable":
        (root / "var/run/cdi").mkdir(parents=True)
        (root / "var/run/cdi").chmod(0o775)
    else:
        # found by a newcomer: the link leads to a root-owned folder (/etc/cdi, /etc), so every
        # folder on the resolved path is root's, but the link's owner can point it anywhere
        sticky = root / ("var/run" if how.startswith("var-run-cdi") else "run")
        sticky.mkdir(parents=True)
        sticky.chmod(0o1777)
        (root / "etc/cdi").mkdir(parents=True)
        link = sticky / ("cdi" if how.startswith("var-run-cdi") else "podvm-gpu")
        link.symlink_to("/etc/cdi" if how.startswith("var-run-cdi") else "/etc")
        os.chown(link, OTHER_UID, OTHER_UID, follow_symlinks=False)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    done = boot_cpu(podvm, root, empty_path)

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "refusing to write under" in done.stderr, done.stderr
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_a_root_in_a_sticky_world_writable_folder_is_still_booted(tmp_path, podvm, empty_path):
    """/tmp-like folders (sticky: nobody but an entry's owner can replace it) are safe."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    root = shared / "root"
    root.mkdir()

    done = boot_cpu(podvm, root, empty_path)

    assert done.returncode == 0, done.stderr
    assert json.loads((root / "run/podvm-gpu/status.json").read_text())["state"] == "no-gpu"


@pytest.mark.parametrize("how", ["tool-owned-by-another-user", "tool-group-writable",
                                 "tool-folder-world-writable"])
def test_boot_refuses_a_tool_on_path_another_user_could_replace(how):
    """Boot runs its tools as root: one that another user can change is a way in."""
    with World(scenario_case("P02")) as world:
        tool = Path(world.layout.bin, "nvidia-ctk")
        if how == "tool-owned-by-another-user":
            os.chown(tool, OTHER_UID, OTHER_UID)
        elif how == "tool-group-writable":
            tool.chmod(0o775)
        else:
            Path(world.layout.bin).chmod(0o777)
        run = world.run("boot")
        problems = final_state_problems(world, run, budget_s=240)

    assert not problems, problems
    reason = run.status["reason"]
    step = "modules" if how == "tool-folder-world-writable" else "device-nodes"
    assert reason.startswith(f"{step}: ") and "is refused: " in reason, reason
    assert not [c for c in run.calls if c.argv[0] == ("modprobe" if step == "modules"
                                                       else "nvidia-ctk")]


def test_check_runs_no_tool_another_user_could_replace():
    """``check`` runs as root on the VM as well: a query tool that another user can change is
    not run either, and the rows that needed it say why."""
    with World(scenario_case("P02")) as world:
        assert world.run("boot").status["state"] == "ready"
        Path(world.layout.bin, "nvidia-smi").chmod(0o775)
        run = world.run("check")

    assert not [c for c in run.calls if c.argv[0] == "nvidia-smi"], run.calls
    assert "nvidia-smi: " in run.stdout and "is refused: " in run.stdout, run.stdout
