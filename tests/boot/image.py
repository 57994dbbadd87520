"""Test images for the slow tests: a cached Debian rootfs, the install bundle, nspawn and qemu boots.

The rootfs is what a pod VM image is before podvm-gpu goes in: Debian bookworm minbase with
systemd, udev, kmod, python3 (no python3-venv), umockdev (for the GPU path) and a cloud kernel
(for the qemu boots); ``TRIXIE_BASE`` is the same on Debian 13 (systemd 257, kernel 6.12), and
the boot tests run on both (``BASES``). Other images are :class:`Variant` s of it
(tests/boot/real_driver.py). mmdebstrap builds it once (about a minute) and it is cached under
``/var/cache/podvm-gpu-test/rootfs-<key>`` (env ``PODVM_GPU_TEST_CACHE``), keyed by everything
that goes into it, so CI builds it once per machine and every test starts from a view of it.
The agent is installed the way image builds install it: ``systemd/make-bundle.sh`` on the host,
then ``systemd/install-into-root.sh`` (the bundle's installer run inside the tree).

A tool these tests need that is missing fails the test in CI (env ``CI=true``) and skips it
elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SUITE = "bookworm"
MIRROR = os.environ.get("PODVM_GPU_TEST_MIRROR", "http://deb.debian.org/debian")
# python3 without python3-venv: the installer needs no ensurepip (install-podvm-gpu.sh).
# The kernel (with its initrd) is for the qemu boots; nspawn ignores it.
PACKAGES = ["systemd-sysv", "udev", "kmod", "python3", "umockdev", "linux-image-cloud-amd64"]
# Documentation is of no use in a test image and makes every copy slower.
DPKG_OPTS = ["path-exclude=/usr/share/doc/*", "path-exclude=/usr/share/man/*",
             "path-exclude=/usr/share/locale/*"]
CACHE = Path(os.environ.get("PODVM_GPU_TEST_CACHE", "/var/cache/podvm-gpu-test"))


def in_ci() -> bool:
    """CI services set CI=true; any value but an empty, 0, false or no counts (as in conftest.py)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def unavailable(why: str) -> None:
    """Fail in CI, skip elsewhere: CI must run every slow test, a laptop need not."""
    if in_ci():
        pytest.fail(f"{why} (CI=true: the slow tests must run in CI)", pytrace=False)
    pytest.skip(why)


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        unavailable(f"missing tools: {', '.join(missing)} (see .ci/apt-packages.txt)")


def require_root() -> None:
    if os.geteuid() != 0:
        unavailable("needs root (mmdebstrap, systemd-nspawn)")


def rootfs_key(packages: tuple[str, ...] | list[str] = tuple(PACKAGES),
               components: tuple[str, ...] = ("main",), suite: str = SUITE) -> str:
    """A name-keyed image's cache key: its recipe (the suite and package names; the components
    when not only ``main``, so that the keys of images from before variants stay what they were)."""
    parts = [suite, MIRROR, sorted(packages), DPKG_OPTS, "minbase"]
    if tuple(components) != ("main",):
        parts.append(list(components))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


_KEYS: dict[str, str] = {}


@dataclass(frozen=True)
class Variant:
    """One cached test image: its suite, packages, archive components and cache folder prefix.

    ``prefix`` + key names the folder in the cache; only folders with this prefix are pruned
    when this variant is built, so variants never delete each other. ``by_versions`` keys the
    cache on the package versions apt resolves (:func:`resolved_versions`) instead of the
    package names, for images whose packages change under the same names (a driver update).
    ``updates`` are further suites of the security archive (``bookworm-security``), as a real
    image's sources have them. ``pin`` = (package, source package): every binary package of the
    source package is pinned to the upstream version of the package's candidate (one driver
    version, where the security archive has newer user space than the open module).
    ``late`` packages are installed after the image is built, in mmdebstrap's customize hook,
    and their failure is tolerated and logged to ``LATE_LOG`` in the image, as a careless image
    build does with a DKMS package that cannot build for the kernel.
    """

    name: str
    prefix: str
    packages: tuple[str, ...]
    components: tuple[str, ...] = ("main",)
    by_versions: bool = False
    suite: str = SUITE
    updates: tuple[str, ...] = ()
    pin: tuple[str, str] | None = None
    late: tuple[str, ...] = ()

    def key(self) -> str:
        """The cache key; versions are resolved once per test session (an apt-get update and a
        simulated install, about 5 s)."""
        if not self.by_versions:
            return rootfs_key(self.packages, self.components, self.suite)
        if self.name not in _KEYS:
            # the recipe of a variant without updates or late packages is as it was before they
            # existed, so caches built then stay valid
            recipe = [self.suite, MIRROR, list(self.components), DPKG_OPTS, "minbase", resolved_versions(self)]
            if self.updates or self.late:
                recipe += [list(self.updates), list(self.late)]
            _KEYS[self.name] = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]
        return _KEYS[self.name]

    def sources(self) -> list[str]:
        """The image's apt source lines (one-line style)."""
        lines = [f"deb {MIRROR} {self.suite} {' '.join(self.components)}"]
        lines += [f"deb {SECURITY_MIRROR} {suite} {' '.join(self.components)}" for suite in self.updates]
        return lines

    def argv(self, target: Path) -> list[str]:
        hooks = []
        if self.pin is not None:
            preferences = CACHE / f".preferences-{self.name}"  # under the variant's build lock
            preferences.write_text(pin_preferences(self))
            hooks.append(f"--setup-hook=mkdir -p \"$1/etc/apt/preferences.d\" && "
                         f"cp {shlex.quote(str(preferences))} \"$1/etc/apt/preferences.d/50-podvm-gpu-test-pin\"")
        if self.late:
            hooks.append("--customize-hook=chroot \"$1\" env DEBIAN_FRONTEND=noninteractive apt-get "
                         f"install -y --no-install-recommends {' '.join(self.late)} >\"$1{LATE_LOG}\" "
                         f"2>&1; echo \"exit status $?\" >>\"$1{LATE_LOG}\"")
        return ["mmdebstrap", "--variant=minbase", f"--components={','.join(self.components)}",
                "--include=" + ",".join(self.packages), *[f"--dpkgopt={o}" for o in DPKG_OPTS],
                *hooks, self.suite, str(target), *self.sources()]


LATE_LOG = "/var/log/podvm-gpu-test-late-packages.log"
SECURITY_MIRROR = os.environ.get("PODVM_GPU_TEST_SECURITY_MIRROR", "http://deb.debian.org/debian-security")


# The folder name of the base image predates variants: kept, so existing caches stay valid.
BASE = Variant("base", "rootfs-", tuple(PACKAGES))
# The same base on Debian 13 (systemd 257, kernel 6.12): the boots under a newer systemd.
TRIXIE_BASE = Variant("trixie-base", "trixie-rootfs-", tuple(PACKAGES), suite="trixie")
BASES = {"bookworm": BASE, "trixie": TRIXIE_BASE}
# A stale folder of a variant is pruned only when unused this long: another checkout (with
# another recipe) may still boot from it.
STALE_S = 3 * 24 * 3600
USED_STAMP = ".podvm-gpu-test-used"


def _apt_options(folder: Path, variant: Variant, preferences: str = "") -> list[str]:
    """apt-get options for a private apt state under folder: its own sources, lists and empty
    dpkg status; the host's sources, preferences and installed packages play no part."""
    for sub in ("lists/partial", "cache/archives/partial", "parts"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    keyring = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
    (folder / "sources.list").write_text("".join(
        line.replace("deb ", "deb " + keyring, 1) + "\n" for line in variant.sources()))
    (folder / "status").touch()
    # one file a variant: variants that share the lists may resolve at the same time
    (folder / f"preferences-{variant.name}").write_text(preferences)
    settings = {"Dir::Etc::SourceList": folder / "sources.list", "Dir::Etc::SourceParts": folder / "parts",
                "Dir::Etc::Preferences": folder / f"preferences-{variant.name}",
                "Dir::Etc::PreferencesParts": folder / "parts",
                "Dir::State::Lists": folder / "lists", "Dir::State::status": folder / "status",
                "Dir::Cache": folder / "cache", "Debug::NoLocking": "1", "APT::Architecture": "amd64"}
    return [arg for k, v in settings.items() for arg in ("-o", f"{k}={v}")]


def _apt_state(variant: Variant) -> tuple[Path, list[str]]:
    """The variant's private apt state in the cache, its lists updated (see resolved_versions)."""
    folder = CACHE / (".apt-" + hashlib.sha256(json.dumps(
        [MIRROR, variant.suite, variant.components] + ([variant.updates] if variant.updates else [])
    ).encode()).hexdigest()[:12])
    options = _apt_options(folder, variant)
    if folder not in _UPDATED:
        update = subprocess.run(["apt-get", *options, "-qq", "update"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=300)
        if update.returncode != 0 and not list((folder / "lists").glob("*Release")):
            pytest.fail(f"apt-get update against {MIRROR} failed:\n{update.stderr[-2000:]}")
        _UPDATED.add(folder)
    return folder, options


_UPDATED: set[Path] = set()


def pin_preferences(variant: Variant) -> str:
    """apt_preferences(5) text pinning every binary package of ``variant.pin``'s source package to
    the upstream version of the pinned package's candidate (``535.261.03-*``)."""
    assert variant.pin is not None
    package, source = variant.pin
    _, options = _apt_state(variant)
    done = subprocess.run(["apt-cache", *options, "show", "--no-all-versions", package], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    versions = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("Version:")]
    if done.returncode != 0 or not versions:
        pytest.fail(f"apt has no {package} in {variant.suite}:\n{done.stderr[-2000:]}")
    upstream = versions[0].split(":")[-1].rsplit("-", 1)[0]
    return f"Package: src:{source}\nPin: version {upstream}-*\nPin-Priority: 1001\n"


def resolved_versions(variant: Variant) -> list[str]:
    """``name=version`` of every package apt would install for the variant's packages (its late
    ones too) from the mirror (``apt-get -s install`` against an empty system), sorted.

    The package lists live in the cache (``.apt-<hash>``) and are refreshed with ``apt-get
    update`` (a second call fetches only the unchanged InRelease, about 4 s); when the mirror
    cannot be reached the lists of the last update are used. The simulated install (10-15 s on
    a busy machine) runs once per state of the lists: its answer is kept beside them, under the
    hash of the InRelease files, which change whenever any package of the suite does.
    """
    folder, options = _apt_state(variant)
    preferences = pin_preferences(variant) if variant.pin else ""
    options = _apt_options(folder, variant, preferences)
    packages = [*variant.packages, *variant.late]
    releases = sorted((folder / "lists").glob("*Release"))
    state = hashlib.sha256(json.dumps([sorted(packages), preferences]).encode())
    for release in releases:
        state.update(release.read_bytes())
    answer = folder / f"resolved-{state.hexdigest()[:16]}.json"
    if answer.exists():
        return json.loads(answer.read_text())
    done = subprocess.run(["apt-get", *options, "-s", "--no-install-recommends", "install", *packages],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"apt cannot resolve {' '.join(packages)}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    # "Inst libc6 (2.36-9+deb12u10 Debian:12.11/stable [amd64])"
    found = sorted(f"{words[1]}={words[2].lstrip('(')}" for words in map(str.split, done.stdout.splitlines())
                   if len(words) > 2 and words[0] == "Inst")
    assert found, f"apt-get -s printed no Inst lines:\n{done.stdout[-2000:]}"
    for stale in folder.glob("resolved-*.json"):  # other package lists may still use theirs
        if time.time() - stale.stat().st_mtime > STALE_S:
            stale.unlink()
    answer.write_text(json.dumps(found))
    return found


def variant_rootfs(variant: Variant) -> Path:
    """The variant's cached rootfs, built with mmdebstrap when the cache lacks it.

    One lock per variant, so building one does not hold up boots of another. After a build,
    this variant's other folders (older package lists or versions) unused for STALE_S are removed.
    """
    require_root()
    require_tools("mmdebstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    key = variant.key()
    target = CACHE / f"{variant.prefix}{key}"
    with open(CACHE / (".lock" if variant is BASE else f".lock-{variant.name}"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "usr/bin/python3").exists():
            partial = CACHE / f".partial-{variant.name}-{key}"
            shutil.rmtree(partial, ignore_errors=True)
            argv = variant.argv(partial)
            started = time.monotonic()
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=1500)
            if done.returncode != 0:
                pytest.fail(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-3000:]}")
            (partial / ".podvm-gpu-test-build.json").write_text(json.dumps(
                {"mmdebstrap_s": round(time.monotonic() - started, 1), "argv": argv}))
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
        (target / USED_STAMP).touch()
        for stale in CACHE.glob(f"{variant.prefix}*"):
            if stale != target and stale.name[len(variant.prefix):].isalnum() and _unused_for(stale) > STALE_S:
                shutil.rmtree(stale, ignore_errors=True)
    return target


def _unused_for(folder: Path) -> float:
    stamp = folder / USED_STAMP
    return time.time() - (stamp if stamp.exists() else folder).stat().st_mtime


def base_rootfs() -> Path:
    """The cached minbase rootfs (about a minute to build)."""
    return variant_rootfs(BASE)


_bundles: dict[str, Path] = {}


def bundle_env(python_version: str | None = None) -> dict[str, str]:
    """make-bundle.sh runs pip with the tests' own interpreter: CI's system python3 has no pip.
    For an image whose Python is not the host's (Debian 13's 3.13), it downloads the
    dependencies as wheels for that version (PODVM_GPU_PYTHON_VERSION)."""
    env = {**os.environ, "PYTHON": sys.executable}
    if python_version:
        env["PODVM_GPU_PYTHON_VERSION"] = python_version
    return env


def image_python(rootfs: Path) -> str:
    """The ``X.Y`` of an image's python3 (Debian links /usr/bin/python3 to python3.Y)."""
    target = os.readlink(rootfs / "usr/bin/python3")
    return target.removeprefix("python")


def bundle(tmp_path_factory: pytest.TempPathFactory, rootfs: Path | None = None) -> Path:
    """The install bundle of this checkout for ``rootfs``'s Python (default: the host's, which
    is bookworm's, as the base image's), built once per test session and Python version."""
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    version = image_python(rootfs) if rootfs is not None else host
    if version not in _bundles:
        out = tmp_path_factory.mktemp("bundle") / "podvm-gpu-bundle"
        done = subprocess.run(["sh", str(REPO / "systemd/make-bundle.sh"), str(out), str(REPO)],
                              capture_output=True, text=True, timeout=600,
                              env=bundle_env(None if version == host else version))
        assert done.returncode == 0, f"make-bundle.sh failed:\n{done.stdout}\n{done.stderr}"
        _bundles[version] = out
    return _bundles[version]


@contextlib.contextmanager
def writable_view(source: Path, workdir: Path) -> Iterator[Path]:
    """A writable view of a rootfs that leaves source untouched: an overlay mount, else a copy.

    The overlay takes well under a second where a copy of the 340 MB tree takes 5 to 15 s here;
    a kernel or container that refuses the mount (an overlay upper dir on overlayfs) gets the copy.
    Yields the view's path; unmounts and deletes it afterwards.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    merged, upper, work = workdir / "root", workdir / "upper", workdir / "work"
    for folder in (merged, upper, work):
        folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={source},upperdir={upper},workdir={work}",
         str(merged)], capture_output=True, timeout=60).returncode == 0
    if not mounted:
        merged.rmdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(source), str(merged)], check=True, timeout=600)
    try:
        yield merged
    finally:
        if mounted:
            subprocess.run(["umount", str(merged)], check=False, timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def install_agent(rootfs: Path, bundle_dir: Path) -> None:
    require_tools("systemd-nspawn")
    done = subprocess.run(["sh", str(REPO / "systemd/install-into-root.sh"), str(rootfs), str(bundle_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"install-into-root.sh failed:\n{done.stdout}\n{done.stderr}"


def nspawn(rootfs: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command inside an image tree (systemd-nspawn, no boot), as image builds do."""
    require_tools("systemd-nspawn")
    # --pipe: plain pipes, no pseudo-terminal (tools format their output for a terminal)
    return subprocess.run(["systemd-nspawn", "--quiet", "--pipe", "--register=no", "--keep-unit",
                           f"--directory={rootfs}", *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def install_file(src: Path, rootfs: Path, path: str, mode: int = 0o644) -> None:
    dest = rootfs / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(mode)


def install_kata_agent_standin(rootfs: Path) -> None:
    """The stand-in kata-agent.service, enabled as cloud-api-adaptor enables the real one."""
    install_file(HERE / "units/kata-agent.service", rootfs, "/etc/systemd/system/kata-agent.service")
    install_file(HERE / "kata-agent-standin.py", rootfs, "/usr/local/libexec/kata-agent-standin", 0o755)
    wants = rootfs / "etc/systemd/system/multi-user.target.wants/kata-agent.service"
    wants.parent.mkdir(parents=True, exist_ok=True)
    wants.symlink_to("/etc/systemd/system/kata-agent.service")


NVIDIA_PACKAGE_UNITS = ["nvidia-persistenced.service", "nvidia-cdi-refresh.service", "nvidia-cdi-refresh.path"]


def install_nvidia_package_units(rootfs: Path) -> None:
    """Stand-ins for the units the NVIDIA driver and toolkit packages install, enabled, as a GPU
    image has them before podvm-gpu goes in. Each leaves /var/lib/nvidia-unit-ran-<name> if it runs."""
    for unit in NVIDIA_PACKAGE_UNITS:
        install_file(HERE / "units" / unit, rootfs, f"/usr/lib/systemd/system/{unit}")
        wants = rootfs / f"etc/systemd/system/multi-user.target.wants/{unit}"
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to(f"/usr/lib/systemd/system/{unit}")


RESULTS = ["/var/lib/kata-agent-standin/record.json", "/var/lib/kata-agent-standin/journal.txt",
           "/var/lib/kata-agent-standin/agent-journal.json", "/srv/gpu/calls.log",
           "/srv/gpu/persistenced-events.log"]


def clean_power_off(rootfs: Path) -> None:
    """Make the kata-agent stand-in end the boot with a regular power-off (every unit stopped
    in order) instead of the forced one: for tests of what happens to daemons at shutdown."""
    install_file(HERE / "units/kata-agent.service.d/60-clean-power-off.conf", rootfs,
                 "/etc/systemd/system/kata-agent.service.d/60-clean-power-off.conf")


@dataclass
class Boot:
    """What one boot left behind: the stand-in's record, the journal, the fake tools' calls."""

    returncode: int
    wall_s: float
    console: str
    record: dict | None
    journal: str
    agent_journal: list[dict] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # every file fetched: RESULTS and extra

    def agent_time_s(self) -> float:
        """From the journal: systemd's "Starting" to its "Finished" line for podvm-gpu.service."""
        marks = {}
        for entry in self.agent_journal:
            message = entry.get("MESSAGE", "")
            if entry.get("UNIT") == "podvm-gpu.service" and isinstance(message, str):
                for word in ("Starting", "Finished"):
                    if message.startswith(word) and word not in marks:
                        marks[word] = int(entry["__MONOTONIC_TIMESTAMP"])
        assert set(marks) == {"Starting", "Finished"}, f"no start/finish lines for the agent: {self.journal}"
        return (marks["Finished"] - marks["Starting"]) / 1e6


def systemd_version(rootfs: Path) -> int:
    """The major version of the image's systemd, from its shared library's name
    (``libsystemd-shared-257.so``, which Debian 12 and 13 keep in /usr/lib/<triplet>/systemd)."""
    for lib in sorted(rootfs.glob("usr/lib/systemd/libsystemd-shared-*.so")) + sorted(
            rootfs.glob("usr/lib/*/systemd/libsystemd-shared-*.so")):
        return int(lib.name.removeprefix("libsystemd-shared-").split(".")[0].split("-")[0])
    raise AssertionError(f"no libsystemd-shared in {rootfs}")


def nspawn_env(rootfs: Path) -> dict[str, str]:
    """systemd 256 and later refuse the hybrid cgroup hierarchy these hosts have (systemd 252
    on the host): nspawn gives such a guest the unified one instead (TESTING-NOTES, measured
    2026-12-01). Older guests keep the host's default, as before."""
    env = {**os.environ, "SYSTEMD_COLORS": "0"}
    if systemd_version(rootfs) >= 256:
        env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
    return env


def _run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s,
                              env=env or {**os.environ, "SYSTEMD_COLORS": "0"})
        returncode, console = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        output = b"".join(x for x in (err.stdout, err.stderr) if isinstance(x, bytes))
        returncode, console = -1, f"(timed out after {timeout_s} s)\n{output.decode(errors='replace')}"
    return returncode, console, time.monotonic() - started


def _results(returncode: int, console: str, wall_s: float, fetch, artifacts: Path,
             extra: tuple[str, ...] = ()) -> Boot:
    """Collect RESULTS and ``extra`` from the booted image with fetch(path) -> text or None; copy
    them to artifacts (pytest keeps them for a failed run)."""
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "console.txt").write_text(console)
    files = {}
    for path in [*RESULTS, *extra]:
        text = fetch(path)
        if text is not None:
            files[path] = text
            (artifacts / Path(path).name).write_text(text)

    def lines(path: str) -> list:
        return [json.loads(line) for line in files.get(path, "").splitlines() if line.strip()]

    record = files.get(RESULTS[0])
    return Boot(returncode, wall_s, console, json.loads(record) if record else None, files.get(RESULTS[1], ""),
                lines(RESULTS[2]), lines(RESULTS[3]), files)


def boot(rootfs: Path, artifacts: Path, timeout_s: float = 120) -> Boot:
    """Boot rootfs with systemd-nspawn until the kata-agent stand-in powers it off.

    ``--register=no --keep-unit``: no machined or system bus is needed on the host.
    ``--link-journal=no``: the journal stays in the rootfs.
    """
    require_tools("systemd-nspawn")
    argv = ["systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--link-journal=no",
            f"--directory={rootfs}"]
    returncode, console, wall_s = _run(argv, timeout_s, nspawn_env(rootfs))

    def fetch(path: str) -> str | None:
        file = rootfs / path.lstrip("/")
        return file.read_text() if file.exists() else None

    return _results(returncode, console, wall_s, fetch, artifacts)


def run_qemu(rootfs: Path, artifacts: Path, paths: list[str], append: str = "",
             timeout_s: float = 300) -> tuple[int, str, float, dict[str, str]]:
    """Boot rootfs as a VM: its kernel and initrd, the tree as an ext4 disk (mke2fs -d), no network.

    TCG (about 20 s to power-off on the CPU path here): /dev/kvm exists on this machine, but a
    KVM guest dies there with an internal error, so KVM is opt-in (env PODVM_GPU_TEST_KVM=1).
    ``append`` is added to the kernel command line. After power-off, the files at ``paths`` are
    read back from the disk with debugfs. Returns (exit code, console, wall seconds,
    {path: text} of the paths that exist).
    """
    require_tools("qemu-system-x86_64", "mke2fs", "debugfs")
    kernels = sorted(rootfs.glob("boot/vmlinuz-*"))
    assert kernels, "the test rootfs has no kernel (linux-image-cloud-amd64)"
    release = kernels[-1].name.removeprefix("vmlinuz-")
    disk = artifacts.parent / "disk.img"
    disk.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "root", "-d", str(rootfs), str(disk), "3G"],
                   check=True, capture_output=True, timeout=300)
    accel = "kvm" if os.environ.get("PODVM_GPU_TEST_KVM") == "1" else "tcg"
    # Multi-threaded TCG (QEMU 7.2) races the guest's own code patching: Debian 13's 6.12 kernel
    # died at boot in 1 of 4 boots here ("Oops: int3" in get_random_u32: a jump label patched on
    # one vCPU while the other still ran the old code; 2026-12-01), and a Debian 12 real-driver
    # boot (which loads and unloads nvidia.ko twice, each patching text) went silent after the
    # stand-in finished, never reaching systemd-shutdown, in CI (2026-12-05). One vCPU has no
    # other to race, and costs nothing measurable: the real-driver boot took 24-27 s with one
    # and 20-29 s with two here (2026-12-06). Every TCG guest gets one; KVM keeps two.
    smp = "1" if accel == "tcg" else "2"
    argv = ["qemu-system-x86_64", "-machine", "q35", "-accel", accel, "-m", "1024", "-smp", smp,
            "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(kernels[-1]), "-initrd", str(rootfs / f"boot/initrd.img-{release}"),
            "-append", f"root=/dev/vda rw console=ttyS0 panic=-1 {append}".strip(),
            "-drive", f"file={disk},format=raw,if=virtio"]
    returncode, console, wall_s = _run(argv, timeout_s)
    files = {}
    try:
        if returncode == -1:
            replay_journal(disk)
        for path in paths:
            done = subprocess.run(["debugfs", "-R", f"cat {path}", str(disk)], capture_output=True,
                                  text=True, errors="replace", timeout=60)
            if "not found" not in done.stderr:
                files[path] = done.stdout
    finally:
        disk.unlink()
    return returncode, console, wall_s, files


def replay_journal(disk: Path) -> None:
    """A VM killed at its timeout never unmounted its root: what it wrote with fsync() is in the
    ext4 journal, which debugfs does not read. e2fsck replays it (exit 1: errors corrected),
    so the stand-in's record, when it got that far, is read back and the test judges the
    agent's outcome; the test still warns that the VM did not power off."""
    done = subprocess.run(["e2fsck", "-fy", str(disk)], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), f"e2fsck on {disk}: rc {done.returncode}: {done.stdout}{done.stderr}"


def boot_qemu(rootfs: Path, artifacts: Path, timeout_s: float = 300,
              extra: tuple[str, ...] = ()) -> Boot:
    """Boot rootfs as a VM (:func:`run_qemu`) until the kata-agent stand-in powers it off;
    ``extra`` files are read back too."""
    returncode, console, wall_s, files = run_qemu(rootfs, artifacts, [*RESULTS, *extra],
                                                  timeout_s=timeout_s)
    if returncode == -1:
        warnings.warn(f"the VM did not power off within {timeout_s} s; its results were read after "
                      f"replaying the disk's journal. Console tail: {console[-600:]!r}", stacklevel=2)
    return _results(returncode, console, wall_s, files.get, artifacts, extra)
