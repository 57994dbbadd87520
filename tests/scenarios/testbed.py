"""The umockdev side of a scenario world: device records, devices added to a live testbed, uevents.

``umockdev-run -d <file>`` builds a testbed (a directory the preload maps ``/sys`` onto) from
umockdev-record text. This module writes that text for a case's ``vmbus`` and ``pci`` entries,
and adds a ``pci_late`` device to a testbed **while the product runs** the way umockdev itself
adds a device (``umockdev_testbed_add_from_string``): the device folder with its attributes, its
``uevent`` file (the ``E:`` lines), its ``subsystem`` and ``driver`` links, and the
``sys/bus/<subsystem>/devices/<name>`` link last. Then it sends the ``add`` uevent to every
libudev monitor the product has open, as ``umockdev_testbed_uevent`` does (umockdev's
``src/uevent_sender.c``): the preload turns a monitor's netlink socket into a unix datagram socket
bound at ``$UMOCKDEV_DIR/event<fd>``, and a message there is libudev's wire format, a
``libudev`` header (magic 0xfeedcafe, the MurmurHash2 of the subsystem for the monitor's socket
filter) and the ``KEY=value`` properties, NUL-separated.

Standard library only: fake tools import it (``effects._bind_live`` needs the device paths).
"""

from __future__ import annotations

import glob
import os
import struct

SYS_PCI_PARENT = "/devices/pci0000:00"  # where a PCI device without a VMBus channel sits
# Where hv_vmbus puts its devices on a generation 2 Hyper-V guest (EFFECTS.md); on generation 1
# it is .../PNP0A03:00/device:07/VMBUS:01, which the product must not depend on either.
VMBUS_PARENT = "/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00"
UDEV_MONITOR_MAGIC = 0xFEEDCAFE
_HEADER = struct.Struct("=8sIIIIIIII")  # struct udev_monitor_netlink_header, 40 bytes


def vmbus_devpath(instance: str) -> str:
    """``/devices/.../VMBUS:00/<instance>``."""
    return f"{VMBUS_PARENT}/{instance}"


def pci_devpath(dev: dict) -> str:
    """A ``pci`` or ``pci_late`` entry's device path: below its VMBus channel
    (``.../<instance>/pci<domain>:<bus>/<address>``, the root bus hv_pci creates, named as the
    kernel names every root bus) when it names one, else below ``pci0000:00``."""
    address = dev["address"]
    if not dev.get("vmbus"):
        return f"{SYS_PCI_PARENT}/{address}"
    domain, bus = address.split(":")[:2]
    return f"{vmbus_devpath(dev['vmbus'])}/pci{domain}:{bus}/{address}"


def up_to_sys(devpath: str) -> str:
    """The relative way from a device's folder back to ``/sys`` (``../../../`` for
    ``/devices/pci0000:00/<address>``): the start of its ``subsystem`` and ``driver`` links."""
    return "../" * len(devpath.strip("/").split("/"))


def vmbus_record(channel: dict) -> str:
    """A case's ``vmbus`` entry as a umockdev record: ``SUBSYSTEM=vmbus``, ``class_id`` and
    ``device_id`` as hv_vmbus shows them (``{<guid>}`` and a newline), the driver when bound."""
    devpath = vmbus_devpath(channel["instance"])
    guid = str(channel.get("device_id") or channel["instance"]).strip("{}")
    lines = [f"P: {devpath}", "E: SUBSYSTEM=vmbus"]
    if channel.get("driver"):
        lines.append(f"E: DRIVER={channel['driver']}")
    lines += [f"A: class_id={{{str(channel['class_id']).strip('{}')}}}\\n",
              f"A: device_id={{{guid}}}\\n"]
    if channel.get("driver"):
        lines.append(f"L: driver={up_to_sys(devpath)}bus/vmbus/drivers/{channel['driver']}")
    return "\n".join(lines) + "\n"


def pci_record(dev: dict, driver: str | None) -> str:
    """A ``pci``/``pci_late`` entry as a umockdev record, bound to ``driver`` (None: unbound)."""
    address = dev["address"]
    devpath = pci_devpath(dev)
    vendor, device, cls = (int(str(dev[key]), 16) for key in ("vendor", "device", "class"))
    lines = [f"P: {devpath}", "E: SUBSYSTEM=pci"]
    if driver:
        lines.append(f"E: DRIVER={driver}")
    lines += [f"E: PCI_CLASS={cls:X}", f"E: PCI_ID={vendor:04X}:{device:04X}"]
    subsystem = [dev.get("subsystem_vendor"), dev.get("subsystem_device")]
    if all(subsystem):
        sub_vendor, sub_device = (int(str(value), 16) for value in subsystem)
        lines.append(f"E: PCI_SUBSYS_ID={sub_vendor:04X}:{sub_device:04X}")
    lines += [f"E: PCI_SLOT_NAME={address}",
              f"A: vendor=0x{vendor:04x}\\n", f"A: device=0x{device:04x}\\n",
              f"A: class=0x{cls:06x}\\n"]
    if all(subsystem):
        lines += [f"A: subsystem_vendor=0x{sub_vendor:04x}\\n",
                  f"A: subsystem_device=0x{sub_device:04x}\\n"]
    if dev.get("vpd") is not None:  # binary: umockdev-record's H: line, hex bytes
        lines.append(f"H: vpd={str(dev['vpd']).replace(' ', '').upper()}")
    if driver:
        lines.append(f"L: driver={up_to_sys(devpath)}bus/pci/drivers/{driver}")
    return "\n".join(lines) + "\n"


def ib_record(ib: dict, pci_dev: dict) -> str:
    """A case's ``infiniband`` entry as a umockdev record below its PCI function:
    ``<pci devpath>/infiniband/<name>`` (umockdev adds ``/sys/class/infiniband/<name>``), port 1's
    ``cap_mask`` and ``gids/0`` as mlx5_ib shows them (text and a newline)."""
    devpath = f"{pci_devpath(pci_dev)}/infiniband/{ib['name']}"
    return "\n".join([f"P: {devpath}", "E: SUBSYSTEM=infiniband", f"E: NAME={ib['name']}",
                      f"A: ports/1/cap_mask={ib['cap_mask']}\\n",
                      f"A: ports/1/gids/0={ib['gid0']}\\n"]) + "\n"


def parse_record(record: str) -> tuple[str, list[str], dict[str, bytes], dict[str, str]]:
    """One umockdev record: ``(devpath, ["KEY=value", ...], {attribute: bytes}, {link: target})``.
    Only what :func:`pci_record` and :func:`vmbus_record` write (``P E A L`` lines; ``\\n`` in an
    attribute is a newline)."""
    devpath, properties, attributes, links = "", [], {}, {}
    for line in record.splitlines():
        kind, _, rest = line.partition(": ")
        if kind == "P":
            devpath = rest
        elif kind == "E":
            properties.append(rest)
        elif kind == "A":
            name, _, value = rest.partition("=")
            attributes[name] = value.replace("\\n", "\n").encode()
        elif kind == "H":
            name, _, value = rest.partition("=")
            attributes[name] = bytes.fromhex(value)
        elif kind == "L":
            name, _, target = rest.partition("=")
            links[name] = target
    return devpath, properties, attributes, links


def add_live_device(testbed: str, record: str) -> str:
    """Add a device to the live testbed ``testbed`` (a ``$UMOCKDEV_DIR``) as umockdev does, the
    bus link last, so a product that sees the link sees a complete device; return its devpath.

    Raises:
        OSError: the testbed is gone (the run ended) or the device is there already.
    """
    devpath, properties, attributes, links = parse_record(record)
    subsystem = next(p.split("=", 1)[1] for p in properties if p.startswith("SUBSYSTEM="))
    folder = os.path.join(testbed, "sys" + devpath)
    os.makedirs(folder)
    for name, value in attributes.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(value)
    with open(os.path.join(folder, "uevent"), "w") as f:
        f.write("".join(p + "\n" for p in properties))
    os.symlink(f"{up_to_sys(devpath)}bus/{subsystem}", os.path.join(folder, "subsystem"))
    for name, target in links.items():
        os.symlink(target, os.path.join(folder, name))
    bus = os.path.join(testbed, "sys", "bus", subsystem, "devices")
    os.makedirs(bus, exist_ok=True)  # with no device of the subsystem yet it does not exist
    os.symlink(f"../../..{devpath}", os.path.join(bus, os.path.basename(devpath)))
    return devpath


def murmur_hash2(text: str) -> int:
    """MurmurHash2 (32-bit, seed = length) of ``text``, as libudev hashes a subsystem name for
    its monitors' socket filters (systemd's ``string_hash32``; umockdev uses the same)."""
    m, data = 0x5BD1E995, text.encode()
    h = len(data)
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little") * m & 0xFFFFFFFF
        k = (k ^ k >> 24) * m & 0xFFFFFFFF
        h = (h * m & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    for shift, byte in enumerate(tail):
        h ^= byte << (8 * shift)
    if tail:
        h = h * m & 0xFFFFFFFF
    h = (h ^ h >> 13) * m & 0xFFFFFFFF
    return h ^ h >> 15


def uevent_message(devpath: str, action: str, properties: list[str], seqnum: int) -> bytes:
    """A uevent in libudev's monitor format: ``ACTION``, ``DEVPATH``, ``SUBSYSTEM``, ``SEQNUM``,
    then the device's own properties (its ``uevent`` file), after the 40-byte header."""
    subsystem = next(p.split("=", 1)[1] for p in properties if p.startswith("SUBSYSTEM="))
    fields = [f"ACTION={action}", f"DEVPATH={devpath}", f"SUBSYSTEM={subsystem}",
              f"SEQNUM={seqnum}"] + [p for p in properties if not p.startswith("SUBSYSTEM=")]
    body = "".join(field + "\0" for field in fields).encode()
    # magic and hashes in network order, the sizes in host order (libudev's own header)
    import socket  # here, not at the top: every fake tool call imports this module (13 ms)

    header = _HEADER.pack(b"libudev\0", socket.htonl(UDEV_MONITOR_MAGIC), _HEADER.size,
                          _HEADER.size, len(body), socket.htonl(murmur_hash2(subsystem)), 0, 0, 0)
    return header + body


def send_uevent(testbed: str, message: bytes) -> int:
    """Send ``message`` to every libudev monitor open in the testbed (``event<fd>`` sockets);
    return how many got it. A socket whose monitor was closed refuses it, and is skipped."""
    import socket

    sent = 0
    for path in sorted(glob.glob(os.path.join(testbed, "event[0-9]*"))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(path)
                sock.send(message)
            except (ConnectionRefusedError, FileNotFoundError):
                continue
            sent += 1
    return sent


def live_testbeds(tmpdir: str) -> list[str]:
    """The testbeds of the umockdev-run processes started with ``TMPDIR=tmpdir`` (umockdev makes
    each with ``g_dir_make_tmp("umockdev.XXXXXX")``), that still exist."""
    return sorted(path for path in glob.glob(os.path.join(tmpdir, "umockdev.*"))
                  if os.path.isdir(os.path.join(path, "sys")))
