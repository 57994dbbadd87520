"""``check --image``'s ``module-flavour`` row (issue 46 item 7, podvm_gpu/steps/modules/flavour.py):
open or proprietary, read from the ``license`` of the module ``modprobe nvidia`` reaches.

Synthetic images (tests/boot/nvidia_image.py: ELF objects with only a ``.modinfo`` section,
indexed by the real depmod) carry 615 and 580 modules of either licence; the two real Debian 12
535.261.03 test images (tests/boot/real_driver.py: ``nvidia-kernel-dkms``, proprietary, and
``nvidia-open-kernel-dkms``, open) are read where the image cache has them, nothing in them run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from boot.nvidia_image import KERNEL, add_nvidia_driver, depmod, kernel_module

from podvm_gpu.check import FAIL, PASS, SKIP, WARN
from podvm_gpu.check.image import Image
from podvm_gpu.config.load import parse_config
from podvm_gpu.config.model import Config
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.steps.modules import flavour

BLACKWELL = "modules:\n  image_serves_blackwell: true\n"
DKMS = f"lib/modules/{KERNEL}/updates/dkms"


def row(root: Path, config_text: str | None = None):
    config = parse_config(config_text, "config.yaml") if config_text else Config()
    return flavour.module_flavour_image_row(Image(Root(str(root)), config, Runner(read_only=True)))


def synthetic(root: Path, version: str, license_text: str) -> Path:
    """An image whose nvidia.ko (what modprobe nvidia reaches) is of ``version`` and licence."""
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    add_nvidia_driver(root, version)
    (root / DKMS / "nvidia.ko").write_bytes(kernel_module("nvidia", version, license_text))
    return root


def test_a_proprietary_615_module_fails_naming_the_file_and_the_branch(tmp_path):
    found = row(synthetic(tmp_path, "615.71.09", "NVIDIA"))
    assert found.result == FAIL, found
    assert f"/{DKMS}/nvidia.ko: proprietary (license: NVIDIA, 615.71.09)" in found.detail
    assert "from driver 615" in found.detail and "open" in found.hint


def test_an_open_615_module_passes_and_serves_blackwell(tmp_path):
    root = synthetic(tmp_path, "615.71.09", "Dual MIT/GPL")
    for config in (None, BLACKWELL):
        found = row(root, config)
        assert found.result == PASS, found
        assert "open (license: Dual MIT/GPL, 615.71.09)" in found.detail


def test_a_proprietary_580_module_passes_unless_the_image_serves_blackwell(tmp_path):
    root = synthetic(tmp_path, "580.126.09", "NVIDIA")
    assert row(root).result == PASS
    found = row(root, BLACKWELL)
    assert found.result == FAIL, found
    assert "modules.image_serves_blackwell is true" in found.detail
    assert "requires use of the NVIDIA open kernel modules" in found.detail


def test_a_licence_of_neither_flavour_warns_and_fails_where_blackwell_is_served(tmp_path):
    root = synthetic(tmp_path, "595.91.07", "GPL")
    found = row(root)
    assert found.result == WARN and "unknown (license: GPL" in found.detail, found
    assert row(root, BLACKWELL).result == FAIL


def test_both_flavours_installed_warns_naming_the_one_that_loads_and_why(tmp_path):
    root = synthetic(tmp_path, "595.91.07", "Dual MIT/GPL")
    # the proprietary build beside it under another file name, internal name nvidia (as Debian's
    # nvidia-current.ko), indexed as DKMS would
    (root / DKMS / "nvidia-current.ko").write_bytes(kernel_module("nvidia", "595.91.07", "NVIDIA"))
    depmod(root, KERNEL)
    found = row(root)
    assert found.result == WARN, found
    assert f"the proprietary module /{DKMS}/nvidia-current.ko is installed too" in found.detail
    assert f"the open /{DKMS}/nvidia.ko is the one that loads" in found.detail
    assert "modules.dep" in found.detail and "depmod" in found.detail
    # with the image serving Blackwell the open module it loads still serves it: not a failure
    assert row(root, BLACKWELL).result == WARN


def test_an_image_without_a_reached_module_skips(tmp_path):
    root = synthetic(tmp_path, "615.71.09", "NVIDIA")
    shutil.rmtree(root / "lib/modules")
    assert row(root).result == SKIP


def test_the_config_key_is_refused_where_it_is_not_a_boolean():
    with pytest.raises(Exception, match="image_serves_blackwell"):
        parse_config("modules:\n  image_serves_blackwell: maybe\n", "config.yaml")


def test_debians_alternative_names_the_choice_and_what_it_wins_over(tmp_path):
    admin = tmp_path / "var/lib/dpkg/alternatives"
    admin.mkdir(parents=True)
    # update-alternatives' format, as the real images have it (one slave kept)
    (admin / "nvidia").write_text(
        "auto\n/usr/lib/nvidia/nvidia\nnvidia--nvidia-modprobe.conf\n/etc/nvidia/nvidia-modprobe.conf\n\n"
        "/usr/lib/nvidia/current\n535\n/etc/nvidia/nvidia-535.261.03/nvidia-modprobe.conf\n"
        "/usr/lib/nvidia/current-open\n534\n/etc/nvidia/535.261.03-open/nvidia-modprobe.conf\n\n")
    said = flavour.debian_alternative(Root(str(tmp_path)))
    # no /etc/alternatives/nvidia link: auto mode takes the highest priority, as dpkg does
    assert said == ("Debian's nvidia alternative (auto) selects /usr/lib/nvidia/current (priority 535)"
                    " over /usr/lib/nvidia/current-open (priority 534)")
    (tmp_path / "etc/alternatives").mkdir(parents=True)
    (tmp_path / "etc/alternatives/nvidia").symlink_to("/usr/lib/nvidia/current-open")
    assert flavour.debian_alternative(Root(str(tmp_path))).startswith(
        "Debian's nvidia alternative (auto) selects /usr/lib/nvidia/current-open (priority 534)")


# --- the real Debian 12 images ------------------------------------------------------------

@pytest.fixture(scope="module")
def real_images():
    from boot import real_driver

    return {"proprietary": real_driver.nvidia_rootfs(), "open": real_driver.open_rootfs()}


def real_module(rootfs: Path, name: str) -> Path:
    [path] = rootfs.glob(f"lib/modules/*/updates/dkms/{name}.ko")
    return path


@pytest.mark.slow
def test_the_real_images_read_as_their_packages_say(real_images):
    proprietary = row(real_images["proprietary"])
    assert proprietary.result == PASS, proprietary
    assert "nvidia-current.ko: proprietary (license: NVIDIA, 535.261.03)" in proprietary.detail
    opened = row(real_images["open"])
    assert opened.result == PASS, opened
    assert "nvidia-current-open.ko: open (license: Dual MIT/GPL, 535.261.03)" in opened.detail
    # an image that serves Blackwell: the proprietary one fails, the open one passes
    assert row(real_images["proprietary"], BLACKWELL).result == FAIL
    assert row(real_images["open"], BLACKWELL).result == PASS
    # the licences straight from the files, with the project's reader (no modinfo run)
    from podvm_gpu.host import kmod

    assert kmod.modinfo_fields(str(real_module(real_images["proprietary"], "nvidia-current")),
                               "license") == ["NVIDIA"]
    assert kmod.modinfo_fields(str(real_module(real_images["open"], "nvidia-current-open")),
                               "license") == ["Dual MIT/GPL"]


@pytest.mark.slow
def test_the_open_module_beside_the_real_proprietary_install_is_named_with_debians_rule(
        real_images, tmp_path):
    """The open image's real module file put beside the proprietary image's (the third variant
    with both packages is not built: this holds the row's words on real files and rules)."""
    from boot import image

    with image.writable_view(real_images["proprietary"], tmp_path / "view") as root:
        target = real_module(root, "nvidia-current").with_name("nvidia-current-open.ko")
        shutil.copyfile(real_module(real_images["open"], "nvidia-current-open"), target)
        found = row(root)
    assert found.result == WARN, found
    assert "the open module /lib/modules/" in found.detail and "nvidia-current-open.ko is installed too" \
        in found.detail
    assert "proprietary /lib/modules/" in found.detail and "nvidia-current.ko is the one that loads" \
        in found.detail
    assert "modprobe nvidia follows /etc/modprobe.d/nvidia.conf: install nvidia modprobe -i " \
        "nvidia-current $CMDLINE_OPTS" in found.detail
    assert "Debian's nvidia alternative (auto) selects /usr/lib/nvidia/current (priority 535)" \
        in found.detail


@pytest.mark.slow
def test_the_image_with_both_packages_warns_naming_debians_choice_and_follows_a_change(tmp_path):
    """Debian 12 with nvidia-kernel-dkms and nvidia-open-kernel-dkms installed together
    (tests/boot/real_driver.py ``BOTH``): the alternative in auto mode picks the proprietary
    module; set to the open one (update-alternatives, run in the image), the open one loads."""
    from boot import image, real_driver

    both = real_driver.both_rootfs()
    found = row(both)
    assert found.result == WARN, found
    assert "nvidia-current-open.ko is installed too, and the proprietary /lib/modules/" in found.detail
    assert "Debian's nvidia alternative (auto) selects /usr/lib/nvidia/current (priority 535) over " \
        "/usr/lib/nvidia/current-open (priority 534)" in found.detail
    assert "install nvidia modprobe -i nvidia-current $CMDLINE_OPTS" in found.detail
    assert row(both, BLACKWELL).result == FAIL
    with image.writable_view(both, tmp_path / "view") as root:
        done = image.nspawn(root, "update-alternatives", "--set", "nvidia", "/usr/lib/nvidia/current-open")
        assert done.returncode == 0, done.stderr
        switched = row(root)
        blackwell = row(root, BLACKWELL)
    assert switched.result == WARN, switched
    assert "nvidia-current.ko is installed too, and the open /lib/modules/" in switched.detail
    assert "Debian's nvidia alternative (manual) selects /usr/lib/nvidia/current-open (priority 534)" \
        in switched.detail
    assert blackwell.result == WARN, blackwell  # the open module loads: Blackwell is served
