"""Whatever breaks, boot ends ``failed`` with a reason, the unavailable spec and exit 1: never a
traceback as its only output, never a missing status (contract sections 2 and 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from conftest import umockdev_tree


def boot_with_a_module_broken(root: str, umockdev_run: str) -> subprocess.CompletedProcess:
    """Run boot in a child where a module detection imports once it sees an NVIDIA function
    fails to import (a broken install), on a VM with an H100 (umockdev)."""
    code = ("import sys; sys.modules['podvm_gpu.pci_ids'] = None\n"
            "from podvm_gpu.cli import main\n"
            f"sys.exit(main(['boot', '--root', {root!r}]))\n")
    return subprocess.run([umockdev_run, "-d", str(umockdev_tree("h100-pcie")), "--",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": "/nonexistent"})


def test_a_broken_install_ends_failed_with_the_unavailable_spec(tmp_path, umockdev_run):
    root = str(tmp_path)
    done = boot_with_a_module_broken(root, umockdev_run)
    assert done.returncode == 1, done.stderr
    status = json.loads((tmp_path / "run/podvm-gpu/status.json").read_text())
    assert status["state"] == "failed"
    assert status["reason"].startswith("detect: internal error: ModuleNotFoundError")
    assert status["finished_at"]
    spec = yaml.safe_load((tmp_path / "var/run/cdi/nvidia.yaml").read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert env == ["PODVM_GPU_STATE=failed", f"PODVM_GPU_REASON={status['reason']}"]
    assert "error: failed: detect: internal error" in done.stderr
