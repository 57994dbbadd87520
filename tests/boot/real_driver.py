"""The real-driver test image: Debian 12's own NVIDIA 535 packages in the boot-test rootfs.

The base image (tests/boot/image.py) plus, from the same archive with the ``contrib``,
``non-free`` and ``non-free-firmware`` components, the kernel headers and the driver stack a
distribution installs: the kernel module source that DKMS builds for the image's kernel during
the build (``nvidia-kernel-dkms``), ``nvidia-smi``, NVML (``libnvidia-ml1``), ``libcuda1``,
``nvidia-persistenced``, ``nvidia-modprobe`` and the GSP firmware. ``nvidia-ctk`` and the fabric
manager are not in Debian 12 and stay stand-ins. The cache is keyed on the versions apt
resolves, so a driver update in the archive builds a new image; the fixtures captured from it
are named by the driver version (tests/data/nvidia-<version>/).
"""

from __future__ import annotations

from pathlib import Path

from boot import image

# libcuda1: containers get libcuda.so.1 from the image (nvidia-ctk puts it in the CDI spec), and
# Debian sets up /etc/modprobe.d/nvidia.conf, without which `modprobe nvidia` finds no module,
# only when an NVIDIA library like it is installed (glx-alternative-nvidia's "headless CUDA" case).
DRIVER_PACKAGES = ("linux-headers-cloud-amd64", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1",
                   "libcuda1", "nvidia-persistenced", "nvidia-modprobe", "firmware-nvidia-gsp")
NVIDIA = image.Variant("nvidia", "nvidia-rootfs-", (*image.PACKAGES, *DRIVER_PACKAGES),
                       ("main", "contrib", "non-free", "non-free-firmware"), by_versions=True)


def nvidia_rootfs() -> Path:
    """The cached real-driver rootfs; built when the cache lacks it (about 4 minutes here)."""
    return image.variant_rootfs(NVIDIA)


TOOLKIT_STANDINS = ("nvidia-ctk", "nvidia-cdi-hook")  # not in Debian 12: the only stand-ins


def add_toolkit_standins(rootfs: Path) -> None:
    """The NVIDIA Container Toolkit's commands as stubs: ``check --image`` only looks for them."""
    for command in TOOLKIT_STANDINS:
        path = rootfs / "usr/bin" / command
        path.write_text(f"#!/bin/sh\necho 'stand-in {command}: not for running' >&2\nexit 1\n")
        path.chmod(0o755)
