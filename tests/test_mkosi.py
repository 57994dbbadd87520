"""The mkosi integration (mkosi/): what Debian's mkosi 14 can check of it, and the script.

Current mkosi (what cloud-api-adaptor's podvm-mkosi uses) parses mkosi/ as a configuration
directory dropped into the image's mkosi.conf.d/ and runs mkosi.postinst.chroot inside the
image. Debian 12 ships mkosi 14, which has neither; it can still parse mkosi.conf, so this test
has it print the summary of an image configuration that includes it. The post-install script
runs the same installer the Packer build and the boot tests run (systemd/install-podvm-gpu.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from boot import image

MKOSI = Path(__file__).resolve().parents[1] / "mkosi"


def test_debian_mkosi_parses_the_config_and_adds_python3(tmp_path):
    image.require_tools("mkosi")
    shutil.copyfile(MKOSI / "mkosi.conf", tmp_path / "mkosi.conf")
    (tmp_path / "mkosi.conf.d").mkdir()
    (tmp_path / "mkosi.conf.d/00-image.conf").write_text(
        "[Distribution]\nDistribution=debian\nRelease=bookworm\n\n[Output]\nFormat=directory\n")
    done = subprocess.run(["mkosi", "summary"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TERM": "dumb"})
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout + done.stderr  # mkosi 14 prints the summary on stderr
    packages = summary.split("Packages:", 1)[1].split(":", 1)[0]
    assert "python3" in packages.split()


def test_postinst_runs_the_bundle_installer_and_removes_the_bundle():
    script = MKOSI / "mkosi.postinst.chroot"
    assert os.access(script, os.X_OK)
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    text = script.read_text()
    assert 'sh "$bundle/install-podvm-gpu.sh"' in text
    assert 'rm -rf "$bundle"' in text


def test_bundle_location_matches_the_extra_tree_the_docs_name():
    conf = (MKOSI / "mkosi.conf").read_text()
    assert "mkosi/mkosi.extra/var/tmp/podvm-gpu-bundle" in conf
    assert "bundle=/var/tmp/podvm-gpu-bundle" in (MKOSI / "mkosi.postinst.chroot").read_text()
    assert "/mkosi.extra/" in (MKOSI / ".gitignore").read_text()
