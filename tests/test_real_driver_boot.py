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
from schemas import assert_status_conforms

pytestmark = pytest.mark.slow


@pytest.fixture
def booted(tmp_path_factory, tmp_path):
    image.require_root()
    return real_driver.boot_with_fake_pci(real_driver.nvidia_rootfs(),
                                          image.bundle(tmp_path_factory), tmp_path)


def test_the_real_module_finds_no_gpu_and_boot_fails_in_modules_quoting_modprobe_and_the_kernel(booted):
    record = booted.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{booted.console[-4000:]}"
    status = record["status"]
    assert_status_conforms(status)
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
    standin_started = int(record["standin_unit"]["InactiveExitTimestampMonotonic"])
    assert 0 < int(agent["ExecMainExitTimestampMonotonic"]) <= standin_started
    print(f"qemu real-driver boot: {booted.wall_s:.1f} s; reason: {reason}")
    print(json.dumps(status["steps"], indent=1))
    console = [line for line in booted.console.splitlines() if "podvm-gpu[" in line]
    assert any("]: failed: modules: " in line for line in console), (
        "the final state line reaches the serial console through the real kernel log", console)


def test_the_real_persistenced_under_systemd_is_started_without_the_option_it_lacks_and_its_syslog_cause_is_quoted(
        tmp_path_factory, tmp_path):
    """The real nvidia-persistenced 535.171.04 the agent starts as a unit of its own, with the
    agent's own arguments, in an nspawn boot of the real-driver image: real systemd (PID 1 of the
    container), systemd-run, the unit's sandbox and a real journald. Faked: PCI (umockdev) and
    the steps before persistenced (the fake GPU world under /srv/gpu: module loading, nodes).
    The daemon refuses --uvm-persistence-mode and exits 0 without starting; the agent starts it
    again without it; then it finds no NVIDIA device and says so only in syslog, and the reason
    quotes that line from its journal."""
    from boot.fixtures import SPEC_TEMPLATE
    from boot.gpu import world

    image.require_root()
    bundle = image.bundle(tmp_path_factory)
    with image.writable_view(real_driver.nvidia_rootfs(), tmp_path / "image") as root:
        image.install_agent(root, bundle)
        image.install_kata_agent_standin(root)
        home = world.populate(root, SPEC_TEMPLATE)
        (home / "bin/nvidia-persistenced").unlink()  # the real one, from the config's tools:
        config = home / "root/etc/podvm-gpu/config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("tools: {nvidia-persistenced: /usr/bin/nvidia-persistenced}\n"
                          "persistenced: {ready_timeout_s: 20, per_gpu_s: 0}\n")
        boot = image.boot(root, tmp_path / "artifacts")

    record = boot.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{boot.console[-4000:]}"
    status = record["status"]
    assert_status_conforms(status)
    assert status["state"] == "failed", status
    assert status["reason"].startswith(
        "persistenced: nvidia-persistenced exited with status 1 during the wait: Failed to query "
        "NVIDIA devices. Please ensure that the NVIDIA device files (/dev/nvidia*) exist, and that "
        "user 0 has read and write permissions for those files."), status["reason"]
    assert any("does not offer --uvm-persistence-mode" in w and "unrecognized option" in w
               for w in status["warnings"]), status["warnings"]
    assert record["persistenced_unit"]["ActiveState"] == "failed", record["persistenced_unit"]
    assert "Check syslog for more details" in boot.journal, "the daemon's stderr is in its journal too"
