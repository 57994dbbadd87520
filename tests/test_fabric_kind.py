"""The fabric kind from PCI (podvm_gpu/steps/fabric/fabric_kind.py) and its sysfs readers
(podvm_gpu/host/infiniband.py), on plain folders shaped as sysfs."""

import os

import pytest

from podvm_gpu.host import infiniband
from podvm_gpu.steps.fabric import fabric_kind


def keyword(name: str, value: bytes) -> bytes:
    return name.encode() + bytes([len(value)]) + value


def vpd(ident: bytes, *keywords: bytes) -> bytes:
    ro = b"".join(keywords) + keyword("RV", b"\x00")
    return (b"\x82" + len(ident).to_bytes(2, "little") + ident + b"\x90"
            + len(ro).to_bytes(2, "little") + ro + b"\x78")


MGMT = vpd(b"ConnectX-7 NVLink", keyword("PN", b"MCX750500B"), keyword("V3", b"SW_MNG"))


@pytest.mark.parametrize("data, state", [
    (MGMT, "sw_mng"),
    (vpd(b"ConnectX-7", keyword("PN", b"MCX755106AS")), "plain"),
    # the marker in the identifier string is not a keyword's value
    (vpd(b"SW_MNG bridge", keyword("PN", b"X")), "plain"),
    (b"\xff" * 64, "malformed"),
    (b"", "malformed"),
    (MGMT[:5], "malformed"),
    (b"\x90\x04\x00PN\x09AB\x78", "malformed"),  # a keyword longer than its resource
])
def test_vpd_states(data, state):
    assert infiniband.parse_vpd(data)[0] == state


def make_pci(tmp_path, functions: dict) -> str:
    pci = tmp_path / "pci"
    for address, (vendor, data) in functions.items():
        folder = pci / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        if data is not None:
            (folder / "vpd").write_bytes(data)
    return str(pci)


def test_kinds_from_pci(tmp_path):
    pci = make_pci(tmp_path, {"0000:e1:00.0": ("0x15b3", MGMT),
                              "0000:0c:00.0": ("0x15b3", b"\xff\xff"),
                              "0000:0c:00.2": ("0x15b3", None),
                              "0000:18:00.0": ("0x10de", None)})
    found = fabric_kind.detect([], sys_pci=pci)
    assert found.kind == fabric_kind.NVLINK5 and found.port_addresses == ["0000:e1:00.0"]
    assert "0000:0c:00.0 (malformed VPD" in found.why() and "no vpd file" in found.why()
    assert fabric_kind.detect(["0000:05:00.0"], sys_pci=pci).kind == fabric_kind.MIXED
    plain = make_pci(tmp_path / "b", {"0000:0c:00.0": ("0x15b3", None)})
    assert fabric_kind.detect([], sys_pci=plain).kind == fabric_kind.NONE
    assert fabric_kind.detect(["0000:05:00.0"], sys_pci=plain).kind == fabric_kind.NVSWITCH


def test_a_hung_vpd_read_is_bounded(tmp_path):
    pci = make_pci(tmp_path, {"0000:e1:00.0": ("0x15b3", None)})
    os.mkfifo(os.path.join(pci, "0000:e1:00.0", "vpd"))  # open() blocks: no writer
    found = infiniband.read_vpds(["0000:e1:00.0"], 0.2, pci)
    assert found[0].state == "unreadable" and "0.2 s" in found[0].detail


def test_port_guid_and_sm_bit(tmp_path):
    dev = infiniband.IbDevice("mlx5_2", "0000:e1:00.0", 0x2651E848,
                              "fe80:0000:0000:0000:a088:c203:0054:3a1e")
    assert dev.sm_enabled and dev.port_guid == "0xa088c20300543a1e"
    assert not infiniband.IbDevice("x", "", 0x400, "").sm_enabled
    assert infiniband.IbDevice("x", "", None, "fe80::1").port_guid is None


def test_ib_devices_take_the_pci_parent_from_the_class_link(tmp_path):
    dev = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:e1:00.0/infiniband/mlx5_2"
    (dev / "ports/1/gids").mkdir(parents=True)
    (dev / "ports/1/cap_mask").write_text("0x2651e848\n")
    (dev / "ports/1/gids/0").write_text("fe80:0000:0000:0000:a088:c203:0054:3a1e\n")
    ib_class = tmp_path / "class/infiniband"
    ib_class.mkdir(parents=True)
    (ib_class / "mlx5_2").symlink_to(os.path.relpath(dev, ib_class))
    [found] = infiniband.ib_devices(str(ib_class))
    assert (found.name, found.pci_address, found.port_guid) == \
        ("mlx5_2", "0000:e1:00.0", "0xa088c20300543a1e")


def test_fm_keys_replace_and_append():
    text = "# FABRIC_MODE=1\nFABRIC_MODE=1\nFABRIC_MODE_RESTART=0\n"
    out = fabric_kind.set_keys(text, fabric_kind.fm_keys(fabric_kind.NVLINK5))
    assert out.splitlines() == ["# FABRIC_MODE=1", "FABRIC_MODE=0", "FABRIC_MODE_RESTART=0",
                                "PARTITION_RAIL_POLICY=symmetric"]
    assert "PARTITION_RAIL_POLICY=greedy" in fabric_kind.set_keys("", fabric_kind.fm_keys(
        fabric_kind.NVSWITCH))
