"""The exporter against real programs: Debian 12's ``libnvidia-ml1`` (NVIDIA's NVML of the 535
branch, non-free) without a driver, and Debian's ``promtool check metrics``.

Both packages are fetched with a private apt configuration and unpacked (tests/debian_packages.py);
nothing is installed on the host.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import debian_packages
import fake_nvml
import pytest
from fake_nvml import describe, gpu, make_root, metrics_env
from prometheus_client.parser import text_string_to_metric_families

NVML_DIR = "usr/lib/x86_64-linux-gnu/nvidia/current"  # where libnvidia-ml1 puts the library
# The link Debian's nvidia-alternative makes (its postinst, update-alternatives slave
# nvidia--libnvidia-ml.so.1-x86_64-linux-gnu); a dpkg -x has no maintainer scripts.
ALTERNATIVE = "/etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu"


@pytest.fixture(scope="module")
def real_nvml_root(tmp_path_factory, real_nvml_deb):
    """A ready pod VM root with the real library installed as Debian installs it."""
    root = make_root(tmp_path_factory.mktemp("real-nvml") / "root", None)
    debian_packages.unpack(real_nvml_deb, root)
    (root / "etc/alternatives").mkdir(parents=True, exist_ok=True)
    os.symlink(f"/{NVML_DIR}/libnvidia-ml.so.1", root / ALTERNATIVE.lstrip("/"))
    os.symlink(ALTERNATIVE, root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    return root


def real_library(root):
    return next((root / NVML_DIR).glob("libnvidia-ml.so.5*"))


# The real library's nvmlInit, run as root, makes /dev/nvidiactl (195:255) itself when it is
# missing, as NVIDIA's user space does: on the host that left a node in the machine's own /dev
# (seen four times in one day), so it runs in a mount namespace of its own with a tmpfs /dev.
_PRIVATE_DEV = ("import os, subprocess, sys\n"
                "subprocess.run(['mount', '-t', 'tmpfs', '-o', 'mode=0755', 'podvm-gpu-dev', '/dev'],"
                " check=True, timeout=30)\n"
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def test_real_nvml_without_a_driver_gives_nvml_not_reachable(real_nvml_root, real_nvml_deb):
    had = os.path.lexists("/dev/nvidiactl")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "--", sys.executable,
                           "-c", _PRIVATE_DEV, "-m", "podvm_gpu.metrics", "--root",
                           str(real_nvml_root)],
                          capture_output=True, text=True, timeout=120, env=metrics_env(None))
    assert done.returncode == 0, done.stderr
    assert os.path.lexists("/dev/nvidiactl") == had, "the real NVML wrote to the host's /dev"
    families = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    version = debian_packages.version_of(real_nvml_deb)
    print(f"libnvidia-ml1 {version}: {families['podvm_gpu_nvml_error_info'].samples[0].labels}")
    assert families["podvm_gpu_nvml_up"].samples[0].value == 0
    assert families["podvm_gpu_nvml_error_info"].samples[0].labels == {
        "reason": "driver-not-loaded", "message": "nvmlInit: Driver Not Loaded"}
    assert families["podvm_gpu_boot_state"].samples[1].labels == {"state": "ready"}
    assert not [n for n in families if n.startswith("DCGM_")]


def test_the_fake_535_library_lacks_exactly_what_the_real_one_lacks(real_nvml_root, fake_nvml_libs):
    real = ctypes.CDLL(str(real_library(real_nvml_root)))
    fake = ctypes.CDLL(str(fake_nvml_libs["535"]))
    assert [n for n in fake_nvml.FUNCTIONS if not hasattr(real, n)] == fake_nvml.ABSENT_IN_535
    assert [n for n in fake_nvml.FUNCTIONS if not hasattr(fake, n)] == fake_nvml.ABSENT_IN_535


def test_the_fake_answers_as_the_real_library_before_init_and_in_its_error_strings(real_nvml_root, fake_nvml_libs):
    real = ctypes.CDLL(str(real_library(real_nvml_root)))
    fake = ctypes.CDLL(str(fake_nvml_libs["current"]))
    for lib in (real, fake):
        lib.nvmlErrorString.restype = ctypes.c_char_p
    codes = list(range(0, 31)) + [999]
    assert [fake.nvmlErrorString(c) for c in codes] == [real.nvmlErrorString(c) for c in codes]
    count = ctypes.c_uint()
    assert fake.nvmlDeviceGetCount_v2(ctypes.byref(count)) == real.nvmlDeviceGetCount_v2(
        ctypes.byref(count)) == 1, "NVML_ERROR_UNINITIALIZED before nvmlInit"
    assert fake.nvmlShutdown() == real.nvmlShutdown() == 0


def family_blocks(text: str, prefix: str) -> str:
    """The ``# HELP``/``# TYPE``/sample lines of the families whose names start with ``prefix``."""
    keep, out = False, []
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP "):
            keep = line.split()[2].startswith(prefix)
        if keep:
            out.append(line)
    return "".join(out)


@pytest.fixture(scope="module")
def exposition(tmp_path_factory, fake_nvml_libs) -> str:
    """Every family there is: 8 GPUs with every field (one lost), NVSwitches, an Xid, full."""
    tmp = tmp_path_factory.mktemp("promtool")
    root = make_root(tmp / "root", fake_nvml_libs["current"], nvswitches=2,
                     kernel_log=["NVRM: Xid (PCI:0000:18:00): 13, pid=1, Graphics Exception."])
    desc = describe(tmp / "desc", [gpu(i, lost=1 if i == 7 else None) for i in range(8)])
    done = subprocess.run([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root)],
                          capture_output=True, text=True, timeout=120, env=metrics_env(desc))
    assert done.returncode == 0, done.stderr
    return done.stdout


def promtool_check(promtool: str, text: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=120)


def test_promtool_finds_nothing_in_the_agents_own_families(promtool, exposition):
    own = family_blocks(exposition, "podvm_gpu_")
    assert "podvm_gpu_nvml_gpu_error_info" in own and "podvm_gpu_xid_events{" in own
    done = promtool_check(promtool, own)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_promtool_on_the_dcgm_families_flags_only_dcgm_exporters_own_spelling(promtool, exposition):
    """dcgm-exporter names counters without _total and labels modelName in camelCase; the
    exporter keeps both so that its dashboards work. promtool's lint says so, and nothing else."""
    dcgm = family_blocks(exposition, "DCGM_")
    done = promtool_check(promtool, dcgm)
    problems = {re.sub(r"^\S+ ", "", line) for line in (done.stdout + done.stderr).splitlines()}
    assert done.returncode == 3, done.stdout + done.stderr
    assert problems == {'counter metrics should have "_total" suffix',
                        "label names should be written in 'snake_case' not 'camelCase'",
                        "metric name should not include type 'counter'"}
    lines = (done.stdout + done.stderr).splitlines()
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'" in lines
