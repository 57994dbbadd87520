"""The PCI id tables: names and architectures from one table (podvm_gpu/pci_ids.py)."""

from __future__ import annotations

import pytest

from podvm_gpu import pci_ids


@pytest.mark.parametrize(("device_id", "arch"), [
    ("2335", "Hopper"), ("0x2330", "Hopper"), ("2901", "Blackwell"),
    ("3182", "Blackwell"),  # HGX B300: missing before issue 46
    ("2BB5", "Blackwell"), ("20b2", "Ampere"), ("22a3", "NVSwitch"),
])
def test_architecture_of_listed_ids(device_id: str, arch: str) -> None:
    assert pci_ids.architecture(device_id) == arch


def test_an_unlisted_id_has_no_architecture_never_a_guess() -> None:
    assert pci_ids.architecture("ffff") is None
    assert pci_ids.device_name("ffff") == "10de:ffff"


def test_every_listed_id_has_a_name_and_an_architecture_and_appears_once() -> None:
    ids = [did for section in pci_ids.SECTIONS.values() for did in section]
    assert len(ids) == len(set(ids))
    assert set(pci_ids.NAMES) == set(pci_ids.ARCHITECTURES) == set(ids)
    gpu_archs = set(pci_ids.SECTIONS) - {"NVSwitch"}
    assert gpu_archs <= set(pci_ids.ARCHITECTURE_ORDER)
