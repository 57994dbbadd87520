"""pytest fixtures for the boot tests; a test module imports the ones it uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from boot import image

SPEC_TEMPLATE = Path(__file__).parent / "data/spec-1gpu.yaml"


@pytest.fixture(scope="module", params=sorted(image.BASES))
def installed(request, tmp_path_factory):
    """A GPU image with the agent installed, never booted: the base rootfs (Debian 12 with
    systemd 252, and Debian 13 with systemd 257: each boot test runs on both), the NVIDIA
    packages' units (enabled, as the packages leave them), podvm-gpu (bundle + installer for
    the image's Python), and the kata-agent stand-in."""
    image.require_root()
    base = image.variant_rootfs(image.BASES[request.param])
    bundle = image.bundle(tmp_path_factory, base)
    with image.writable_view(base, tmp_path_factory.mktemp(f"installed-{request.param}")) as root:
        image.install_nvidia_package_units(root)
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        yield root


@pytest.fixture
def rootfs(tmp_path, installed):
    """A fresh view of the installed image for one boot."""
    with image.writable_view(installed, tmp_path / "image") as root:
        yield root


def host_has_nvidia_pci_device() -> bool:
    return any((dev / "vendor").read_text().strip() == "0x10de"
               for dev in Path("/sys/bus/pci/devices").glob("*") if (dev / "vendor").exists())


@pytest.fixture(scope="module")
def podman_installed(tmp_path_factory):
    """As ``installed``, on the podman image (tests/boot/podman_image.py), with the local
    container image imported and the CDI hook's stand-in."""
    from boot import podman_image

    image.require_root()
    base = podman_image.podman_rootfs()
    bundle = image.bundle(tmp_path_factory, base)
    with image.writable_view(base, tmp_path_factory.mktemp("podman")) as root:
        image.install_nvidia_package_units(root)
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        podman_image.add_podman(root)
        yield root


@pytest.fixture
def podman_rootfs(tmp_path, podman_installed):
    """A fresh view of the podman image for one boot."""
    with image.writable_view(podman_installed, tmp_path / "image") as root:
        yield root
