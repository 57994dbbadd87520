"""A qemu boot of Debian 12's open-module image in which only the agent's view of PCI is faked, as
tests/test_real_driver_boot.py does for the proprietary module: the real kernel (6.1, TCG),
systemd 252 as PID 1 with the agent's unit and sandbox, kmod with Debian's ``install nvidia
modprobe -i nvidia-current-open`` rule, and the DKMS-built ``nvidia-current-open.ko`` loaded into
that kernel, which finds no GPU. The agent must end failed in the modules step quoting the open
module's real messages, the ones captured once in tests/data/nvidia-535.261.03/open-module (this
boot proves the capture still holds).
"""

from __future__ import annotations

import pytest
from boot import image, real_driver
from boot.real import captured
from schemas import assert_status_conforms

pytestmark = pytest.mark.slow


@pytest.fixture
def booted(tmp_path_factory, tmp_path):
    image.require_root()
    rootfs = real_driver.open_rootfs()
    return real_driver.boot_with_fake_pci(rootfs, image.bundle(tmp_path_factory, rootfs), tmp_path)


def test_the_real_open_module_finds_no_gpu_and_boot_fails_in_modules_quoting_it(booted):
    record = booted.record
    assert record is not None, f"the kata-agent stand-in never ran:\n{booted.console[-4000:]}"
    status = record["status"]
    assert_status_conforms(status)
    assert status["state"] == "failed", status
    assert [s["name"] for s in status["steps"] if s.get("result") == "failed"] == ["modules"], status["steps"]
    reason = status["reason"]
    capture = captured.run("open-module", "modprobe-nvidia")
    first = capture.stderr.splitlines()[0].removeprefix("modprobe: ERROR: ")
    assert first == "could not insert 'nvidia_current_open': No such device"
    assert first in reason, reason
    assert "NVRM: No NVIDIA GPU found." in capture.kernel_messages()
    assert "NVRM: No NVIDIA GPU found." in reason, reason
    print(f"qemu open-module boot: {booted.wall_s:.1f} s; reason: {reason}")
