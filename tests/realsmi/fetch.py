"""NVIDIA's real ``nvidia-smi`` builds from Debian's archive, unpacked for the tests, never installed.

``python tests/realsmi/fetch.py`` fetches them (``.ci/run`` does it through
``tests/boot/build_images.py``, in the background); the tests call :func:`builds`, which waits on
the same lock and returns at once when the cache is warm.

apt runs with a private configuration only: a sources list of the machine's own Debian mirror
(``PODVM_GPU_TEST_MIRROR``, else the one in ``/etc/apt/sources.list(.d)``, else deb.debian.org)
with the suites and components the host lacks (bookworm, bookworm-security, trixie, experimental;
main contrib non-free non-free-firmware), its own lists and archive cache
(``-o Dir::Etc::sourcelist=... -o Dir::Etc::sourceparts=- -o Dir::State::Lists=...
-o Dir::Cache::archives=...``). ``apt-get download`` puts each ``.deb`` in that scratch cache and
``dpkg-deb -x`` unpacks it under ``/var/cache/podvm-gpu-test/realsmi-<key>/`` (env
``PODVM_GPU_TEST_CACHE``), keyed by the mirrors and :data:`PINS` like the test images, under a
lock. Nothing touches the host's dpkg database or apt sources.

Each build is ``package=version`` of one suite (:data:`PINS`). When a pinned version has left the
mirror, the suite's current build of the same branch (the version's first number) is taken
instead and the manifest records which one ran (``"pinned"`` and ``"version"`` differ); a build
is never skipped: a fetch that fails raises, and the tests fail under CI.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("PODVM_GPU_TEST_CACHE", "/var/cache/podvm-gpu-test"))
COMPONENTS = "main contrib non-free non-free-firmware"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY = "http://deb.debian.org/debian-security"
APT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Pin:
    """One build: ``package`` from ``suite``, ``version`` wanted (None: the suite's current one
    of ``branch``)."""

    suite: str
    package: str
    branch: str
    version: str | None

    @property
    def name(self) -> str:
        return f"{self.suite}:{self.package}={self.version or self.branch + '.*'}"


# What Debian users get (nvidia-smi-real.md's verdict table, plus bookworm-security's current 535).
PINS = (
    Pin("bookworm", "nvidia-smi", "535", "535.261.03-1"),
    Pin("bookworm-security", "nvidia-smi", "535", None),
    Pin("trixie", "nvidia-tesla-535-smi", "535", "535.274.02-1~deb13u1"),
    Pin("trixie", "nvidia-smi", "550", "550.163.01-2"),
    Pin("experimental", "nvidia-smi", "555", "555.58.02-4"),
)


class FetchFailed(RuntimeError):
    """A build could not be resolved, downloaded or unpacked (the message says which and why)."""


@dataclass(frozen=True)
class Build:
    """One unpacked build: ``binary`` is its ``nvidia-smi``; ``version`` the Debian version that
    ran, ``upstream`` NVIDIA's (``535.261.03``), ``branch`` ``535``/``550``/``555``."""

    suite: str
    package: str
    pinned: str | None
    version: str
    binary: Path

    @property
    def upstream(self) -> str:
        return self.version.split("-", 1)[0]

    @property
    def branch(self) -> int:
        return int(self.upstream.split(".", 1)[0])

    @property
    def ident(self) -> str:
        return f"{self.suite}-{self.package}-{self.upstream}"


def _host_mirror() -> str:
    """The machine's own Debian mirror: the first ``deb``/``URIs:`` naming a ``/debian`` archive
    in /etc/apt/sources.list(.d), or deb.debian.org."""
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.suffix in (".list", ".sources") or path.name == "sources.list":
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                continue
    for text in texts:
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["deb"] or words[:1] == ["URIs:"]:
                for word in words[1:]:
                    if re.fullmatch(r"https?://\S+/debian/?", word):
                        return word.rstrip("/")
    return DEFAULT_MIRROR


MIRROR = os.environ.get("PODVM_GPU_TEST_MIRROR") or _host_mirror()
SECURITY = os.environ.get("PODVM_GPU_TEST_SECURITY_MIRROR", DEFAULT_SECURITY)


def key() -> str:
    """The cache key: the mirrors and the pins."""
    recipe = [MIRROR, SECURITY, COMPONENTS, [p.__dict__ for p in PINS]]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def home() -> Path:
    return CACHE / f"realsmi-{key()}"


def sources_list() -> str:
    """The private sources list: only what the builds need."""
    lines = []
    for suite in sorted({p.suite for p in PINS}):
        archive = SECURITY if suite.endswith("-security") else MIRROR
        lines.append(f"deb {archive} {suite} {COMPONENTS}")
    return "\n".join(lines) + "\n"


def _apt_options(scratch: Path) -> list[str]:
    return ["-o", f"Dir::Etc::sourcelist={scratch / 'sources.list'}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::Etc::Preferences={scratch / 'preferences'}",
            "-o", "Dir::Etc::PreferencesParts=-",
            "-o", f"Dir::State::Lists={scratch / 'lists'}",
            "-o", f"Dir::State::status={scratch / 'status'}",
            "-o", f"Dir::Cache={scratch / 'cache'}",
            "-o", f"Dir::Cache::archives={scratch / 'archives'}",
            "-o", "APT::Architecture=amd64",
            "-o", "APT::Sandbox::User=root", "-qq"]


def _apt(scratch: Path, *args: str, cwd: Path | None = None) -> str:
    argv = [args[0], *_apt_options(scratch), *args[1:]]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=APT_TIMEOUT_S, cwd=cwd,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise FetchFailed(f"{' '.join(args)} timed out after {APT_TIMEOUT_S} s") from err
    if done.returncode != 0:
        raise FetchFailed(f"{' '.join(args)} failed (exit {done.returncode}): "
                          f"{done.stderr.strip()[-600:]}")
    return done.stdout


def madison(scratch: Path, package: str) -> list[tuple[str, str]]:
    """``(version, suite)`` of every amd64 build of ``package`` the private lists know."""
    found = []
    for line in _apt(scratch, "apt-cache", "madison", package).splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0] == package and parts[2].endswith("Packages"):
            found.append((parts[1], parts[2].split()[1].split("/")[0]))
    return found


def _newer(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b], timeout=30,
                          check=False).returncode == 0


def resolve(pin: Pin, known: list[tuple[str, str]]) -> str:
    """The version to fetch for ``pin`` from madison's ``known``: the pinned one if the suite has
    it, else the suite's newest of the same branch.

    Raises:
        FetchFailed: the suite has no build of the branch.
    """
    in_suite = [v for v, s in known if s == pin.suite and v.split(".", 1)[0] == pin.branch]
    if pin.version in in_suite:
        return pin.version
    if not in_suite:
        raise FetchFailed(f"{pin.name}: {pin.suite} has no {pin.package} of branch {pin.branch} "
                          f"on {MIRROR} (madison: {known})")
    best = in_suite[0]
    for version in in_suite[1:]:
        if _newer(version, best):
            best = version
    return best


def _find_binary(root: Path) -> Path:
    """The real nvidia-smi ELF in an unpacked package (Debian keeps it under /usr/lib/nvidia/...
    or /usr/bin, the other a link)."""
    for path in sorted(root.rglob("nvidia-smi")):
        if path.is_file() and not path.is_symlink() and path.read_bytes()[:4] == b"\x7fELF":
            return path
    raise FetchFailed(f"no nvidia-smi ELF in {root}")


def _fetch_all(target: Path) -> list[dict]:
    scratch = Path(tempfile.mkdtemp(prefix="realsmi-apt-", dir=CACHE))
    try:
        for sub in ("lists/partial", "archives/partial", "cache", "debs"):
            (scratch / sub).mkdir(parents=True)
        (scratch / "sources.list").write_text(sources_list())
        (scratch / "preferences").write_text("")
        (scratch / "status").write_text("")
        _apt(scratch, "apt-get", "update")
        manifest = []
        for pin in PINS:
            version = resolve(pin, madison(scratch, pin.package))
            _apt(scratch, "apt-get", "download", f"{pin.package}={version}", cwd=scratch / "debs")
            debs = [d for d in (scratch / "debs").glob(f"{pin.package}_*.deb")]
            if len(debs) != 1:
                raise FetchFailed(f"{pin.name}: apt-get download left {debs}")
            dest = target / f"{pin.suite}-{pin.package}-{version.split('-', 1)[0]}"
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(dest)], check=True, timeout=300)
            debs[0].unlink()
            binary = _find_binary(dest)
            manifest.append({"suite": pin.suite, "package": pin.package, "pinned": pin.version,
                             "version": version, "binary": str(binary.relative_to(target))})
        return manifest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def builds() -> list[Build]:
    """Every build of :data:`PINS`, fetched and unpacked once (the first caller fetches; the
    others wait on the lock).

    Raises:
        FetchFailed: apt or dpkg-deb is missing, or a build cannot be fetched.
    """
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "dpkg"):
        if shutil.which(tool) is None:
            raise FetchFailed(f"{tool} is needed to fetch nvidia-smi (.ci/apt-packages.txt)")
    CACHE.mkdir(parents=True, exist_ok=True)
    target = home()
    manifest_path = target / "manifest.json"
    with open(CACHE / ".lock-realsmi", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not manifest_path.exists():
            partial = CACHE / f".partial-realsmi-{key()}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            manifest = _fetch_all(partial)
            (partial / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(partial, target)
    manifest = json.loads(manifest_path.read_text())
    return [Build(m["suite"], m["package"], m["pinned"], m["version"], target / m["binary"])
            for m in manifest]


def main() -> int:
    started = time.monotonic()
    try:
        found = builds()
    except (FetchFailed, subprocess.SubprocessError, OSError) as err:
        print(f"realsmi: fetch failed after {time.monotonic() - started:.0f} s: {err}", flush=True)
        return 1
    for build in found:
        note = "" if build.pinned in (None, build.version) else f" (pinned {build.pinned}: gone)"
        print(f"realsmi: {build.suite} {build.package}={build.version}{note}", flush=True)
    print(f"realsmi: {len(found)} builds in {home()} after {time.monotonic() - started:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
