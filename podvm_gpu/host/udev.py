"""PCI discovery through pyudev (contract section 3, step 1).

pyudev reads the real ``/sys`` (or the one umockdev fakes); PCI devices are never taken under
``--root``. Only NVIDIA GPUs and NVSwitches are returned; the emulated VGA, audio functions and
bridges are ignored by :func:`podvm_gpu.model.classify`.
"""

from __future__ import annotations

import pyudev

from podvm_gpu.model import PciDevice, classify
from podvm_gpu.pci_ids import device_name


def _hex(value: str | None, width: int) -> str:
    return (value or "").strip().lower().removeprefix("0x").zfill(width)


def _attr(device: pyudev.Device, name: str) -> str:
    try:
        return device.attributes.asstring(name)
    except (KeyError, UnicodeDecodeError):
        return ""


def discover(context: pyudev.Context | None = None) -> tuple[list[PciDevice], list[PciDevice]]:
    """Enumerate NVIDIA GPUs and NVSwitches on PCI.

    Args:
        context: a pyudev context (a new one by default).

    Returns:
        ``(gpus, nvswitches)``, each sorted by PCI address.
    """
    context = context or pyudev.Context()
    gpus: list[PciDevice] = []
    switches: list[PciDevice] = []
    for dev in context.list_devices(subsystem="pci"):
        vendor = _hex(_attr(dev, "vendor"), 4)
        class_code = _hex(_attr(dev, "class"), 6)
        kind = classify(vendor, class_code)
        if kind is None:
            continue
        device_id = _hex(_attr(dev, "device"), 4)
        pci = PciDevice(
            pci_address=dev.properties.get("PCI_SLOT_NAME") or dev.sys_name,
            vendor_id=vendor,
            device_id=device_id,
            class_code=class_code,
            driver=dev.driver or None,
            name=device_name(device_id, dev.properties.get("ID_MODEL_FROM_DATABASE")),
        )
        (gpus if kind == "gpu" else switches).append(pci)
    key = lambda d: d.pci_address  # noqa: E731
    return sorted(gpus, key=key), sorted(switches, key=key)
