"""What ``modprobe <name>`` loads (podvm_gpu/host/kmod.py): the reader of modprobe.d and the module tree
on small trees, then the reader and the kmod query against Debian 12's real kmod 30 in the
real-driver image, one configuration after the other."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from boot import image, real_driver
from boot.nvidia_image import kernel_module

from podvm_gpu.errors import CommandError
from podvm_gpu.host import kmod
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed

REL = "6.1.0-50-cloud-amd64"
DEBIAN = ("install nvidia modprobe -i nvidia-current $CMDLINE_OPTS\n"
          "install nvidia-uvm modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS\n")


def tree(tmp_path: Path, files: dict[str, str], modules: dict[str, str]) -> Root:
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for path, internal in modules.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(kernel_module(internal, "535.261.03"))
    return Root(tmp_path)


def debian_tree(tmp_path: Path, extra: dict[str, str] | None = None) -> Root:
    """Debian's layout: nvidia-current*.ko, its rules behind absolute links (alternatives)."""
    root = tree(tmp_path, {"etc/nvidia/current/nvidia-modprobe.conf": DEBIAN, **(extra or {})},
                {f"lib/modules/{REL}/updates/dkms/nvidia-current.ko": "nvidia",
                 f"lib/modules/{REL}/updates/dkms/nvidia-current-uvm.ko": "nvidia-uvm"})
    (tmp_path / "etc/alternatives").mkdir(parents=True)
    (tmp_path / "etc/alternatives/glx--nvidia-modprobe.conf").symlink_to("/etc/nvidia/current/nvidia-modprobe.conf")
    (tmp_path / "etc/modprobe.d").mkdir(exist_ok=True)
    (tmp_path / "etc/modprobe.d/nvidia.conf").symlink_to("/etc/alternatives/glx--nvidia-modprobe.conf")
    return root


def test_nvidia_packages_plain_layout_resolves_by_file_name(tmp_path):
    root = tree(tmp_path, {}, {f"lib/modules/{REL}/updates/dkms/nvidia.ko": "nvidia",
                               f"lib/modules/{REL}/updates/dkms/nvidia-uvm.ko": "nvidia-uvm"})
    assert kmod.read_resolve(root, REL, "nvidia").file == f"/lib/modules/{REL}/updates/dkms/nvidia.ko"
    assert kmod.read_resolve(root, REL, "nvidia_uvm").file == f"/lib/modules/{REL}/updates/dkms/nvidia-uvm.ko"


def test_debian_install_rules_are_followed_through_links_inside_the_root(tmp_path):
    root = debian_tree(tmp_path)
    res = kmod.read_resolve(root, REL, "nvidia")
    assert res.file == f"/lib/modules/{REL}/updates/dkms/nvidia-current.ko"
    assert res.rules == ("/etc/modprobe.d/nvidia.conf: install nvidia modprobe -i nvidia-current $CMDLINE_OPTS",)
    uvm = kmod.read_resolve(root, REL, "nvidia_uvm")
    assert uvm.file == f"/lib/modules/{REL}/updates/dkms/nvidia-current-uvm.ko"


def test_without_the_rule_nothing_resolves_but_the_file_is_found_by_its_internal_name(tmp_path):
    root = debian_tree(tmp_path)
    (tmp_path / "etc/modprobe.d/nvidia.conf").unlink()
    assert not kmod.read_resolve(root, REL, "nvidia").found
    assert kmod.files_named(root, REL, "nvidia") == [f"/lib/modules/{REL}/updates/dkms/nvidia-current.ko"]


def test_the_first_install_line_wins_and_a_command_without_modprobe_blocks(tmp_path):
    root = debian_tree(tmp_path, {"etc/modprobe.d/00-off.conf": "install nvidia /bin/false\n"})
    res = kmod.read_resolve(root, REL, "nvidia")
    assert (res.file, res.blocked) == (None, "/etc/modprobe.d/00-off.conf: install nvidia /bin/false")
    (tmp_path / "etc/modprobe.d/00-off.conf").rename(tmp_path / "etc/modprobe.d/zz-off.conf")
    assert kmod.read_resolve(root, REL, "nvidia").file.endswith("nvidia-current.ko")


def test_a_config_file_in_etc_hides_the_same_name_in_lib(tmp_path):
    root = debian_tree(tmp_path, {"lib/modprobe.d/nvidia.conf": "install nvidia /bin/false\n"})
    assert kmod.read_resolve(root, REL, "nvidia").file.endswith("nvidia-current.ko")


def test_install_targets_skip_removals_options_and_parameters():
    assert kmod.install_targets("modprobe nvidia ; modprobe -i nvidia-current-uvm $CMDLINE_OPTS") == [
        ("nvidia", False), ("nvidia-current-uvm", True)]
    assert kmod.install_targets("modprobe -r -i nvidia-drm nvidia-modeset") == []
    assert kmod.install_targets("/sbin/modprobe --ignore-install nvidia NVreg_X=1") == [("nvidia", True)]
    assert kmod.install_targets("/bin/false") == []


def test_a_rule_loop_ends(tmp_path):
    root = tree(tmp_path, {"etc/modprobe.d/loop.conf": "install a modprobe b\ninstall b modprobe a\n"}, {})
    res = kmod.read_resolve(root, REL, "a")
    assert not res.found and "loop" in res.blocked


def test_kmod_is_asked_only_on_the_real_root(tmp_path):
    class Runner:
        calls: list = []

        def which(self, tool):
            return "/usr/sbin/modprobe"

        def run(self, argv, check=True):
            self.calls.append(argv)
            raise CommandError(argv, None, message="not here")

    runner = Runner()
    root = debian_tree(tmp_path)
    assert kmod.resolve(root, REL, "nvidia", runner).source == "modprobe.d and modules.dep"
    assert runner.calls == []
    assert kmod.kmod_resolve(runner, REL, "nvidia") is None, "kmod that cannot answer gives way"


# --- against the real kmod 30 of Debian 12 ------------------------------------------------------

class ChrootRunner:
    """Runs the image's own modprobe in a chroot of it: only --show-depends queries (read-only)."""

    def __init__(self, root: Path):
        self.root = root

    def which(self, tool: str) -> str | None:
        return tool

    def run(self, argv: list[str], check: bool = True) -> Completed:
        done = subprocess.run(["chroot", str(self.root), *argv], capture_output=True, text=True, timeout=30)
        return Completed(argv, done.returncode, done.stdout, done.stderr, 0.0)


CONFIGS = {  # name -> (files to write, files to remove) in the image's /etc/modprobe.d; {file}: the
    # module's file name (nvidia-current, nvidia-current-open)
    "debian": ({}, []),
    "no-rule": ({}, ["nvidia.conf"]),
    "install-false-first": ({"00-off.conf": "install nvidia /bin/false\n"}, []),
    "install-false-after": ({"zz-off.conf": "install nvidia /bin/false\n"}, []),
    "alias-instead-of-install": ({"00-alias.conf": "alias nvidia {file}\n"}, ["nvidia.conf"]),
    "blacklisted": ({"00-bl.conf": "blacklist nvidia\nblacklist {file}\n"}, []),
}
# Debian's real images (tests/boot/real_driver.py) -> (rootfs, the nvidia module's file name):
# kmod 30 with the proprietary and the open module, and Debian 13's kmod 34 over the rules of an
# image whose module failed to build (both must find nothing there).
IMAGES = {"bookworm": (real_driver.nvidia_rootfs, "nvidia-current"),
          "bookworm-open": (real_driver.open_rootfs, "nvidia-current-open"),
          "trixie-no-module": (real_driver.trixie_rootfs, "nvidia-current-open")}


@pytest.fixture(scope="module", params=list(IMAGES))
def real_image(request, tmp_path_factory):
    image.require_root()
    image.require_tools("chroot")
    rootfs, stem = IMAGES[request.param]
    with image.writable_view(rootfs(), tmp_path_factory.mktemp("kmod")) as root:
        yield root, stem


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", ["nvidia", "nvidia_uvm", "{file}"])
def test_the_reader_and_the_kmod_query_agree_with_real_kmod(real_image, config, name):
    """Real: Debian's kmod (modprobe -S <release> --show-depends) on the image's real module
    tree and modprobe.d (Debian's rules behind the alternatives links), changed per config."""
    real_image, stem = real_image
    name = name.format(file=stem)
    confdir = real_image / "etc/modprobe.d"
    saved = real_image.parent / "saved-modprobe.d"
    shutil.copytree(confdir, saved, symlinks=True)
    try:
        add, remove = CONFIGS[config]
        for f in remove:
            (confdir / f).unlink()
        for f, text in add.items():
            (confdir / f).write_text(text.format(file=stem))
        release = sorted(p.name for p in (real_image / "lib/modules").iterdir())[-1]
        asked = kmod.kmod_resolve(ChrootRunner(real_image), release, name)
        read = kmod.read_resolve(Root(real_image), release, name)
        assert asked is not None
        assert (read.file, bool(read.blocked)) == (asked.file, bool(asked.blocked)), (asked, read)
        built = (real_image / f"lib/modules/{release}/updates/dkms/{stem}.ko").exists()
        if config == "debian" and built:
            assert read.file and read.file.endswith((f"{stem}.ko", f"{stem}-uvm.ko"))
        if not built:
            assert read.file is None, read
    finally:
        shutil.rmtree(confdir)
        shutil.copytree(saved, confdir, symlinks=True)
        shutil.rmtree(saved)
