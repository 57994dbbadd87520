"""Rack-scale NVLink (issue 28): a GB200 compute tray is fabric kind ``nvlink-rack`` in status,
check and metrics; no fabric manager is started; the clique and cluster UUID come from full
``nvidia-smi -q`` where it prints them (550+). The rule that tells it from an H100 VM behind
shared NVSwitches (same PCI shape) is the GPUs' device id."""

from __future__ import annotations

from pathlib import Path

from scenarios.world import World, load_case

from podvm_gpu.gpufacts import smi
from podvm_gpu.model import PciDevice
from podvm_gpu.steps.fabric import fabric_kind

CASES = Path(__file__).resolve().parent / "scenarios/cases"
# nvidia-smi-real.md, "-q -d sections": the Fabric block as 550.163.01 prints it (healthy), as
# 535.261.03 prints it (no CliqueId, no ClusterUUID), and 555.58.02's "In Progress" one
Q_550 = """GPU 00000000:18:00.0
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf
        Health
            Bandwidth                     : Full
"""
Q_535 = """GPU 00000000:18:00.0
    Fabric
        State                             : Completed
        Status                            : Success
"""
Q_NA = """GPU 00000000:18:00.0
    Fabric
        State                             : In Progress
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
"""


def gpu(device_id: str, address: str = "0000:00:05.0") -> PciDevice:
    return PciDevice(address, "10de", device_id, "030200", "nvidia", "x")


def test_the_gpus_device_id_tells_a_gb200_tray_from_an_h100_behind_shared_nvswitches(tmp_path):
    no_pci = str(tmp_path)  # no ConnectX function: no management port
    assert fabric_kind.detect([], no_pci, gpus=[gpu("2941")]).kind == fabric_kind.RACK
    assert fabric_kind.detect([], no_pci, gpus=[gpu("2330")]).kind == fabric_kind.NONE
    # NVSwitch functions in the VM win: that is an HGX board, whatever the GPUs
    assert fabric_kind.detect(["0000:90:00.0"], no_pci, gpus=[gpu("2941")]).kind == \
        fabric_kind.NVSWITCH
    why = fabric_kind.detect([], no_pci, gpus=[gpu("2941")]).why()
    assert "1 rack-scale GPU(s) (0000:00:05.0 (GB200))" in why


def test_cliques_from_550_full_q_none_from_535_or_na():
    assert smi.parse_cliques(Q_550) == [
        {"gpu": "00000000:18:00.0", "clique_id": 32766,
         "cluster_uuid": "a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"}]
    assert smi.parse_cliques(Q_535) == []
    assert smi.parse_cliques(Q_NA) == []


def test_a_gb200_world_is_nvlink_rack_in_status_and_check_and_starts_no_fabric_manager():
    case = load_case(CASES / "S107-gb200-compute-tray-rack-scale-fabric.yaml")
    with World(case) as world:
        boot = world.run("boot")
        check = world.run("check")
    assert boot.rc == 0, boot.stderr
    fabric = boot.status["fabric"]
    assert fabric["kind"] == "nvlink-rack"
    assert fabric["cliques"] == [
        {"gpu": g, "clique_id": 1, "cluster_uuid": "5a1c0b7e-6f2d-4c3b-9e8a-7d6c5b4a3f21"}
        for g in ("00000000:00:05.0", "00000000:00:06.0")]
    assert not [c for c in boot.calls if c.argv[0] == "nv-fabricmanager"]
    import json

    rows = {r["name"]: r for r in json.loads(check.stdout)["checks"]}
    assert rows["fabric"]["detail"].startswith("nvlink-rack: ")


def test_a_zero_cluster_uuid_is_said_to_be_no_multi_node_nvlink():
    class Ctx:
        class runner:
            @staticmethod
            def run(argv, timeout=None):
                class Done:
                    stdout = Q_550.replace("a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf",
                                           fabric_kind.ZERO_UUID)
                return Done

        @staticmethod
        def harmless_timeout(tool):
            return 5

    fabric = fabric_kind.Fabric(fabric_kind.RACK, [], [], [])
    said = fabric_kind.rack_cliques(Ctx, fabric)
    assert said == (f"clique 32766, cluster UUID {fabric_kind.ZERO_UUID} on 1 GPU(s) (all zeros: "
                    "no multi-node NVLink)")
