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
    print(f"qemu CPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")


def test_gpu_vm_kata_agent_starts_after_the_agent_and_sees_a_ready_spec(rootfs, tmp_path):  # noqa: F811
    world.populate(rootfs, SPEC_TEMPLATE)
    boot = image.boot_qemu(rootfs, tmp_path / "artifacts")

    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_a_ready_spec_with_persistenced_running(boot, record)
    assert record["persistenced"]["cgroup"] == "0::/system.slice/podvm-gpu.service\n", "cgroup v2 only"
    print(f"qemu GPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")
