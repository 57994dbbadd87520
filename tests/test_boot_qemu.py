"""The boot tests of test_boot_nspawn.py, in a VM: qemu with the image's own kernel and initrd.

What a VM adds over a container: a real kernel with systemd as PID 1 on cgroup v2, so the
unit's sandbox is fully in force (device cgroup policy while the GPU path creates device nodes,
IP firewall, mount namespaces), real udev coldplug and the VM's own PCI devices in /sys (the
CPU path scans qemu's emulated devices). Under TCG (no KVM here) a boot to power-off takes
about 20 s on the CPU path and 30 s on the GPU path; Python runs about 20x slower, so the
agent's time here says nothing about a real VM's.
"""

from __future__ import annotations

import pytest

from boot import checks, image
from boot.fixtures import SPEC_TEMPLATE, installed, rootfs  # noqa: F401
from boot.gpu import world

pytestmark = pytest.mark.slow


def test_cpu_vm_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(rootfs, tmp_path):  # noqa: F811
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    # the final state line reaches the serial console through the kernel log
    console_line = f"podvm-gpu[{record['agent_unit']['ExecMainPID']}]: no-gpu: detect: no NVIDIA GPU on PCI"
    assert console_line in boot.console, boot.console[-3000:]
    print(f"qemu CPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")


def test_gpu_vm_kata_agent_starts_after_the_agent_and_sees_a_ready_spec(rootfs, tmp_path):  # noqa: F811
    world.populate(rootfs, SPEC_TEMPLATE)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    assert record["persistenced"]["cgroup"] == "0::/system.slice/podvm-gpu-persistenced.service\n", "cgroup v2 only"
    # On Grace-based GPUs nvidia-persistenced writes /sys/devices/system/memory/auto_online_blocks;
    # ProtectKernelTunables= makes /sys read-only (measured in a VM: "Read-only file system"), so
    # its unit opens that folder again: the fake daemon writes the value back from its unit.
    events = boot.files.get("/srv/gpu/persistenced-events.log", "")
    assert "auto_online_blocks written" in events.splitlines(), events
    print(f"qemu GPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")


@pytest.mark.parametrize("outcome", ["ready", "failed"])
def test_persistenced_outlives_every_boot_outcome_and_is_stopped_at_power_off(rootfs, tmp_path,  # noqa: F811
                                                                              outcome):
    """As in test_boot_nspawn.py, with a real kernel and cgroup v2: the daemon's unit, not the
    agent's, holds it; a failed agent unit does not take it down; power-off stops it."""
    world.populate(rootfs, SPEC_TEMPLATE, fail_cdi_generate=outcome == "failed")
    image.clean_power_off(rootfs)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")
    checks.persistenced_outlived_the_boot(boot, outcome)

