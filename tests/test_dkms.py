"""podvm_gpu/steps/modules/dkms.py: what DKMS made of the nvidia module sources, read from its tree as dkms 3
lays it out (see the module docstring); on Debian's real trees in tests/test_trixie_driver_image.py
(a failed build) and tests/test_open_driver_image.py (an installed one)."""

from __future__ import annotations

from pathlib import Path

from podvm_gpu.host.fs import Root
from podvm_gpu.steps.modules import dkms

KERNEL = "6.12.117+deb13-cloud-amd64"
DATA = Path(__file__).resolve().parent / "data/dkms"
BUILD = "/var/lib/dkms/nvidia-current-open/550.163.01/build"
# the shape of gcc 14's diagnostics in DKMS's make.log (LC_ALL=C: plain quotes)
MAKE_LOG = f"""DKMS make.log for nvidia-current-open-550.163.01 for kernel {KERNEL} (x86_64)
make[1]: Entering directory '/usr/src/linux-headers-6.12.117+deb13-cloud-amd64'
{BUILD}/nvidia/nv-pci.c: In function 'nv_resize_pcie_bars':
{BUILD}/nvidia/nv-pci.c:237:9: error: too few arguments to function 'pci_resize_resource'
  237 |         r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
{BUILD}/nvidia/nv-pci.c:301:5: error: implicit declaration of function 'foo'
make[3]: *** [scripts/Makefile.build:229: {BUILD}/nvidia/nv-pci.o] Error 1
"""


def dkms_tree(tmp_path, log: str | None = MAKE_LOG, built_for: tuple[str, ...] = ()) -> Root:
    base = tmp_path / "var/lib/dkms/nvidia-current-open"
    (base / "550.163.01").mkdir(parents=True)
    (tmp_path / "usr/src/nvidia-current-open-550.163.01").mkdir(parents=True)
    (base / "550.163.01/source").symlink_to("/usr/src/nvidia-current-open-550.163.01")
    if log is not None:
        (base / "550.163.01/build").mkdir()
        (base / "550.163.01/build/make.log").write_text(log)
    for kernel in built_for:
        (base / f"550.163.01/{kernel}/x86_64/module").mkdir(parents=True)
        (base / f"kernel-{kernel}-x86_64").symlink_to(f"550.163.01/{kernel}/x86_64")
    return Root(str(tmp_path))


def test_a_failed_build_is_added_only_and_its_first_compiler_error_is_read(tmp_path):
    [build] = dkms.builds(dkms_tree(tmp_path), KERNEL)
    assert (build.module, build.version, build.state) == ("nvidia-current-open", "550.163.01", "added")
    assert build.log == f"{BUILD}/make.log"
    assert build.error == "nvidia/nv-pci.c:237:9: error: too few arguments to function 'pci_resize_resource'"


def test_the_reason_names_the_kernel_the_state_and_the_error_and_says_what_to_do(tmp_path):
    reason, hint = dkms.why_not_built(dkms_tree(tmp_path), [KERNEL])
    assert reason == (f"DKMS nvidia-current-open/550.163.01 is not built for {KERNEL} (dkms status: "
                      "added); its build failed: nvidia/nv-pci.c:237:9: error: too few arguments to "
                      f"function 'pci_resize_resource' ({BUILD}/make.log)")
    assert f"builds for kernel {KERNEL}" in hint and "the kernel nvidia-current-open 550.163.01 supports" in hint


def test_a_build_for_another_kernel_is_named(tmp_path):
    reason, _ = dkms.why_not_built(dkms_tree(tmp_path, built_for=("6.12.100-cloud-amd64",)), [KERNEL])
    assert reason.endswith("; it is built for 6.12.100-cloud-amd64"), reason


def test_a_log_without_compiler_errors_gives_makes_error_line(tmp_path):
    log = "make[2]: *** No rule to make target 'x'.  Stop.\n"
    [build] = dkms.builds(dkms_tree(tmp_path, log=log), KERNEL)
    assert build.error == "make[2]: *** No rule to make target 'x'.  Stop."


def test_an_installed_build_explains_nothing(tmp_path):
    root = dkms_tree(tmp_path, built_for=(KERNEL,))
    assert [b.state for b in dkms.builds(root, KERNEL)] == ["installed"]
    assert dkms.why_not_built(root, [KERNEL]) is None


def test_no_dkms_tree_explains_nothing(tmp_path):
    assert dkms.why_not_built(Root(str(tmp_path)), [KERNEL]) is None


def test_the_real_make_log_of_debian_13s_failed_build_gives_its_first_compiler_error(tmp_path):
    """tests/data/dkms/nvidia-current-open-550.163.01-trixie: the make.log DKMS 3.2.2 left (its
    quotes are gcc's Unicode ones)."""
    log = (DATA / "nvidia-current-open-550.163.01-trixie/make.log").read_text()
    [build] = dkms.builds(dkms_tree(tmp_path, log=log), KERNEL)
    assert build.error == "nvidia/nv-pci.c:237:9: error: too few arguments to function \u2018pci_resize_resource\u2019"
