"""``podvm-gpu check --image`` on Debian 13's image as it really comes out: the driver's user
space (550.163.01: ``nvidia-smi``, NVML, ``libcuda1``, GSP firmware, ``nvidia-persistenced``)
with trixie's kernel 6.12, systemd 257 and kmod 34, then ``nvidia-open-kernel-dkms`` installed last
with its failure tolerated (tests/boot/real_driver.py ``TRIXIE``): its DKMS build fails against the
kernel, dpkg leaves it half-configured, and the image has no module. The check must fail
``modules`` naming the kernel and the build failure, and say what to do.

What the test expects it reads from the image itself (``dkms status`` run in it, the make.log
DKMS left), so a Debian 13 driver that builds for the kernel makes the same tests pass on its
image with no change: the modules row then passes and the rows that read the module pass too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from boot import image, real_driver
from test_real_driver_image import check_from_host, check_in_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The Debian 13 image with the agent installed (bundle + installer) and the toolkit stubs."""
    image.require_root()
    rootfs = real_driver.trixie_rootfs()
    bundle = image.bundle(tmp_path_factory, rootfs)  # Python 3.13's wheels
    with image.writable_view(rootfs, tmp_path_factory.mktemp("trixie")) as view:
        image.install_agent(view, bundle)
        real_driver.add_toolkit_standins(view)
        yield view


def dkms_status(root: Path) -> dict[str, str]:
    """``dkms status`` in the image: ``{"nvidia-current-open/550.163.01[, kernel, arch]": state}``."""
    done = image.nspawn(root, "dkms", "status")
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(line.rsplit(": ", 1) for line in done.stdout.splitlines() if ": " in line)


def first_compiler_error(root: Path, module: str) -> str:
    """The text after the build folder of the first ``error:`` line of the module's make.log."""
    name, version = module.split("/")
    log = root / f"var/lib/dkms/{name}/{version}/build/make.log"
    line = next(x for x in log.read_text(errors="replace").splitlines() if ": error: " in x)
    return line.split("/build/", 1)[-1]


@pytest.mark.parametrize("run_check", [check_in_image, check_from_host], ids=["nspawn", "root"])
def test_check_image_follows_what_dkms_made_of_the_open_module(root, run_check):
    kernels = sorted(p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*"))
    assert len(kernels) == 1 and kernels[0].startswith("6.12."), kernels
    kernel = kernels[0]
    status = dkms_status(root)
    assert status, "the image holds the open module's DKMS source"
    built = [k for k, state in status.items() if kernel in k and state == "installed"]
    code, checks = run_check(root)
    print(f"dkms status: {status}\nmodules: {checks['modules']}")
    if built:  # a driver that builds for the kernel: nothing to complain about
        assert checks["modules"]["result"] == "pass", checks["modules"]
        assert checks["versions"]["result"] == "pass", checks["versions"]
        return
    [added] = [k for k, state in status.items() if state == "added"]
    assert code == 1
    modules = checks["modules"]
    assert modules["result"] == "fail"
    assert modules["detail"].startswith(f"no nvidia module for kernel(s) {kernel} "), modules
    assert f"DKMS {added} is not built for {kernel} (dkms status: added)" in modules["detail"], modules
    assert f"its build failed: {first_compiler_error(root, added)}" in modules["detail"], modules
    assert f"install a driver release whose module builds for kernel {kernel}" in modules["hint"], modules
    # nothing to read a version or a firmware list from: neither row may pass
    for name in ("versions", "firmware"):
        assert checks[name]["result"] == "skip", checks[name]
        assert "no nvidia module in the image" in checks[name]["detail"], checks[name]


def test_the_rest_of_the_stack_is_there_and_of_one_version(root):
    """The failure is the module's alone: the driver's packages are all of one version, the
    tools are there, and dpkg says which package is left unconfigured (the test's oracle for
    what the image build tolerated)."""
    _, checks = check_in_image(root)
    assert checks["tools"]["result"] == "pass", checks["tools"]
    packages = ["libnvidia-ml1", "nvidia-smi", "firmware-nvidia-gsp", "libcuda1", "nvidia-open-kernel-dkms"]
    done = image.nspawn(root, "dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n", *packages)
    rows = {words[0]: (words[1], " ".join(words[2:])) for words in map(str.split, done.stdout.splitlines())}
    assert set(rows) == set(packages), done.stdout + done.stderr
    assert len({version.rsplit("-", 1)[0] for version, _ in rows.values()}) == 1, rows
    if "installed" not in dkms_status(root).values():
        assert rows["nvidia-open-kernel-dkms"][1] == "install ok half-configured", rows
