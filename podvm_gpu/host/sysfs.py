"""PCI discovery from sysfs (contract section 3, step 1): the CPU fast path's pre-scan, the GPUs
and NVSwitches of boot and check, and the checks of the wait for GPUs that appear late.

The contract says "with pyudev". The agent reads the same files libudev reads for a PCI device
(``vendor``, ``device``, ``class``, the ``driver`` link under ``/sys/bus/pci/devices/<address>``,
and udevd's database entry ``/run/udev/data/+pci:<address>`` for the hardware database's model
name) without it: ``pyudev.Context()`` runs ``/sbin/ldconfig -p`` to find libudev (ctypes.util)
and its import pulls ctypes, shutil, tempfile and more, together about 25 ms of every GPU boot
and check on this machine (bench/run.py), for facts that are these files.
tests/test_udev.py holds the result equal to pyudev's enumeration on every device tree. pyudev
stays where it is the right tool: the udev monitor of the late-GPU wait (host/udev.py). Under
umockdev these reads see the mocked ``/sys`` as libudev does. Standard library only.
"""

from __future__ import annotations

import os

from podvm_gpu.model import PciDevice, classify

PCI_DEVICES = "/sys/bus/pci/devices"
UDEV_DATA = "/run/udev/data"  # udevd's database: one file per device, "E:KEY=value" lines


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


def _hex(value: str, width: int) -> str:
    return value.strip().lower().removeprefix("0x").zfill(width)


def udev_property(address: str, key: str, udev_data: str = UDEV_DATA) -> str | None:
    """A property udevd stored for the PCI device (``E:<key>=...`` in ``+pci:<address>``), or
    None when udevd has not processed it (not running yet, or no such property)."""
    try:
        with open(f"{udev_data}/+pci:{address}", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(f"E:{key}="):
                    return line[len(key) + 3:].rstrip("\n")
    except OSError:
        pass
    return None


def discover(nvidia: list[str] | None = None, sys_pci: str = PCI_DEVICES,
             udev_data: str = UDEV_DATA) -> tuple[list[PciDevice], list[PciDevice]]:
    """The NVIDIA GPUs and NVSwitches on PCI (:func:`podvm_gpu.model.classify`).

    Args:
        nvidia: the NVIDIA functions' addresses, from :func:`scan_nvidia` (scanned again when
            None).
        sys_pci: the sysfs PCI device folder (never under ``--root``).
        udev_data: udevd's database folder, for ``ID_MODEL_FROM_DATABASE``.

    Returns:
        ``(gpus, nvswitches)``, each sorted by PCI address; a function that vanished while it was
        read (its files unreadable) is left out.
    """
    from podvm_gpu.pci_ids import device_name

    if nvidia is None:
        nvidia = scan_nvidia(sys_pci)[1]
    gpus: list[PciDevice] = []
    switches: list[PciDevice] = []
    for address in sorted(nvidia):
        base = f"{sys_pci}/{address}"
        vendor = _hex(read_attribute(f"{base}/vendor"), 4)
        class_code = _hex(read_attribute(f"{base}/class"), 6)
        kind = classify(vendor, class_code)
        if kind is None:
            continue
        device_id = _hex(read_attribute(f"{base}/device"), 4)
        try:
            driver = os.path.basename(os.readlink(f"{base}/driver"))
        except OSError:
            driver = None  # no driver bound
        pci = PciDevice(pci_address=address, vendor_id=vendor, device_id=device_id,
                        class_code=class_code, driver=driver,
                        name=device_name(device_id, udev_property(address, "ID_MODEL_FROM_DATABASE",
                                                                  udev_data)))
        (gpus if kind == "gpu" else switches).append(pci)
    return gpus, switches
