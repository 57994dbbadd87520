"""A real mkosi build of a pod VM image with podvm-gpu's mkosi/ config dropped in, for the boot tests.

mkosi is 24.3 from Debian 12's ``bookworm-backports``, run from its unpacked package: the
package asks for systemd >= 254 (also in backports), and the host's systemd 252 must stay as it
is. The .deb is fetched with a private apt configuration (its own sources list, lists and
cache folders), so the host's apt sources are never touched, and unpacked once into
``CACHE/mkosi-tool-<version>``. mkosi is pure Python; on the host it needs ``bubblewrap``.

The project (tests/boot/mkosi-project) is laid out like cloud-api-adaptor's pod VM tree: a
top-level mkosi.conf, the image in ``mkosi.images/system``, and podvm-gpu's ``mkosi/`` dropped
into ``mkosi.images/system/mkosi.conf.d/podvm-gpu`` by docs/install.md's own commands.

mkosi's default Debian repositories include ``deb.debian.org/debian-debug``, which this
network refuses (HTTP 400: apt-get update exits 100 and the build stops). The build therefore
gets a package manager tree whose ``etc/apt/sources.list.d/mkosi.sources`` replaces mkosi's
list with the test mirror alone (signatures checked with debian-archive-keyring).
``LocalMirror=`` also builds, but marks its repository ``Trusted: yes``, without signature checks.

Caches, under ``CACHE`` (tests/boot/image.py): the packages mkosi downloads
(``mkosi-packages``), and mkosi's incremental cache of the image after its package install
(``mkosi-image-<key>``). The key covers the mkosi version, the repository list and every
configuration file of the assembled project except the extra trees, so a change in mkosi/ or in
the test project installs the packages again. The agent (the bundle in an extra tree) and the
post-install script always run again: mkosi applies them after the cached stage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from boot import image

MKOSI_VERSION = "24.3-1~bpo12+1"
MKOSI_SUITE = "bookworm-backports"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
PROJECT = image.HERE / "mkosi-project"
# Where an integrator's copy of mkosi/ goes, relative to the mkosi tree (docs/install.md, "mkosi").
DROP_IN = "mkosi.images/system/mkosi.conf.d/podvm-gpu"
INSTALL_DOC = image.REPO / "docs" / "install.md"


def _apt_options(state: Path) -> list[str]:
    """apt-get options that read and write only under state: no host sources, lists or cache."""
    return [f"-o{k}={v}" for k, v in {
        "Dir::Etc::SourceList": state / "sources.list",
        "Dir::Etc::SourceParts": state / "sources.list.d",
        "Dir::Etc::Preferences": state / "preferences",
        "Dir::Etc::PreferencesParts": state / "preferences.d",
        "Dir::State::Lists": state / "lists",
        "Dir::Cache": state / "cache",
        "Debug::NoLocking": "1",
        "APT::Sandbox::User": "root",
    }.items()]


def mkosi_tool() -> Path:
    """The unpacked mkosi package (its root: usr/bin/mkosi, usr/lib/python3/dist-packages).

    Downloaded with ``apt-get download mkosi=MKOSI_VERSION`` from MKOSI_SUITE on first use
    (about a second) and kept in CACHE. Raises through pytest.fail when apt or dpkg fails.
    """
    image.require_root()
    image.require_tools("apt-get", "dpkg", "bwrap")
    image.CACHE.mkdir(parents=True, exist_ok=True)
    target = image.CACHE / f"mkosi-tool-{MKOSI_VERSION}"
    with open(image.CACHE / ".mkosi-tool.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "usr/bin/mkosi").exists():
            return target
        with tempfile.TemporaryDirectory(dir=image.CACHE, prefix=".mkosi-apt-") as tmp:
            state = Path(tmp)
            for folder in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"):
                (state / folder).mkdir(parents=True)
            (state / "sources.list").write_text(f"deb [signed-by={KEYRING}] {image.MIRROR} {MKOSI_SUITE} main\n")
            for argv in (["apt-get", *_apt_options(state), "update"],
                         ["apt-get", *_apt_options(state), "download", f"mkosi={MKOSI_VERSION}"]):
                done = subprocess.run(argv, cwd=state, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                      timeout=300)
                if done.returncode != 0:
                    pytest.fail(f"{argv[-2:]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
            deb, = state.glob("mkosi_*.deb")
            partial = state / "root"
            subprocess.run(["dpkg", "-x", str(deb), str(partial)], check=True, timeout=60)
            for stale in image.CACHE.glob("mkosi-tool-*"):
                shutil.rmtree(stale, ignore_errors=True)
            partial.rename(target)
    return target


def integrator_commands() -> str:
    """docs/install.md's block of commands that put mkosi/ and the bundle into an mkosi tree."""
    blocks = re.findall(r"```sh\n(.*?)```", INSTALL_DOC.read_text(), re.S)
    found = [b for b in blocks if b.startswith('d="$PODVM/')]
    assert len(found) == 1, "docs/install.md needs exactly one sh block that starts with: d=\"$PODVM/"
    return found[0]


def assemble(tree: Path, python_version: str) -> None:
    """The test project in tree (a path that does not exist yet): tests/boot/mkosi-project, the
    kata-agent and NVIDIA unit stand-ins in the system image's extra tree, and podvm-gpu added by
    docs/install.md's commands with PODVM=tree and PYVER=python_version ("3.11"). Those commands are
    shell, written for an integrator to paste, so they run in sh here as they stand."""
    shutil.copytree(PROJECT, tree, symlinks=True)
    extra = tree / "mkosi.images/system/mkosi.extra"
    image.install_kata_agent_standin(extra)
    image.install_nvidia_package_units(extra)
    done = subprocess.run(["sh", "-eu", "-c", integrator_commands()], cwd=image.REPO, capture_output=True,
                          text=True, timeout=600, env={**image.bundle_env(), "PODVM": str(tree),
                                                       "PYVER": python_version})
    assert done.returncode == 0, f"docs/install.md's mkosi commands failed:\n{done.stdout}\n{done.stderr}"


def cache_key(tree: Path, sources: str) -> str:
    """mkosi version, repositories and every configuration file outside the extra trees."""
    digest = hashlib.sha256(json.dumps([MKOSI_VERSION, sources]).encode())
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        relative = path.relative_to(tree)
        if "mkosi.extra" not in relative.parts:
            digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass
class Build:
    """One mkosi build: the project, the image tree, the seconds it took, whether mkosi's cache was
    there, and mkosi's output."""

    tree: Path
    root: Path
    seconds: float
    warm: bool
    log: str


def build(tree: Path, out: Path) -> Build:
    """Run ``mkosi build`` on the assembled project in tree; the image lands in out/system.

    Fails the test (pytest.fail) with the end of mkosi's output when the build fails.
    """
    tool = mkosi_tool()
    sources = (f"Types: deb\nURIs: {image.MIRROR}\nSuites: {image.SUITE}\nComponents: main\n"
               f"Signed-By: {KEYRING}\n")
    pkgmngr = out.parent / "pkgmngr"
    (pkgmngr / "etc/apt/sources.list.d").mkdir(parents=True)
    (pkgmngr / "etc/apt/sources.list.d/mkosi.sources").write_text(sources)
    key = cache_key(tree, sources)
    cache = image.CACHE / f"mkosi-image-{key}"
    packages = image.CACHE / "mkosi-packages"
    argv = [str(tool / "usr/bin/mkosi"), f"--directory={tree}", f"--package-manager-tree={pkgmngr}",
            f"--cache-dir={cache}", f"--package-cache-dir={packages}", "--incremental=yes",
            f"--output-dir={out}", "--force", "build"]
    env = {**os.environ, "PYTHONPATH": str(tool / "usr/lib/python3/dist-packages"), "TERM": "dumb"}
    with open(image.CACHE / ".mkosi-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in image.CACHE.glob("mkosi-image-*"):
            if stale != cache:  # another configuration: its packages are in mkosi-packages still
                shutil.rmtree(stale, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
        warm = any(cache.glob("*~system.manifest"))
        started = time.monotonic()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=1200, env=env)
        seconds = time.monotonic() - started
    log = done.stdout + done.stderr
    (out.parent / "mkosi-build.log").write_text(log)
    if done.returncode != 0:
        pytest.fail(f"mkosi build failed ({done.returncode}) after {seconds:.0f} s:\n{log[-4000:]}")
    return Build(tree, out / "system", seconds, warm, log)
