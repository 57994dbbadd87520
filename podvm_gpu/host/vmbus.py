"""Hyper-V VMBus channels that announce a PCI device: how boot knows a GPU is still coming.

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

from podvm_gpu.host.sysfs import PCI_DEVICES, read_attribute

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
