"""PCI discovery through pyudev (contract section 3, step 1), and the wait for PCI devices that
appear late (:func:`wait_for_pci`).

pyudev reads the real ``/sys`` (or the one umockdev fakes); PCI devices are never taken under
``--root``. Only NVIDIA GPUs and NVSwitches are returned; the emulated VGA, audio functions and
bridges are ignored by :func:`podvm_gpu.model.classify`.
"""

from __future__ import annotations

import time

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


POLL_S = 0.25  # the re-check interval when no udev monitor can be had


def wait_for_pci(ready, timeout_s: float, recheck_s: float = 1.0) -> tuple[bool, str]:
    """Wait until ``ready()`` is true, at most ``timeout_s`` seconds, woken by PCI uevents.

    A pyudev monitor on subsystem ``pci`` (udevd's events, which come after udev has processed
    the device) wakes the wait as soon as a PCI device is added; ``ready`` is asked again on
    every event and at least every ``recheck_s`` seconds anyway, so a missed event (udevd not
    running yet) costs at most that. Where no monitor can be had (no netlink socket allowed,
    no udev), ``ready`` is polled every :data:`POLL_S` seconds instead.

    Args:
        ready: a cheap check of sysfs, e.g. "every pass-through channel has its PCI device".
        timeout_s: the longest wait, seconds.
        recheck_s: the longest sleep between two checks while a monitor is open.

    Returns:
        ``(ready() at the end, how the wait watched)``, the second for messages:
        ``"udev events watched"`` or ``"sysfs polled every 0.25 s: no udev monitor (<error>)"``.
    """
    deadline = time.monotonic() + timeout_s
    try:
        monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        monitor.filter_by("pci")
        monitor.start()
        how = "udev events watched"
    except OSError as err:
        monitor, how = None, f"sysfs polled every {POLL_S:g} s: no udev monitor ({err})"
    while True:
        if ready():  # asked once after the monitor started: nothing added before is missed
            return True, how
        left = deadline - time.monotonic()
        if left <= 0:
            return False, how
        if monitor is None:
            time.sleep(min(POLL_S, left))
        else:
            monitor.poll(timeout=min(recheck_s, left))
