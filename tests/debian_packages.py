"""Single Debian 12 packages for the tests, fetched with a private apt configuration.

Some real programs the tests use come from packages that must not be installed on the host:
``libnvidia-ml1`` is in ``non-free`` (the host's sources may not have it, and NVML belongs
inside a test root), ``prometheus`` (for ``promtool``) would start a server on a systemd host.
So apt runs with its own sources list (bookworm, -updates and -security, with ``contrib``,
``non-free`` and ``non-free-firmware``), lists and archive cache under
``/var/cache/podvm-gpu-test/debs`` (env ``PODVM_GPU_TEST_CACHE``); the host's apt sources and
dpkg database are never changed. ``apt-get download`` fetches the candidate version and
``dpkg-deb`` unpacks it; the lists are refreshed once a day.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

from boot.image import CACHE, MIRROR, unavailable

COMPONENTS = "main contrib non-free non-free-firmware"
SECURITY = os.environ.get("PODVM_GPU_TEST_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
HOME = CACHE / "debs"
_MAX_LIST_AGE_S = 86400


def _apt_options() -> list[str]:
    return ["-o", f"Dir::Etc::SourceList={HOME / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={HOME / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={HOME / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={HOME / 'preferences.d'}",
            "-o", f"Dir::State::Lists={HOME / 'lists'}",
            "-o", f"Dir::Cache={HOME / 'apt-cache'}",
            "-o", "APT::Sandbox::User=root", "-qq"]


def _apt(tool: str, *args: str, timeout: float = 300) -> str:
    done = subprocess.run([tool, *_apt_options(), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        unavailable(f"{tool} {' '.join(args)} failed (exit {done.returncode}): "
                    f"{done.stderr.strip()[-500:]}")
    return done.stdout


def _prepare() -> None:
    for sub in ("sources.list.d", "preferences.d", "lists/partial", "apt-cache/archives/partial",
                "pool"):
        (HOME / sub).mkdir(parents=True, exist_ok=True)
    (HOME / "sources.list").write_text(
        f"deb {MIRROR} bookworm {COMPONENTS}\n"
        f"deb {MIRROR} bookworm-updates {COMPONENTS}\n"
        f"deb {SECURITY} bookworm-security {COMPONENTS}\n")
    stamp = HOME / "lists/.updated"
    if not stamp.exists() or time.time() - stamp.stat().st_mtime > _MAX_LIST_AGE_S:
        _apt("apt-get", "update")
        stamp.touch()


def fetch(package: str) -> Path:
    """The ``.deb`` of ``package``'s candidate version (amd64), downloaded once.

    Fails the test in CI, skips it elsewhere, when apt is missing or the archive unreachable.
    """
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        unavailable("apt-get and dpkg-deb are needed to fetch Debian packages")
    HOME.mkdir(parents=True, exist_ok=True)
    with open(HOME / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _prepare()
        version = ""
        for line in _apt("apt-cache", "policy", package).splitlines():
            if line.strip().startswith("Candidate:"):
                version = line.split(":", 1)[1].strip()
        if not version or version == "(none)":
            unavailable(f"{package} is not in the archive ({MIRROR}, {COMPONENTS})")
        name = f"{package}_{version.replace(':', '%3a')}_amd64.deb"
        deb = HOME / "pool" / name
        if not deb.exists():
            subprocess.run(["apt-get", *_apt_options(), "download", f"{package}={version}"],
                           cwd=HOME / "pool", check=True, capture_output=True, timeout=600)
        return deb


def unpack(deb: Path, dest: Path, *members: str) -> Path:
    """Unpack ``deb`` (all of it, or only ``members``, paths as ``./usr/bin/x``) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if not members:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True, timeout=300)
        return dest
    tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest), *members], stdin=tar.stdout, check=True,
                   timeout=300)
    tar.stdout.close()
    if tar.wait(timeout=60) != 0:
        raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb} failed")
    return dest


def version_of(deb: Path) -> str:
    """The package version in a ``.deb`` (its control file)."""
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
