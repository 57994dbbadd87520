"""The ``firmware`` row of ``check --image``: the firmware files the nvidia module asks for are
where the kernel's loader finds them (moved out of step.py, which the 500-line rule holds)."""

from __future__ import annotations

import os

from podvm_gpu.host import kmod
from podvm_gpu.host.fs import Root
from podvm_gpu.row import FAIL, PASS, SKIP, Check
from podvm_gpu.steps.modules.attach import loader_row

# The firmware loader's search path (drivers/base/firmware_loader/main.c) and the compressed
# forms kernel 6.1 reads (CONFIG_FW_LOADER_COMPRESS: .xz, .zst).
_FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                  "/lib/firmware")
_FIRMWARE_SUFFIXES = ("", ".xz", ".zst")


def firmware_present(root: Root, release: str, name: str) -> str | None:
    """The host path of firmware file ``name`` (as a module names it) where the kernel finds it,
    or None."""
    for folder in _FIRMWARE_DIRS:
        for suffix in _FIRMWARE_SUFFIXES:
            path = f"{folder.format(release=release)}/{name}{suffix}"
            if os.path.isfile(root.resolve(path)):
                return path
    return None


def firmware_image_row(image) -> Check:
    """The firmware files the nvidia module asks for (``modinfo -F firmware``, the GSP images of
    535) must be where the kernel's loader finds them, or the driver fails on GSP GPUs."""
    root, runner, found = image.root, image.runner, image.found
    asked: list[tuple[str, str, str]] = []
    unreadable: list[str] = []
    files = kmod.present_files(root, found)
    if not files:  # nothing compared: not a pass; the modules row fails for the cause
        return Check("firmware", SKIP, "no nvidia module in the image to read the firmware it "
                     "asks for from (see modules)", "fix the modules row first")
    for release, file in files.items():
        names = kmod.modinfo(runner, root.resolve(file), "firmware")
        if not names and not any(kmod.modinfo(runner, root.resolve(file), key)
                                 for key in ("vermagic", "version")):
            unreadable.append(file)  # no .modinfo at all: not "asks for none"
        asked += [(release, file, name) for name in names]
    missing = [(k, f, n) for k, f, n in asked if firmware_present(root, k, n) is None]
    if missing:
        release, module, name = missing[0]
        return Check("firmware", FAIL, f"{module} asks for firmware {name}, not under /lib/firmware"
                     + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                     "install the driver's GSP firmware package (Debian: firmware-nvidia-gsp)")
    if unreadable:
        return Check("firmware", FAIL, f"cannot read the .modinfo of {unreadable[0]}"
                     + (f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else "")
                     + ": the firmware it asks for is unknown", kmod.UNREADABLE_MODULE_HINT)
    if not asked:
        return Check("firmware", PASS, "the nvidia module asks for no firmware files")
    if (row := loader_row(root, sorted({k for k, _, _ in asked}))) is not None:  # issue 28
        return row
    names = sorted({n for _, _, n in asked})
    return Check("firmware", PASS, f"{', '.join(names)} present under /lib/firmware")
