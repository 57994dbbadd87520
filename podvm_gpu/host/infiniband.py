"""What the NVLink 5 path reads from sysfs and /dev: the PCI VPD of ConnectX functions, the
InfiniBand devices of ``/sys/class/infiniband`` and the ``/dev/infiniband`` nodes.

On HGX B200/B300 boards the NVSwitches are not PCI functions of the VM: they are managed through
ConnectX-7 bridge functions (vendor ``0x15b3``) whose PCI VPD carries the ``SW_MNG`` marker
(NVIDIA/nvrc ``src/mode.rs``: "NVL5 CX7 bridges expose 2 LPF (SW_MNG) + 2 FC PF per baseboard";
it reads ``/sys/bus/pci/devices/<bdf>/vpd`` directly, so no IB driver is needed).

VPD (PCI Local Bus Specification 3.0, section 6.4 and appendix I): a list of resources, each a
tag byte and its data: the large resources ``0x82`` (identifier string), ``0x90`` (VPD-R, read
only keywords) and ``0x91`` (VPD-W, read-write keywords) have a 16-bit little-endian length
after the tag; the small resource ``0x78`` ends the list (bit 7 clear: a small resource whose
length is the tag's low 3 bits). A keyword is two ASCII characters, a length byte and the value.
NVRC searches the raw bytes for ``SW_MNG``; here the marker counts only inside a keyword's
value, so an identifier string or a byte run that happens to spell it does not make a NIC a
management port. A VPD that breaks the format is reported as malformed, never raised.

The reads are bounded: at most :data:`VPD_MAX` bytes of a file (the VPD address space is 15
bits, 32 KiB), and every read of the boot runs on one worker thread joined with a time limit
(a VPD read is a config-space transaction per dword, and a device that does not answer makes
each take the kernel's timeout). Standard library only.

PCI devices and ``/sys/class/infiniband`` are the machine's (never under ``--root``: contract
section 1, as for PCI); ``/dev/infiniband`` is taken under the root like ``/dev/nvidia*``.
"""

from __future__ import annotations

import os

from podvm_gpu.host.fs import is_char_device
from podvm_gpu.host.proc import Background
from podvm_gpu.host.sysfs import PCI_DEVICES, read_attribute, scan_vendor

MELLANOX_VENDOR = "0x15b3"
IB_CLASS = "/sys/class/infiniband"
VPD_MAX = 32768
SW_MNG = b"SW_MNG"
# ports/<n>/cap_mask: PortInfo CapabilityMask; bit 10 is IsSMDisabled (InfiniBand Architecture
# Specification vol. 1, PortInfo; NVRC src/infiniband.rs IS_SM_DISABLED_MASK = 1 << 10)
IS_SM_DISABLED = 1 << 10

_TAG_ID, _TAG_R, _TAG_W, _TAG_END = 0x82, 0x90, 0x91, 0x78


class Vpd:
    """What one function's VPD says for the fabric.

    Attributes:
        address: the PCI address.
        state: ``"sw_mng"`` (a keyword's value carries the marker), ``"plain"`` (well formed,
            no marker), ``"absent"`` (no ``vpd`` file), ``"unreadable"`` (the read failed or
            ran past the time limit), ``"malformed"`` (``detail`` says where).
        keyword: the keyword whose value carries the marker (``"V3"``), or ``""``.
        detail: one short phrase for messages.
    """

    __slots__ = ("address", "state", "keyword", "detail")

    def __init__(self, address: str, state: str, keyword: str = "", detail: str = ""):
        self.address, self.state, self.keyword, self.detail = address, state, keyword, detail

    def describe(self) -> str:
        if self.state == "sw_mng":
            return f"{self.address} (VPD keyword {self.keyword} carries SW_MNG)"
        return f"{self.address} ({self.detail or self.state})"


def parse_vpd(data: bytes) -> tuple[str, str, str]:
    """Walk VPD resources: ``(state, keyword, detail)`` with state ``sw_mng``, ``plain`` or
    ``malformed`` (see :class:`Vpd`). The walk stops at the end tag; keywords of VPD-R and VPD-W
    count; bytes after the end tag are ignored (the kernel returns the whole window)."""
    i, seen_any = 0, False
    while i < len(data):
        tag = data[i]
        if tag == _TAG_END or (tag & 0x80 == 0 and tag >> 3 == 0x0F):
            return "plain", "", "no SW_MNG keyword" if seen_any else "VPD has no resources"
        if tag & 0x80 == 0:  # another small resource: skip it
            i += 1 + (tag & 0x07)
            continue
        if i + 3 > len(data):
            return "malformed", "", f"malformed VPD: resource header cut at byte {i}"
        length = data[i + 1] | data[i + 2] << 8
        body = data[i + 3:i + 3 + length]
        if len(body) < length:
            return "malformed", "", f"malformed VPD: resource 0x{tag:02x} at byte {i} runs past the end"
        if tag not in (_TAG_ID, _TAG_R, _TAG_W):
            return "malformed", "", f"malformed VPD: unknown resource 0x{tag:02x} at byte {i}"
        seen_any = True
        if tag in (_TAG_R, _TAG_W):
            j = 0
            while j + 3 <= len(body):
                name = body[j:j + 2]
                size = body[j + 2]
                value = body[j + 3:j + 3 + size]
                if len(value) < size or not all(32 <= c < 127 for c in name):
                    return "malformed", "", f"malformed VPD: bad keyword at byte {i + 3 + j}"
                if SW_MNG in value:
                    return "sw_mng", name.decode("ascii"), ""
                j += 3 + size
        i += 3 + length
    return "malformed", "", "malformed VPD: no end tag" if seen_any else "malformed VPD: empty"


def _read_one(path: str) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(VPD_MAX)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise OSError(err.strerror or str(err)) from err


def read_vpds(addresses: list[str], limit_s: float, sys_pci: str = PCI_DEVICES) -> list[Vpd]:
    """Read and judge the VPD of ``addresses``, all reads together bounded by ``limit_s``
    seconds (one worker thread; a function not read by then is ``unreadable``, and the thread,
    a daemon, is left to its hung read).

    Args:
        addresses: PCI addresses (the Mellanox functions of :func:`mellanox_functions`).
        limit_s: the time limit of every read together.
        sys_pci: the sysfs PCI device folder (never under ``--root``).
    """
    results: dict[str, Vpd] = {}

    def work() -> None:
        for address in addresses:
            try:
                data = _read_one(f"{sys_pci}/{address}/vpd")
            except OSError as err:
                results[address] = Vpd(address, "unreadable", detail=f"VPD unreadable: {err}")
                continue
            if data is None:
                results[address] = Vpd(address, "absent", detail="no vpd file")
                continue
            state, keyword, detail = parse_vpd(data)
            results[address] = Vpd(address, state, keyword, detail)

    Background(work, "vpd-read").outcome(limit_s)
    return [results.get(a) or Vpd(a, "unreadable", detail=f"VPD not read within {limit_s:g} s")
            for a in addresses]


def mellanox_functions(sys_pci: str = PCI_DEVICES) -> list[str]:
    """The PCI addresses with vendor ``0x15b3`` (Mellanox/NVIDIA networking), sorted; ``[]``
    when there is no PCI folder. Reads one ``vendor`` file per function."""
    return scan_vendor(MELLANOX_VENDOR, sys_pci)[1]


class IbDevice:
    """One device of ``/sys/class/infiniband``, port 1 as NVRC and the FM guide read it.

    Attributes:
        name: ``mlx5_8``.
        pci_address: the PCI function it sits on (the folder above ``infiniband/`` in its sysfs
            path), or ``""`` when the path does not show one.
        cap_mask: ``ports/1/cap_mask`` as a number, or None when unreadable.
        gid0: ``ports/1/gids/0`` text (``fe80:0000:...:3a1e``), or ``""``.
    """

    __slots__ = ("name", "pci_address", "cap_mask", "gid0")

    def __init__(self, name: str, pci_address: str, cap_mask: int | None, gid0: str):
        self.name, self.pci_address, self.cap_mask, self.gid0 = name, pci_address, cap_mask, gid0

    @property
    def sm_enabled(self) -> bool:
        """IsSMDisabled (bit 10) clear; an unreadable mask counts as disabled (NVRC too)."""
        return self.cap_mask is not None and not self.cap_mask & IS_SM_DISABLED

    @property
    def port_guid(self) -> str | None:
        """The port GUID, ``0x`` and 16 hex digits: the last 64 bits of GID 0 (the interface
        id; NVRC ``extract_port_guid``), or None when GID 0 is not eight groups."""
        parts = self.gid0.strip().split(":")
        if len(parts) != 8 or not all(len(p) == 4 for p in parts):
            return None
        try:
            int("".join(parts[4:]), 16)
        except ValueError:
            return None
        return "0x" + "".join(parts[4:]).lower()


def ib_devices(ib_class: str = IB_CLASS) -> list[IbDevice]:
    """The InfiniBand devices, sorted by name; ``[]`` when the class folder is missing
    (mlx5_ib not loaded) or empty."""
    try:
        names = sorted(os.listdir(ib_class))
    except OSError:
        return []
    devices = []
    for name in names:
        try:
            target = os.readlink(f"{ib_class}/{name}")
        except OSError:
            target = ""
        parts = target.split("/")
        pci = parts[parts.index("infiniband") - 1] if "infiniband" in parts[1:] else ""
        mask_text = read_attribute(f"{ib_class}/{name}/ports/1/cap_mask")
        try:
            mask = int(mask_text, 16) if mask_text else None
        except ValueError:
            mask = None
        devices.append(IbDevice(name, pci, mask, read_attribute(f"{ib_class}/{name}/ports/1/gids/0")))
    return devices


def umad_nodes(dev_infiniband: str) -> list[str]:
    """The ``umad<N>`` character devices in ``dev_infiniband`` (a path already under the root),
    sorted; what NVLSM, an OpenSM derivative, opens to send management datagrams (ib_umad)."""
    try:
        names = os.listdir(dev_infiniband)
    except OSError:
        return []
    return sorted(name for name in names if name.startswith("umad")
                  and is_char_device(f"{dev_infiniband}/{name}"))
