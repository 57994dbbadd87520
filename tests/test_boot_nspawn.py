"""Real systemd boots of a pod VM image with podvm-gpu installed (systemd-nspawn).

The image is a Debian minbase rootfs with the agent installed the way image builds install it
(tests/boot/image.py) and a stand-in kata-agent.service that records, at the moment it starts,
what kata-agent would find, then powers the container off. The tests prove the ordering of the
real units: kata-agent starts only after podvm-gpu.service has finished, and finds the final
CDI spec. The CPU path runs the unit unmodified on this GPU-less machine; the GPU path adds a
drop-in that runs the agent under umockdev with fake NVIDIA tools (tests/boot/gpu/).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from boot import image
from boot.gpu import world

pytestmark = pytest.mark.slow

SPEC_TEMPLATE = Path(__file__).parent / "boot/data/spec-1gpu.yaml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The base rootfs with the agent and the kata-agent stand-in installed, never booted."""
    image.require_root()
    bundle = image.bundle(tmp_path_factory)
    with image.writable_view(image.base_rootfs(), tmp_path_factory.mktemp("installed")) as root:
        image.install_nvidia_package_units(root)
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        yield root


@pytest.fixture
def rootfs(tmp_path, installed):
    """A fresh view of the installed image for one boot."""
    with image.writable_view(installed, tmp_path / "image") as root:
        yield root


def host_has_nvidia_pci_device() -> bool:
    return any((dev / "vendor").read_text().strip() == "0x10de"
               for dev in Path("/sys/bus/pci/devices").glob("*") if (dev / "vendor").exists())


def assert_kata_agent_started_after_the_agent_finished(boot: image.Boot) -> None:
    assert boot.returncode == 0, f"nspawn exit {boot.returncode}:\n{boot.console[-4000:]}"
    record = boot.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{boot.console[-4000:]}"
    agent = record["agent_unit"]
    assert (agent["ActiveState"], agent["SubState"], agent["Result"]) == ("active", "exited", "success"), agent
    assert agent["ExecMainStatus"] == "0"
    agent_exited = int(agent["ExecMainExitTimestampMonotonic"])
    standin_started = int(record["standin_unit"]["InactiveExitTimestampMonotonic"])
    assert 0 < agent_exited <= standin_started, (agent, record["standin_unit"])
    assert record["status"]["finished_at"] is not None
    systemd_says = [e["MESSAGE"] for e in boot.agent_journal if e.get("UNIT") == "podvm-gpu.service"]
    assert [m.split()[0] for m in systemd_says] == ["Starting", "Finished"], (
        f"systemd has more to say about the unit than start and finish: {systemd_says}")
    assert record["cdi_dir"] == ["nvidia.yaml"], "no temporary or second spec file beside the final one"
    assert "nvidia-cdi-refresh" not in boot.journal
    assert not record["nvidia_units_ran"], "the installer leaves no distro or toolkit unit to race the agent"


def test_installer_enables_the_agent_masks_cdi_refresh_and_disables_the_distro_daemon(installed):
    etc = installed / "etc/systemd/system"
    wants = etc / "multi-user.target.wants"
    assert (wants / "podvm-gpu.service").is_symlink()
    for unit in ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"):
        assert os.readlink(etc / unit) == "/dev/null", unit
        assert not (wants / unit).exists(), unit
    assert not (wants / "nvidia-persistenced.service").is_symlink()
    assert os.readlink(installed / "usr/local/bin/podvm-gpu") == "/opt/podvm-gpu/bin/podvm-gpu"
    assert (installed / "usr/lib/systemd/system/kata-agent.service.d/10-podvm-gpu.conf").is_file()
    assert (installed / "usr/lib/systemd/system-preset/40-podvm-gpu.preset").is_file()


def test_cpu_vm_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(rootfs, tmp_path):
    if host_has_nvidia_pci_device():
        pytest.fail("this host has an NVIDIA PCI device: the CPU path test needs a GPU-less host")
    boot = image.boot(rootfs, tmp_path / "artifacts")

    assert_kata_agent_started_after_the_agent_finished(boot)
    record = boot.record
    assert record["status"]["state"] == "no-gpu", record["status"]
    spec = yaml.safe_load(record["spec"])
    assert spec["kind"] == "nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert "PODVM_GPU_STATE=no-gpu" in spec["devices"][0]["containerEdits"]["env"]
    agent_s = boot.agent_time_s()
    print(f"CPU path: nspawn boot {boot.wall_s:.2f} s, agent {agent_s:.3f} s (journal)")
    assert agent_s < 5, "the CPU path must not hold up kata-agent"


def test_gpu_vm_kata_agent_starts_after_the_agent_and_sees_a_ready_spec(rootfs, tmp_path):
    home = world.populate(rootfs, SPEC_TEMPLATE)
    boot = image.boot(rootfs, tmp_path / "artifacts")
    calls = [json.loads(line) for line in (home / "calls.log").read_text().splitlines()]
    shutil.copyfile(home / "calls.log", tmp_path / "artifacts/calls.log")

    assert_kata_agent_started_after_the_agent_finished(boot)
    record = boot.record
    assert record["root"] == "/srv/gpu/root"
    assert record["status"]["state"] == "ready", (record["status"], calls)
    spec = yaml.safe_load(record["spec"])
    assert {"0", "all"} <= {d["name"] for d in spec["devices"]}
    nodes = [n["hostPath"] for n in spec["containerEdits"]["deviceNodes"]]
    assert "/srv/gpu/root/dev/nvidia-uvm" in nodes, "nvidia-ctk got the agent's root as dev root"

    # nvidia-persistenced, started by the agent, outlives boot in the agent's unit (RemainAfterExit).
    daemon = record["persistenced"]
    assert daemon and daemon["alive"], daemon
    assert "/system.slice/podvm-gpu.service" in daemon["cgroup"], daemon
    tools = [call[0] for call in calls]
    first_nvml_client = min(i for i, call in enumerate(calls)
                            if call[0] == "nvidia-smi" or call[:3] == ["nvidia-ctk", "cdi", "generate"])
    assert tools.index("nvidia-persistenced") < first_nvml_client, calls
    agent_s = boot.agent_time_s()
    print(f"GPU path: nspawn boot {boot.wall_s:.2f} s, agent {agent_s:.3f} s (journal)")
