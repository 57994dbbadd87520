"""A plain sysfs pre-scan for NVIDIA PCI functions, used by the CPU fast path.

Contract section 3 step 1, speed note: importing pyudev costs several times Python's own start-up,
so boot first reads ``/sys/bus/pci/devices/*/vendor`` directly and imports pyudev only when a
vendor 0x10de function exists. Under umockdev these reads see the mocked ``/sys`` as pyudev does.
Standard library only.
"""

from __future__ import annotations

import os

PCI_DEVICES = "/sys/bus/pci/devices"


def _read(path: str) -> str:
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
    nvidia = [n for n in names if _read(f"{sys_pci}/{n}/vendor").lower() == "0x10de"]
    return len(names), sorted(nvidia)
