"""Shared pytest fixtures.

Each block below belongs to the test files named in its heading; append new blocks rather than
rewriting this file (several people add to it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# --- bytecode: every Python the suite starts writes it, as Python does by default ---------------
# PYTHONDONTWRITEBYTECODE=1 is set on this project's machines (seen 2026-12-02). The suite starts
# Python thousands of times (the product under umockdev, the fake-tool servers, stand-ins), and
# with no .pyc of the working tree each one compiled every module it imported again: 43% of the
# CPU of a scenario's runs (P02, P03, C21, S02, S13: 2.1 s, then 1.2 s), and the fast tier is
# CPU-bound (issue 27). The .pyc files land in __pycache__ folders, which git ignores.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# --- running the real podvm-gpu command, optionally under umockdev ------------------------------
# Used by test_udev.py, test_cli.py and test_config.py.

TESTS = Path(__file__).resolve().parent
UMOCKDEV_TREES = TESTS / "umockdev"
# Variables of the developer's shell that would change what the command does.
_PRODUCT_ENV = ("PODVM_GPU_ROOT", "PODVM_GPU_CONFIG", "JOURNAL_STREAM")


def _missing_tool(what: str) -> None:
    """Skip outside CI; fail under CI (env ``CI`` set), where every tool must be installed."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing; CI must install it (see .ci)")
    pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="session")
def umockdev_run() -> str:
    """The path of ``umockdev-run`` (Debian package ``umockdev``)."""
    path = shutil.which("umockdev-run")
    if path is None:
        _missing_tool("umockdev-run")
    return path


def umockdev_tree(name: str) -> Path:
    """A device tree of tests/umockdev (``h100-pcie`` -> ``tests/umockdev/h100-pcie.umockdev``)."""
    path = UMOCKDEV_TREES / f"{name}.umockdev"
    assert path.is_file(), path
    return path


def product_env(**extra: str) -> dict[str, str]:
    """Our environment without the product's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _PRODUCT_ENV}
    env.update(extra)
    return env


@pytest.fixture
def podvm(umockdev_run):
    """Run ``python -m podvm_gpu ARGS`` in a subprocess under a umockdev device tree.

    Call as ``podvm(args, tree="h100-pcie", env={...}, python_args=[...], timeout=60)``;
    returns the ``subprocess.CompletedProcess`` (text). The device tree decides which PCI
    devices both pyudev and the sysfs pre-scan see, so the tests do not depend on this machine.
    """

    def run(args: list[str], *, tree: str = "cpu-vm", env: dict[str, str] | None = None,
            python_args: list[str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = [umockdev_run, "-d", str(umockdev_tree(tree)), "--",
                sys.executable, *(python_args or []), "-m", "podvm_gpu", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=product_env(**(env or {})))

    return run


@pytest.fixture
def empty_path(tmp_path) -> str:
    """A folder with no programs, for ``PATH``: the product finds none of its tools, so no real
    ``modprobe`` of this machine can ever run."""
    folder = tmp_path / "empty-bin"
    folder.mkdir()
    return str(folder)


# --- the metrics exporter: the fake libnvidia-ml.so.1, Debian's real one, promtool ---------------
# Used by test_metrics*.py.


@pytest.fixture(scope="session")
def fake_nvml_libs(tmp_path_factory) -> dict:
    """The fake NVML built with gcc: ``{"current": path, "535": path}`` (tests/fake_nvml)."""
    if shutil.which("gcc") is None:
        _missing_tool("gcc (Debian packages gcc, libc6-dev)")
    import fake_nvml

    out = tmp_path_factory.mktemp("fake-nvml")
    return {"current": fake_nvml.build(out), "535": fake_nvml.build(out, 535)}



@pytest.fixture(scope="session")
def promtool(tmp_path_factory) -> str:
    """Debian 12's ``promtool`` (package ``prometheus``), unpacked alone from its .deb: installing
    the package would start a Prometheus server on a systemd host."""
    import debian_packages

    deb = debian_packages.fetch("prometheus")
    out = debian_packages.unpack(deb, tmp_path_factory.mktemp("promtool"), "./usr/bin/promtool")
    return str(out / "usr/bin/promtool")


@pytest.fixture(scope="session")
def real_nvml_deb() -> Path:
    """The .deb of Debian 12's real ``libnvidia-ml1`` (non-free, the 535 branch)."""
    import debian_packages

    return debian_packages.fetch("libnvidia-ml1")


# --- Debian's Prometheus server (test_metrics_prometheus.py) -------------------------------------


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory) -> str:
    """Debian 12's ``prometheus`` server binary (2.42), unpacked alone from its .deb, as
    ``promtool`` is: installing the package would start a server on a systemd host."""
    import debian_packages

    deb = debian_packages.fetch("prometheus")
    out = debian_packages.unpack(deb, tmp_path_factory.mktemp("prometheus"), "./usr/bin/prometheus")
    return str(out / "usr/bin/prometheus")


# --- the order of a run: the tests that need no test image first --------------------------------
# For .ci/run, which builds the test images in the background (tests/boot/build_images.py): the
# tests marked slow (boots, real-driver images, packer, mkosi) run after all the others, each
# group in its usual order, so the image builds overlap with the fast tests instead of holding up
# the first boot test. A run of slow tests alone keeps its order.
# The fast tier (docs/testing.md) leaves out the tests marked ``slow`` and those marked
# ``network`` here: a test that takes a Debian package (tests/debian_packages.py: apt-get
# download into the test cache) through one of these fixtures, or through image_tar
# (test_cdi_podman.py: busybox-static).
NETWORK_FIXTURES = {"promtool", "prometheus", "real_nvml_deb", "image_tar"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if NETWORK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.network)
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


# --- the fast tier's workers: -n auto is the CPU count + 4 ----------------------------------------
# Many tests wait on a process (a fake tool's delay, a timeout being proven), so one worker per
# core left the cores idle: on 2 cores the fast tier took 233 s with 2 workers and 111 s with 6 or
# 8 (measured 2026-12-02, docs/testing.md). PYTEST_XDIST_AUTO_NUM_WORKERS still wins, as in
# pytest-xdist's own rule.
def pytest_xdist_auto_num_workers(config):
    override = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    return int(override) if override else (os.cpu_count() or 1) + 4
