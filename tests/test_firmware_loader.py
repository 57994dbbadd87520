"""The guest kernel's missing firmware loader (issue 28, kata-containers#11875): the driver
found no GSP image while the loaded driver's images are in /lib/firmware. Each branch of
steps/modules/attach.firmware_loader_cause on a temporary root (boot-level: S105, S106)."""

from __future__ import annotations

import pytest

from podvm_gpu.gpufacts import kernel
from podvm_gpu.host.fs import Root
from podvm_gpu.steps.modules.attach import firmware_loader_cause

RELEASE, VERSION = "6.12.0-guest", "570.86.15"
LOG = ["NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build",
       "NVRM: RmFetchGspRmImages: No firmware image found",
       "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x61:0x56:1697)"]


def root_with(tmp_path, config: str | None, files: bool = True) -> Root:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text(RELEASE + "\n")
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text(VERSION + "\n")
    if files:
        (tmp_path / f"lib/firmware/nvidia/{VERSION}").mkdir(parents=True)
        (tmp_path / f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin").write_bytes(b"\0")
    if config is not None:
        (tmp_path / "boot").mkdir()
        (tmp_path / f"boot/config-{RELEASE}").write_text(config)
    return Root(tmp_path)


def gsp_finding():
    found = [f for f in kernel.findings(LOG) if f.kind == "gsp-firmware"]
    assert found, "the kernel log's words are a gsp-firmware finding"
    return found[0]


@pytest.mark.parametrize("config, words", [
    ("CONFIG_MODULES=y\n# CONFIG_FW_LOADER is not set\n",
     "the guest kernel has no firmware loader (# CONFIG_FW_LOADER is not set, /boot/config-"),
    ("CONFIG_MODULES=y\n", "does not mention it"),
    (None, "its config is not readable to confirm"),
    ("CONFIG_FW_LOADER=y\n", "the kernel's config has CONFIG_FW_LOADER=y"),
])
def test_the_cause_names_the_firmware_loader_with_what_the_config_says(tmp_path, config, words):
    cause = firmware_loader_cause(root_with(tmp_path, config), gsp_finding())
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in cause
    assert words in cause, cause
    assert "GSP firmware missing" not in cause


def test_without_the_files_it_is_gsp_firmware_missing_after_all(tmp_path):
    root = root_with(tmp_path, "# CONFIG_FW_LOADER is not set\n", files=False)
    assert firmware_loader_cause(root, gsp_finding()) is None
