"""A plain sysfs pre-scan for NVIDIA PCI functions, used by the CPU fast path and by the wait for
GPUs that appear late.

Contract section 3 step 1, speed note: importing pyudev costs several times Python's own start-up,
so boot first reads ``/sys/bus/pci/devices/*/vendor`` directly and imports pyudev only when a
vendor 0x10de function exists. Under umockdev these reads see the mocked ``/sys`` as pyudev does.
Standard library only.
"""

from __future__ import annotations

import os

from podvm_gpu.model import classify

PCI_DEVICES = "/sys/bus/pci/devices"


def read_attribute(path: str) -> str:
    """A sysfs attribute's text without the trailing newline; ``""`` when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def scan_nvidia(sys_pci: str = PCI_DEVICES) -> tuple[int, list[str]]:
    """Count the PCI functions and list the addresses whose vendor is NVIDIA.

    Args:
        sys_pci: the sysfs PCI device folder (the real ``/sys``, never under ``--root``:
            PCI devices are the machine's, contract section 1).

    Returns:
        ``(functions scanned, [PCI addresses with vendor 0x10de])``; ``(0, [])`` when the folder
        is missing (a container, or a kernel without PCI).
    """
    try:
        names = os.listdir(sys_pci)
    except OSError:
        return 0, []
    nvidia = [n for n in names if read_attribute(f"{sys_pci}/{n}/vendor").lower() == "0x10de"]
    return len(names), sorted(nvidia)


def nvidia_gpus(addresses: list[str], sys_pci: str = PCI_DEVICES) -> list[str]:
    """The addresses among ``addresses`` (NVIDIA functions, from :func:`scan_nvidia`) whose class
    makes them GPUs (:func:`podvm_gpu.model.classify`; an NVSwitch or an audio function is not)."""
    return [a for a in addresses
            if classify(read_attribute(f"{sys_pci}/{a}/vendor"),
                        read_attribute(f"{sys_pci}/{a}/class")) == "gpu"]
