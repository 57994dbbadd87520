"""A qemu boot of the real-driver image in which only the agent's view of PCI is faked.

Real: the kernel (Debian's 6.1 cloud kernel, TCG), systemd as PID 1 with the agent's unit and
its whole sandbox, kmod's ``modprobe`` with Debian's install rules, the DKMS-built
``nvidia-current.ko`` loaded into that kernel, ``/dev/kmsg``, the agent installed by the
project's installer. Faked: the PCI devices the agent (and what it runs) sees, through umockdev
in the unit's drop-in (tests/boot/real/podvm-gpu.service.d), an H100 PCIe that the kernel does
not have; and kata-agent (the stand-in that records what it finds). So the real module finds no
device and refuses to load, and the agent must end failed in the modules step with the real
modprobe message and the real driver's kernel-log line in its reason.
"""

from __future__ import annotations

import json

import pytest
import yaml

from boot import image, real_driver

pytestmark = pytest.mark.slow
HERE = image.HERE


@pytest.fixture
def booted(tmp_path_factory, tmp_path):
    image.require_root()
    bundle = image.bundle(tmp_path_factory)
    with image.writable_view(real_driver.nvidia_rootfs(), tmp_path / "image") as root:
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        image.install_file(HERE / "gpu/h100.umockdev", root, "/usr/local/lib/podvm-gpu-test/h100.umockdev")
        image.install_file(HERE / "real/podvm-gpu.service.d/50-fake-pci.conf", root,
                           "/etc/systemd/system/podvm-gpu.service.d/50-fake-pci.conf")
        yield image.boot_qemu(root, tmp_path / "artifacts")


def test_the_real_module_finds_no_gpu_and_boot_fails_in_modules_quoting_modprobe_and_the_kernel(booted):
    record = booted.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{booted.console[-4000:]}"
    status = record["status"]
    assert status["state"] == "failed", status
    failed = [s["name"] for s in status["steps"] if s.get("result") == "failed"]
    assert failed == ["modules"], status["steps"]
    reason = status["reason"]
    assert "could not insert 'nvidia_current': No such device" in reason, reason
    assert "NVRM: No NVIDIA GPU found." in reason, reason
    spec = yaml.safe_load(record["spec"])
    assert [d["name"] for d in spec["devices"]] == ["unavailable"]
    assert any(e.startswith("PODVM_GPU_STATE=failed") for e in spec["devices"][0]["containerEdits"]["env"])
    # the unit failed, and kata-agent started after it anyway (Wants=, not Requires=)
    agent = record["agent_unit"]
    assert (agent["Result"], agent["ExecMainStatus"]) == ("exit-code", "1"), agent
    assert 0 < int(agent["ExecMainExitTimestampMonotonic"]) <= int(record["standin_unit"]["InactiveExitTimestampMonotonic"])
    print(f"qemu real-driver boot: {booted.wall_s:.1f} s; reason: {reason}")
    print(json.dumps(status["steps"], indent=1))
