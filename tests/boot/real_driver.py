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


# Debian 12's open module (nvidia-open-kernel-dkms, the same 535.261.03 as the proprietary one),
# from bookworm alone: with bookworm-security in the sources its kernel is 6.1.0-57 (6.1.192),
# which has the 4-argument pci_resize_resource() of 6.12, and the 535.261.03 build fails there
# (nv-pci.c:223:9: error: too few arguments to function 'pci_resize_resource'; measured
# 2026-12-01). Every package of the driver's source is pinned to the open module's version all
# the same: a point release may carry newer user space of the proprietary driver only, as
# bookworm-security does (535.309.01; the versions test installs that one on purpose). DKMS
# builds nvidia-current-open.ko; libcuda1 pulls in glx-alternative-nvidia, which links Debian's
# modprobe.d install rules.
OPEN_DRIVER_PACKAGES = tuple(p.replace("nvidia-kernel-dkms", "nvidia-open-kernel-dkms") for p in DRIVER_PACKAGES)
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
OPEN = image.Variant("open", "open-rootfs-", (*image.PACKAGES, *OPEN_DRIVER_PACKAGES), COMPONENTS,
                     by_versions=True, pin=("nvidia-open-kernel-dkms", "nvidia-graphics-drivers"))
# Debian 13 as a careless image build makes it: the driver's user space and firmware with the
# image, then the open module's DKMS package last, its failure tolerated (550.163.01 does not
# build for trixie's 6.12 cloud kernels: pci_resize_resource() has four arguments there).
TRIXIE = image.Variant("trixie-open", "trixie-open-rootfs-", (*image.PACKAGES, *(
    p for p in DRIVER_PACKAGES if p != "nvidia-kernel-dkms")), COMPONENTS, by_versions=True,
    suite="trixie", late=("nvidia-open-kernel-dkms",))


# Both flavours of Debian 12's 535.261.03 module in one image (issue 46 item 7): apt installs
# nvidia-kernel-dkms and nvidia-open-kernel-dkms side by side (nvidia-kernel-support and
# nvidia-open-kernel-support register the `nvidia` alternative at priorities 535 and 534), DKMS
# builds nvidia-current.ko and nvidia-current-open.ko, and the alternative in auto mode picks
# the proprietary one's modprobe.d rules.
BOTH = image.Variant("both", "both-rootfs-", (*image.PACKAGES, *DRIVER_PACKAGES, "nvidia-open-kernel-dkms"),
                     COMPONENTS, by_versions=True, pin=("nvidia-open-kernel-dkms", "nvidia-graphics-drivers"))


def both_rootfs() -> Path:
    """The cached Debian 12 rootfs with the proprietary and the open module."""
    return image.variant_rootfs(BOTH)


def open_rootfs() -> Path:
    """The cached Debian 12 open-module rootfs (about 5 minutes to build here)."""
    return image.variant_rootfs(OPEN)


def trixie_rootfs() -> Path:
    """The cached Debian 13 rootfs whose open-module DKMS build failed (or, once Debian has a 550
    that builds for its kernel, did not)."""
    return image.variant_rootfs(TRIXIE)


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


def boot_with_fake_pci(rootfs: Path, bundle: Path, workdir: Path) -> "image.Boot":
    """A qemu boot of a real-driver image in which only the agent's view of PCI is faked: the
    agent (from ``bundle``) and the kata-agent stand-in installed in a writable view of
    ``rootfs``, an H100 PCIe through umockdev in the unit's drop-in (tests/boot/real), so the
    real module in the real kernel finds no device. Artifacts go to ``workdir/artifacts``."""
    with image.writable_view(rootfs, workdir / "image") as root:
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        image.install_file(image.HERE / "gpu/h100.umockdev", root,
                           "/usr/local/lib/podvm-gpu-test/h100.umockdev")
        image.install_file(image.HERE / "real/podvm-gpu.service.d/50-fake-pci.conf", root,
                           "/etc/systemd/system/podvm-gpu.service.d/50-fake-pci.conf")
        return image.boot_qemu(root, workdir / "artifacts")
