"""``podvm-gpu check --image`` on the real-driver image: Debian 12's own NVIDIA 535 packages, as
apt installed them (DKMS-built ``nvidia-current.ko`` behind Debian's modprobe.d install rules,
NVML and persistenced behind the alternatives system, the GSP firmware), the agent installed by
the project's installer. Real: every NVIDIA piece but ``nvidia-ctk`` and ``nvidia-cdi-hook`` (not
in Debian 12: stubs), kmod 30 and dpkg of the image. The check runs the way image builds run it,
inside the tree with systemd-nspawn (there the image's real ``modprobe`` and ``modinfo``
answer), and from the build machine with ``--root`` (there the files are read, links resolved
inside the root). Each piece taken away is taken away for real (dpkg removes the package, the
second kernel is a real kernel tree without the DKMS build)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from boot import image, real_driver
from boot.real import captured

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The real-driver image with the agent installed (bundle + installer) and the toolkit stubs."""
    image.require_root()
    bundle = image.bundle(tmp_path_factory)
    with image.writable_view(real_driver.nvidia_rootfs(), tmp_path_factory.mktemp("real-installed")) as root:
        image.install_agent(root, bundle)
        real_driver.add_toolkit_standins(root)
        yield root


@pytest.fixture
def root(installed, tmp_path):
    with image.writable_view(installed, tmp_path / "view") as view:
        yield view


def check_in_image(root: Path) -> tuple[int, dict[str, dict]]:
    done = image.nspawn(root, "/opt/podvm-gpu/bin/podvm-gpu", "check", "--image", "--json")
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def check_from_host(root: Path) -> tuple[int, dict[str, dict]]:
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--image", "--root", str(root),
                           "--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def dpkg_remove(root: Path, package: str) -> None:
    done = image.nspawn(root, "dpkg", "--remove", "--force-depends", package)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("run_check", [check_in_image, check_from_host], ids=["nspawn", "root"])
def test_the_real_image_passes(root, run_check):
    code, checks = run_check(root)
    assert code == 0, checks
    # the image has no kata-agent yet (cloud-api-adaptor adds it): nothing to read its
    # cdi_timeout from; and no config file, so nothing to have compiled
    assert checks["kata-agent-cdi"]["result"] == "skip", checks["kata-agent-cdi"]
    assert checks["config-compiled"] == {
        "name": "config-compiled", "result": "skip",
        "detail": "no /etc/podvm-gpu/config.yaml in the image", "hint": ""}
    # nor NVLink 5's pieces (IB modules, nvlsm, the fabric manager), which an image that does
    # not say it serves NVLink 5 VMs (nvlink5.image_serves) is a skip naming them (issues 16, 35)
    assert checks["fabric"]["result"] == "skip", checks["fabric"]
    assert checks["fabric"]["detail"].startswith("for NVLink 5 VMs the image lacks: "), \
        checks["fabric"]
    # nor NVIDIA's nvattest and libnvidia-nscq, which an image that does not say it serves
    # confidential GPU VMs (confidential_computing.image_serves) is only warned about (issue 26)
    assert checks["attestation"]["result"] == "warn", checks["attestation"]
    assert checks["attestation"]["detail"].startswith("for confidential GPU VMs the image lacks: nvattest"), \
        checks["attestation"]
    # Debian's real driver packages load nvidia-drm at boot (/etc/modules-load.d/nvidia.conf ->
    # the alternative -> nvidia-load.conf: "nvidia-drm"), before the agent: in an image that does
    # not say it serves confidential GPU VMs that is a warning naming the file (issue 46 item 2)
    assert checks["early-gpu-clients"]["result"] == "warn", checks["early-gpu-clients"]
    assert "/etc/modules-load.d/nvidia.conf" in checks["early-gpu-clients"]["detail"], \
        checks["early-gpu-clients"]
    others = {n: c for n, c in checks.items()
              if n not in ("kata-agent-cdi", "config-compiled", "fabric", "attestation-agent-ordering",
                           "attestation", "toolkit", "early-gpu-clients")
              and c["result"] != "pass"}
    # the toolkit's stand-ins (not in Debian) are in no dpkg package and answer no --version:
    # their versions are unknown (issue 36)
    assert checks["toolkit"]["result"] == "skip", checks["toolkit"]
    # no attestation-agent in the image yet (cloud-api-adaptor adds it): skip, naming the ordering
    # the agent's unit ships (issue 25)
    assert checks["attestation-agent-ordering"]["result"] == "skip", checks["attestation-agent-ordering"]
    assert "Before=attestation-agent.service" in checks["attestation-agent-ordering"]["detail"]
    assert not others, others
    release = sorted(p.name for p in (root / "lib/modules").iterdir())[-1]
    assert f"/lib/modules/{release}/updates/dkms/nvidia-current.ko via install nvidia modprobe -i " \
           "nvidia-current" in checks["modules"]["detail"]
    source = "modprobe --show-depends" if run_check is check_in_image else "modprobe.d and modules.dep"
    assert source in checks["modules"]["detail"]
    assert checks["versions"]["detail"] == f"modules and user space all {captured.DRIVER}"
    assert f"nvidia/{captured.DRIVER}/gsp_ga10x.bin" in checks["firmware"]["detail"]


def test_a_second_kernel_without_the_dkms_build_fails_modules(root):
    """A second kernel as a kernel package leaves it when DKMS could not build for it (no
    headers): its vmlinuz and a copy of the real module tree without updates/dkms, indexed by the
    image's real depmod."""
    release = sorted(p.name for p in (root / "lib/modules").iterdir())[-1]
    second = release.replace("6.1.0-", "6.1.0-9", 1)
    shutil.copyfile(root / f"boot/vmlinuz-{release}", root / f"boot/vmlinuz-{second}")
    shutil.copytree(root / f"lib/modules/{release}", root / f"lib/modules/{second}", symlinks=True,
                    ignore=shutil.ignore_patterns("updates", "build", "source"))
    assert image.nspawn(root, "depmod", second).returncode == 0
    for run_check in (check_in_image, check_from_host):
        code, checks = run_check(root)
        assert code == 1
        assert checks["modules"]["result"] == "fail"
        detail = checks["modules"]["detail"]
        assert f"kernel(s) {second} (" in detail, checks["modules"]
        # DKMS's tree says why, and that the image's own kernel has its build
        assert f"DKMS nvidia-current/{captured.DRIVER} is not built for {second}" in detail, detail
        assert detail.endswith(f"; it is built for {release}"), detail


def test_without_debians_modprobe_rule_modules_fails_naming_the_renamed_file(root):
    """What Debian installs without libcuda1 (no glx alternative): the real modprobe finds no
    nvidia (tests/data/nvidia-535.261.03/no-install-rule)."""
    (root / "etc/modprobe.d/nvidia.conf").unlink()
    for run_check in (check_in_image, check_from_host):
        code, checks = run_check(root)
        assert code == 1
        detail = checks["modules"]["detail"]
        assert "modprobe nvidia finds no module" in detail and "nvidia-current.ko" in detail, detail


def test_without_nvml_versions_fails(root):
    dpkg_remove(root, "libnvidia-ml1")
    code, checks = check_in_image(root)
    assert code == 1
    assert checks["versions"]["result"] == "fail"
    assert "libnvidia-ml.so.1 not in the loader's directories" in checks["versions"]["detail"]


def test_without_persistenced_tools_fails(root):
    dpkg_remove(root, "nvidia-persistenced")
    code, checks = check_in_image(root)
    assert code == 1
    assert (checks["tools"]["result"], checks["tools"]["detail"]) == ("fail", "missing: nvidia-persistenced")


def test_without_the_gsp_firmware_the_files_the_module_asks_for_are_named(root):
    """The real module's modinfo names the two GSP images (modinfo -F firmware)."""
    dpkg_remove(root, "firmware-nvidia-gsp")
    for run_check in (check_in_image, check_from_host):
        code, checks = run_check(root)
        assert code == 1
        firmware = checks["firmware"]
        assert firmware["result"] == "fail"
        assert f"asks for firmware nvidia/{captured.DRIVER}/gsp_" in firmware["detail"], firmware
        assert "(and 1 more)" in firmware["detail"]


def test_the_installed_programs_still_do_what_the_fixtures_say(root):
    """Real, now: the image's nvidia-smi and nvidia-persistenced, run in nspawn as the agent runs
    them, against the captures in tests/data/nvidia-535.261.03 that the fast tests feed the agent.
    A driver update in the archive builds a new image (the cache key is the resolved versions);
    this test then says that the fixtures need capturing again (tests/boot/real/capture.py)."""
    smi = image.nspawn(root, "nvidia-smi", "-L")
    fixture = captured.run("plain", "nvidia-smi-L")
    assert (smi.returncode, smi.stdout) == (fixture.rc, fixture.stdout)
    helped = image.nspawn(root, "nvidia-persistenced", "--help")
    assert helped.stdout == captured.run("plain", "nvidia-persistenced-help").stdout
    rejected = image.nspawn(root, "nvidia-persistenced", "--persistence-mode", "--uvm-persistence-mode")
    fixture = captured.run("plain", "nvidia-persistenced-agent-default-args")
    # nspawn adds a line of its own on stderr when it leaves ("Attempted to remove disk file system")
    assert rejected.returncode == fixture.rc and rejected.stderr.startswith(fixture.stderr)
