"""The mkosi integration (mkosi/): a real mkosi 24.3 build of an image with it, booted.

tests/boot/mkosi_image.py builds tests/boot/mkosi-project, laid out like cloud-api-adaptor's pod
VM mkosi tree, with mkosi/ and the install bundle put in by docs/install.md's own commands. The
image then boots in systemd-nspawn and in qemu (its own kernel and initramfs-tools initrd), and
kata-agent's stand-in must start after the agent finished and find the unavailable spec: this
machine has no GPU. The build is done once for this module; each boot gets a view of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from boot import checks, image, mkosi_image
from boot.fixtures import host_has_nvidia_pci_device

# Debian bookworm's python3: the bundle's binary wheels are fetched for it.
IMAGE_PYTHON = "3.11"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    image.require_root()
    work = tmp_path_factory.mktemp("mkosi")
    tree = work / "podvm"
    mkosi_image.assemble(tree, IMAGE_PYTHON)
    result = mkosi_image.build(tree, work / "out")
    print(f"mkosi {mkosi_image.MKOSI_VERSION} build: {result.seconds:.1f} s "
          f"({'warm' if result.warm else 'empty'} mkosi cache)")
    return result


def test_postinst_script_is_executable_and_parses():
    script = image.REPO / "mkosi/mkosi.postinst.chroot"
    assert os.access(script, os.X_OK)
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.slow
def test_mkosi_build_installs_the_agent_through_the_dropped_in_config(built):
    root, log = built.root, built.log
    script = built.tree / mkosi_image.DROP_IN / "mkosi.postinst.chroot"
    assert f"Running postinstall script {script}" in log, "mkosi runs the drop-in's script"
    assert "Applying presets" in log.split(f"Running postinstall script {script}", 1)[1], "presets come after it"
    assert (root / "opt/podvm-gpu/bin/podvm-gpu").is_file()
    assert list((root / "opt/podvm-gpu/lib").glob(f"python{IMAGE_PYTHON}/site-packages/podvm_gpu"))
    assert not (root / "opt/podvm-gpu-bundle").exists(), "the bundle leaves the image"
    etc = root / "etc/systemd/system"
    wants = etc / "multi-user.target.wants"
    # Through "systemctl preset-all": the agent and kata-agent enabled, the distro daemon not.
    assert (wants / "podvm-gpu.service").is_symlink()
    assert (wants / "podvm-gpu-watch.service").is_symlink(), "the watcher is enabled (issue 34)"
    assert (wants / "kata-agent.service").is_symlink()
    assert not (wants / "nvidia-persistenced.service").is_symlink()
    assert (root / "usr/lib/systemd/system/podvm-gpu-metrics.service").is_file()
    assert not (wants / "podvm-gpu-metrics.service").is_symlink(), "the preset keeps the exporter disabled"
    for unit in ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"):
        assert os.readlink(etc / unit) == "/dev/null", unit
    assert (root / "usr/lib/systemd/system/kata-agent.service.d/10-podvm-gpu.conf").is_file()
    kernels = sorted(root.glob("boot/vmlinuz-*"))
    assert kernels and (root / f"boot/initrd.img-{kernels[-1].name.removeprefix('vmlinuz-')}").is_file()


@pytest.mark.slow
def test_image_check_passes_the_install_rows(built):
    """check --image on the built tree: the unit rows pass; the NVIDIA rows fail (no driver here)."""
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "check", "--image", "--root", str(built.root), "--json"],
                          capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    results = {row["name"]: row["result"] for row in report["checks"]}
    assert done.returncode == 1, "an image without the NVIDIA driver must fail the image check"
    installed = ("unit", "kata-agent-ordering", "cdi-refresh-units", "watch")
    assert {name: results.get(name) for name in installed} == dict.fromkeys(installed, "pass"), results
    assert {name: results.get(name) for name in ("tools", "modules", "versions")} == dict.fromkeys(
        ("tools", "modules", "versions"), "fail"), results


@pytest.mark.slow
def test_nspawn_boot_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(built, tmp_path):
    if host_has_nvidia_pci_device():
        pytest.fail("this host has an NVIDIA PCI device: the CPU path test needs a GPU-less host")
    with image.writable_view(built.root, tmp_path / "view") as root:
        boot = image.boot(root, tmp_path / "artifacts")
    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    print(f"mkosi image, nspawn CPU path: boot {boot.wall_s:.2f} s, agent {boot.agent_time_s():.3f} s (journal)")


@pytest.mark.slow
def test_qemu_boot_kata_agent_starts_after_the_agent_and_sees_the_unavailable_spec(built, tmp_path):
    with image.writable_view(built.root, tmp_path / "view") as root:
        boot = image.boot_qemu(root, tmp_path / "artifacts")
    record = checks.kata_agent_started_after_the_agent_finished(boot)
    checks.saw_the_unavailable_spec(record)
    print(f"mkosi image, qemu CPU path: boot {boot.wall_s:.1f} s, agent {boot.agent_time_s():.3f} s (journal)")
