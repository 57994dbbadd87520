"""Human names and architectures for NVIDIA data-center PCI device ids.

Source: the PCI ID Repository (pci-ids.ucw.cz, vendor 10de) and NVIDIA's driver README
"Appendix A. Supported NVIDIA GPU Products"; short names as the cloud providers label their
instances. Anything not listed falls back to the udev hardware database (``ID_MODEL_FROM_DATABASE``,
present on real VMs), then to ``10de:<device id>``.

The architecture of a device id is the section of :data:`SECTIONS` it is listed under
(:data:`ARCHITECTURES`); an id not listed has none (:func:`architecture` returns ``None``) and each
caller says what an unknown architecture means for it (a rate takes the slowest known, a
confidential multi-GPU rule fails closed).
"""

from __future__ import annotations

#: architecture -> {device id: name}, each section as the PCI ID Repository lists it.
SECTIONS: dict[str, dict[str, str]] = {
    "Turing": {
        "1eb8": "T4",
        "1eb9": "T4",
    },
    "Volta": {
        "1db1": "V100 SXM2 16GB",
        "1db4": "V100 PCIe 16GB",
        "1db5": "V100 SXM2 32GB",
        "1db6": "V100 PCIe 32GB",
        "1df6": "V100S PCIe 32GB",
    },
    "Pascal": {
        "1b38": "P40",
        "15f8": "P100 PCIe 16GB",
    },
    "Ampere": {
        "20b0": "A100 SXM4 40GB",
        "20b2": "A100 SXM4 80GB",
        "20b5": "A100 PCIe 80GB",
        "20b7": "A30",
        "20f1": "A100 PCIe 40GB",
        "20f3": "A800 SXM4 80GB",
        "2235": "A40",
        "2236": "A10",
        "2237": "A10G",
        "25b6": "A16",
        "20b8": "A100X",
    },
    "Ada Lovelace": {
        "27b8": "L4",
        "26b5": "L40",
        "26b9": "L40S",
        "26ba": "L20",
    },
    "Hopper": {
        "2330": "H100 SXM5 80GB",
        "2331": "H100 PCIe",
        "2321": "H100 NVL",
        "2335": "H200",
        "233a": "H800 NVL",
        "233b": "H200 NVL",
        "2339": "H100 SXM5 94GB",
        "2342": "GH200",
    },
    "Blackwell": {
        "2901": "B200",
        "2941": "GB200",
        "2bb5": "RTX PRO 6000 Blackwell Server Edition",
        "3182": "B300",
    },
    "NVSwitch": {
        "1af1": "NVSwitch (A100 generation)",
        "22a3": "NVSwitch (H100 generation)",
    },
}

#: device id (4 lower-case hex digits) -> a short human name.
NAMES: dict[str, str] = {did: name for section in SECTIONS.values() for did, name in section.items()}

#: device id -> architecture (the section it is listed under).
ARCHITECTURES: dict[str, str] = {did: arch for arch, section in SECTIONS.items() for did in section}

#: The GPU architectures, oldest first (NVSwitches are listed under ``NVSwitch``).
ARCHITECTURE_ORDER: tuple[str, ...] = (
    "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell",
)


def device_name(device_id: str, database_name: str | None = None) -> str:
    """A human name for an NVIDIA device id.

    Args:
        device_id: 4 hex digits, any case, with or without ``0x``.
        database_name: the udev hardware database's model name, if any.
    """
    did = device_id.lower().removeprefix("0x")
    return NAMES.get(did) or (database_name or "").strip() or f"10de:{did}"


def architecture(device_id: str) -> str | None:
    """The architecture of an NVIDIA device id (``"Hopper"``, ``"Blackwell"``, ``"NVSwitch"``, ...).

    Args:
        device_id: 4 hex digits, any case, with or without ``0x``.

    Returns:
        A name of :data:`ARCHITECTURE_ORDER` (or ``"NVSwitch"``), or ``None`` for an id this table
        does not list: the caller decides what an unknown architecture means (never a guess here).
    """
    return ARCHITECTURES.get(device_id.lower().removeprefix("0x"))
