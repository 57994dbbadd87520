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

Hyper-V VMBus channels that announce a PCI device (below): how boot knows a GPU is still coming.

On Hyper-V (Azure) a passed-through GPU reaches the guest's PCI through a VMBus channel of class
"PCI Express pass-through" (``HV_PCIE_GUID`` in include/linux/hyperv.h), served by the ``hv_pci``
driver (drivers/pci/controller/pci-hyperv.c). The channel exists as soon as the host offers it;
the PCI function appears only after hv_pci has probed the channel and the host has reported the
bus's devices, and the kernel puts it below the channel in sysfs:
``/sys/devices/.../VMBUS:00/<instance>/pci<domain>:<bus>/<address>``. So a pass-through channel
with no PCI function below it is a device on its way (or one the host never delivered).

hv_pci asks for the PCI domain ``dev_instance.b[5] << 8 | b[4]``, which is the second group of
the instance GUID as sysfs prints it (``47505500-0001-...`` asks for domain 0001), but takes
another free number when that one is in use (and newer kernels never 0). So a function is
matched to its channel by its sysfs path, never by its domain; the domain is only named in
messages, as "asked for".

Standard library only, cheap: the CPU fast path reads ``/sys/bus/vmbus/devices/*/class_id``
(one failed ``listdir`` on a VM that is not a Hyper-V guest).
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
    return scan_vendor("0x10de", sys_pci)


def scan_vendor(vendor: str, sys_pci: str = PCI_DEVICES) -> tuple[int, list[str]]:
    """:func:`scan_nvidia` for the functions of ``vendor`` (``0x10de``, lowercase, as sysfs
    prints a ``vendor`` file): ``(functions scanned, [their addresses, sorted])``; ``(0, [])``
    when the folder is missing. Reads one ``vendor`` file per function."""
    try:
        names = os.listdir(sys_pci)
    except OSError:
        return 0, []
    return len(names), sorted(n for n in names
                              if read_attribute(f"{sys_pci}/{n}/vendor").lower() == vendor)


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


# --- Hyper-V VMBus pass-through channels ---------------------------------------------------

VMBUS_DEVICES = "/sys/bus/vmbus/devices"
HV_PCIE_CLASS = "44c4f61d-4444-4400-9d52-802e27ede19f"  # HV_PCIE_GUID, include/linux/hyperv.h
HV_PCI_DRIVER = "hv_pci"  # the name drivers/pci/controller/pci-hyperv.c registers


class PciChannel:
    """One VMBus PCI pass-through channel.

    Attributes:
        instance: the instance GUID, lowercase, as the directory under
            ``/sys/bus/vmbus/devices`` is named (``47505500-0001-0000-3130-444532333331``).
        driver: the bound VMBus driver's name (``hv_pci``), or None when none is bound.
    """

    __slots__ = ("instance", "driver")

    def __init__(self, instance: str, driver: str | None):
        self.instance = instance
        self.driver = driver

    @property
    def domain(self) -> str | None:
        """The PCI domain hv_pci asks for, 4 hex digits (``0001``), or None for a name that is
        not a GUID."""
        parts = self.instance.split("-")
        return parts[1] if len(parts) == 5 and len(parts[1]) == 4 else None

    def describe(self) -> str:
        """``VMBus PCI pass-through channel <instance> (hv_pci, PCI domain 0001 asked for)``."""
        driver = self.driver or "no driver bound"
        domain = f", PCI domain {self.domain} asked for" if self.domain else ""
        return f"VMBus PCI pass-through channel {self.instance} ({driver}{domain})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PciChannel) and (self.instance, self.driver) == (
            other.instance, other.driver)

    def __hash__(self) -> int:
        return hash(self.instance)

    def __repr__(self) -> str:
        return f"PciChannel({self.instance}, {self.driver})"


def pci_channels(sys_vmbus: str = VMBUS_DEVICES) -> list[PciChannel]:
    """The VMBus channels of class PCI Express pass-through, sorted by instance.

    Args:
        sys_vmbus: the sysfs VMBus device folder (the real ``/sys``, never under ``--root``).

    Returns:
        The channels; ``[]`` when the folder is missing (not a Hyper-V guest, or no hv_vmbus).
        hv_vmbus prints ``class_id`` as ``{<guid>}`` and a newline.
    """
    try:
        names = os.listdir(sys_vmbus)
    except OSError:
        return []
    channels = []
    for name in sorted(names):
        if read_attribute(f"{sys_vmbus}/{name}/class_id").strip("{}").lower() != HV_PCIE_CLASS:
            continue
        try:
            driver = os.path.basename(os.readlink(f"{sys_vmbus}/{name}/driver"))
        except OSError:
            driver = None
        channels.append(PciChannel(name.lower(), driver))
    return channels


def pci_links(sys_pci: str = PCI_DEVICES) -> dict[str, str]:
    """``/sys/bus/pci/devices``: address -> the link's text, lowercase
    (``../../../devices/.../<instance>/pci0001:00/0001:00:00.0``); ``{}`` when the folder is
    missing. The links are read, not followed. The bus link is the kernel's last step of adding
    a PCI device to sysfs before its uevent, so a function listed here is one udev can see."""
    try:
        names = os.listdir(sys_pci)
    except OSError:
        return {}
    links = {}
    for name in names:
        try:
            links[name] = os.readlink(f"{sys_pci}/{name}").lower()
        except OSError:
            continue
    return links


def functions_below(channel: PciChannel, links: dict[str, str]) -> list[str]:
    """The PCI addresses among ``links`` (see :func:`pci_links`) whose device lies below
    ``channel``: the instance is one of the link's folders."""
    marker = f"/{channel.instance}/"
    return sorted(name for name, link in links.items() if marker in link)


def channels_without_pci(sys_vmbus: str = VMBUS_DEVICES,
                         sys_pci: str = PCI_DEVICES) -> list[PciChannel]:
    """The PCI pass-through channels that have no PCI function yet: devices on their way.
    Reads nothing under ``sys_pci`` when there is no such channel (the fast path)."""
    channels = pci_channels(sys_vmbus)
    if not channels:
        return []
    links = pci_links(sys_pci)
    return [c for c in channels if not functions_below(c, links)]
