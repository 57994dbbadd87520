"""Stand-ins for what the NVIDIA packages put into a GPU pod VM image, for ``check --image``.

nvidia modules under ``/lib/modules/<release>`` for each kernel in ``/boot``, that
``modinfo`` reads a version and the GSP firmware files from (minimal ELF objects with a
``.modinfo`` section, as DKMS builds have; ``nvidia.ko`` names the two firmware files the real
535 module names, tests/data/nvidia-535.261.03/plain/modinfo-F-firmware-nvidia-current), those
firmware files, the user-space driver (``libnvidia-ml.so.<version>`` and its ``.so.1`` link),
and the toolkit and daemon commands as stubs. Nothing of it runs; the image check only looks.
As DKMS does after it installs modules, the real ``depmod -b <image> <release>`` indexes them
(``modules.dep`` and ``modules.dep.bin``, the index kmod's modprobe reads: without it kmod finds
no module, and ``check --image`` fails, issue 35 item 2). This is the plain ``nvidia.ko``
layout of NVIDIA's own packages; Debian's is in the real-driver image (tests/boot/real_driver.py).
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

KERNEL = "6.1.0-podvm-amd64"
VERSION = "550.54.15"
MODULES = ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"]
COMMANDS = ["nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nvidia-cdi-hook", "nvidia-modprobe"]


def firmware_files(version: str) -> list[str]:
    """The GSP firmware the nvidia module of ``version`` asks for, as 535 names it."""
    return [f"nvidia/{version}/gsp_tu10x.bin", f"nvidia/{version}/gsp_ga10x.bin"]


def kernel_module(name: str, version: str, license: str = "Dual MIT/GPL") -> bytes:
    """An x86-64 ELF relocatable object whose only content is a ``.modinfo`` section;
    ``license``: the open module's (the default) or ``NVIDIA`` (the proprietary module's)."""
    fields = [("version", version), ("license", license), ("name", name.replace("-", "_"))]
    if name == "nvidia":
        fields += [("firmware", f) for f in firmware_files(version)]
    modinfo = b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields)
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    ehsize, shentsize = 64, 64
    modinfo_off = ehsize
    shstrtab_off = modinfo_off + len(modinfo)
    shoff = (shstrtab_off + len(shstrtab) + 7) & ~7
    header = struct.pack("<4s5B7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 1, 62, 1, 0, 0, shoff, 0,
                         ehsize, 0, 0, shentsize, 3, 2)

    def section(name, kind, flags, offset, size):
        return struct.pack("<IIQQQQIIQQ", name, kind, flags, 0, offset, size, 0, 0, 1, 0)

    body = header + modinfo + shstrtab
    body += b"\0" * (shoff - len(body))
    return body + section(0, 0, 0, 0, 0) + section(1, 1, 2, modinfo_off, len(modinfo)) + \
        section(10, 3, 0, shstrtab_off, len(shstrtab))


def add_nvidia_driver(rootfs: Path, version: str = VERSION) -> None:
    """Modules for every kernel the image has (a stand-in kernel when it has none), as DKMS
    builds them, plus their firmware, the user-space driver and the commands."""
    boot = rootfs / "boot"
    boot.mkdir(exist_ok=True)
    kernels = [k.name.removeprefix("vmlinuz-") for k in boot.glob("vmlinuz-*")]
    if not kernels:
        (boot / f"vmlinuz-{KERNEL}").write_bytes(b"")
        kernels = [KERNEL]
    for kernel in kernels:
        dkms = rootfs / f"lib/modules/{kernel}/updates/dkms"
        dkms.mkdir(parents=True, exist_ok=True)
        for name in MODULES:
            (dkms / f"{name}.ko").write_bytes(kernel_module(name, version))
        depmod(rootfs, kernel)
    for name in firmware_files(version):
        path = rootfs / "lib/firmware" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    for lib in ("libnvidia-ml", "libcuda"):
        (libdir / f"{lib}.so.{version}").write_bytes(b"")
        (libdir / f"{lib}.so.1").symlink_to(f"{lib}.so.{version}")
    for command in COMMANDS:
        path = rootfs / "usr/bin" / command
        path.write_text(f"#!/bin/sh\necho 'stand-in {command} {version}: not for running' >&2\nexit 1\n")
        path.chmod(0o755)


def depmod(rootfs: Path, kernel: str) -> None:
    """``depmod -b <rootfs> <kernel>`` with the real kmod (:func:`kmod_program`): the index DKMS
    leaves after it installs modules. Its warnings about files a stand-in kernel lacks
    (``modules.order``, ``modules.builtin``) are expected."""
    done = subprocess.run([kmod_program("depmod"), "-b", str(rootfs), kernel],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def kmod_program(name: str) -> str:
    """A real kmod program (``depmod``, ``modprobe``): the host's (PATH, /usr/sbin, /sbin), else
    Debian 12's kmod unpacked from its ``.deb`` (tests/debian_packages.py, nothing installed)
    into the test cache and called by a link of that name (kmod is one program that acts by the
    name it is called by). Fails in CI, skips elsewhere, when neither can be had."""
    for folder in (*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/sbin"):
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    import debian_packages
    from boot.image import CACHE

    deb = debian_packages.fetch("kmod")
    home = CACHE / f"kmod-{debian_packages.version_of(deb)}"
    link = home / "bin" / name
    if not link.exists():
        scratch = CACHE / f".kmod-{os.getpid()}"
        debian_packages.unpack(deb, scratch, "./bin/kmod")
        for program in ("depmod", "modprobe", "modinfo"):
            (scratch / "bin" / program).symlink_to("kmod")
        try:
            os.rename(scratch, home)
        except OSError:  # another worker unpacked it first
            subprocess.run(["rm", "-rf", str(scratch)], check=False, timeout=60)
    return str(link)
