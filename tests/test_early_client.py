"""A driver an early client re-initialised fails the boot, named (issue 46 item 2;
podvm_gpu/gpufacts/early_client.py): the kernel's objvgpu.c:148 assertion (nvtrust#109), and NVML
listing fewer GPUs than /proc/driver/nvidia/gpus. Scenarios S480 (the line while persistenced
starts) and S481 (NVML lists one of two, no line) run the whole boot."""

from __future__ import annotations

import pytest

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import early_client, kernel
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Completed
from podvm_gpu.steps.cc import identity

LINE = "NVRM: nvAssertFailedNoLog: Assertion failed: pVGpu != NULL @ objvgpu.c:148"
BANNER = "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build"
A = "GPU-3f6c1a2e-7b4d-4e8a-9c1f-0d2e4b6a8c00"


def make_root(tmp_path, gpus=("0000:18:00.0", "0000:2a:00.0"), log=(BANNER,)):
    for pci in gpus:
        folder = tmp_path / "proc/driver/nvidia/gpus" / pci
        folder.mkdir(parents=True)
        (folder / "information").write_text("Device Minor: 0\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("".join(f"3,{i},{1000000 + i},-;{m}\n"
                                               for i, m in enumerate(log)))
    return Root(tmp_path)


def test_the_objvgpu_assertion_is_a_fatal_finding_of_its_own():
    (found,) = kernel.findings([BANNER, LINE])[-1:]
    assert found.kind == "early-client" and found.fatal
    assert "re-initialised by an early client" in found.what
    assert "objvgpu.c:148" in kernel.describe(found)
    assert "early-client" in kernel.KINDS  # a podvm_gpu_kernel_events kind (metrics)
    # another assertion of the driver is no such finding
    assert all(f.kind != "early-client" for f in kernel.findings(
        ["NVRM: nvAssertFailedNoLog: Assertion failed: 0 @ mapping_cpu.c:127"]))


def test_the_line_fails_once_persistenced_is_ready_and_only_since_the_last_load(tmp_path):
    root = make_root(tmp_path / "a", log=(BANNER, LINE))
    with pytest.raises(StepFailed, match=r"re-initialised by an early client.*objvgpu\.c:148"):
        early_client.after_persistenced(root)
    # a line of an earlier load of the driver (before its last banner) is not this load's
    early_client.after_persistenced(make_root(tmp_path / "b", log=(BANNER, LINE, BANNER)))
    early_client.after_persistenced(make_root(tmp_path / "c"))


def test_nvml_listing_fewer_gpus_than_the_driver_names_the_missing_and_the_cause(tmp_path):
    root = make_root(tmp_path)
    assert early_client.driver_gpus(root) == ["00000000:18:00.0", "00000000:2A:00.0"]
    said = early_client.fewer_in_nvml(root, ["00000000:18:00.0"], "nvidia-smi -L")
    assert said.startswith("NVML lists 1 of the 2 GPU(s) in /proc/driver/nvidia/gpus "
                           "(nvidia-smi -L; not listed: 00000000:2A:00.0): the driver was "
                           "re-initialised by an early client")
    # every GPU listed, in any bus-id form: nothing to say
    assert early_client.fewer_in_nvml(root, ["0000:2a:00.0", "00000000:18:00.0"], "x") is None
    # a driver that lists no GPU gives nothing to compare
    assert early_client.fewer_in_nvml(Root(tmp_path / "none"), [], "x") is None


def test_the_kernel_line_is_quoted_beside_the_count(tmp_path):
    root = make_root(tmp_path, log=(BANNER, LINE))
    said = early_client.fewer_in_nvml(root, [], "the fabric query")
    assert "NVML lists 0 of the 2" in said
    assert said.endswith('pVGpu != NULL @ objvgpu.c:148"')  # the joined NVRM message, quoted


class Runner:
    def __init__(self, out):
        self.out = out

    def run(self, argv, check=False, **_):
        return Completed(argv, 0, self.out, "", 0.0)


def test_the_cc_identity_read_fails_when_nvml_lists_fewer_than_the_driver(tmp_path):
    root = make_root(tmp_path)
    one = Runner(f"0, 00000000:18:00.0, {A}\n")
    assert len(identity.read(one, "before nvattest")) == 1  # without a root: no comparison
    with pytest.raises(StepFailed, match=r"NVML lists 1 of the 2 GPU\(s\).*before nvattest; "
                                         r"not listed: 00000000:2A:00\.0\).*early client"):
        identity.read(one, "before nvattest", root)

