"""Test images for the slow tests: a cached Debian rootfs, the install bundle, nspawn and qemu boots.

The rootfs is what a pod VM image is before podvm-gpu goes in: Debian bookworm minbase with
systemd, udev, kmod, python3 (no python3-venv), umockdev (for the GPU path) and a cloud kernel
(for the qemu boots). mmdebstrap builds it once (about a minute) and it is cached under
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
import shutil
import subprocess
import sys
import time
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
               components: tuple[str, ...] = ("main",)) -> str:
    """A name-keyed image's cache key: its recipe (the package names; the components when not
    only ``main``, so that the base image's key, from before variants, stays what it was)."""
    parts = [SUITE, MIRROR, sorted(packages), DPKG_OPTS, "minbase"]
    if tuple(components) != ("main",):
        parts.append(list(components))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


_KEYS: dict[str, str] = {}


@dataclass(frozen=True)
class Variant:
    """One cached test image: its packages, archive components and cache folder prefix.

    ``prefix`` + key names the folder in the cache; only folders with this prefix are pruned
    when this variant is built, so variants never delete each other. ``by_versions`` keys the
    cache on the package versions apt resolves (:func:`resolved_versions`) instead of the
    package names, for images whose packages change under the same names (a driver update).
    """

    name: str
    prefix: str
    packages: tuple[str, ...]
    components: tuple[str, ...] = ("main",)
    by_versions: bool = False

    def key(self) -> str:
        """The cache key; versions are resolved once per test session (an apt-get update and a
        simulated install, about 5 s)."""
        if not self.by_versions:
            return rootfs_key(self.packages, self.components)
        if self.name not in _KEYS:
            recipe = [SUITE, MIRROR, list(self.components), DPKG_OPTS, "minbase",
                      resolved_versions(self.packages, self.components)]
            _KEYS[self.name] = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]
        return _KEYS[self.name]

    def argv(self, target: Path) -> list[str]:
        return ["mmdebstrap", "--variant=minbase", f"--components={','.join(self.components)}",
                "--include=" + ",".join(self.packages), *[f"--dpkgopt={o}" for o in DPKG_OPTS],
                SUITE, str(target), MIRROR]


# The folder name of the base image predates variants: kept, so existing caches stay valid.
BASE = Variant("base", "rootfs-", tuple(PACKAGES))
# A stale folder of a variant is pruned only when unused this long: another checkout (with
# another recipe) may still boot from it.
STALE_S = 3 * 24 * 3600
USED_STAMP = ".podvm-gpu-test-used"


def _apt_options(folder: Path, components: tuple[str, ...]) -> list[str]:
    """apt-get options for a private apt state under folder: its own sources, lists and empty
    dpkg status; the host's sources, preferences and installed packages play no part."""
    for sub in ("lists/partial", "cache/archives/partial", "parts"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "sources.list").write_text(
        f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MIRROR} {SUITE} "
        f"{' '.join(components)}\n")
    (folder / "status").touch()
    settings = {"Dir::Etc::SourceList": folder / "sources.list", "Dir::Etc::SourceParts": folder / "parts",
                "Dir::Etc::Preferences": "/dev/null", "Dir::Etc::PreferencesParts": folder / "parts",
                "Dir::State::Lists": folder / "lists", "Dir::State::status": folder / "status",
                "Dir::Cache": folder / "cache", "Debug::NoLocking": "1", "APT::Architecture": "amd64"}
    return [arg for k, v in settings.items() for arg in ("-o", f"{k}={v}")]


def resolved_versions(packages: tuple[str, ...], components: tuple[str, ...]) -> list[str]:
    """``name=version`` of every package apt would install for ``packages`` from the mirror
    (``apt-get -s install`` against an empty system), sorted.

    The package lists live in the cache (``.apt-<hash>``) and are refreshed with ``apt-get
    update`` (a second call fetches only the unchanged InRelease, about 4 s); when the mirror
    cannot be reached the lists of the last update are used. The simulated install (10-15 s on
    a busy machine) runs once per state of the lists: its answer is kept beside them, under the
    hash of the InRelease files, which change whenever any package of the suite does.
    """
    folder = CACHE / (".apt-" + hashlib.sha256(json.dumps([MIRROR, SUITE, components]).encode()).hexdigest()[:12])
    options = _apt_options(folder, components)
    update = subprocess.run(["apt-get", *options, "-qq", "update"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300)
    releases = sorted((folder / "lists").glob("*Release"))
    if update.returncode != 0 and not releases:
        pytest.fail(f"apt-get update against {MIRROR} failed:\n{update.stderr[-2000:]}")
    state = hashlib.sha256(json.dumps(sorted(packages)).encode())
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


_bundle: Path | None = None


def bundle_env() -> dict[str, str]:
    """make-bundle.sh runs pip with the tests' own interpreter: CI's system python3 has no pip."""
    return {**os.environ, "PYTHON": sys.executable}


def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The install bundle of this checkout, built once per test session."""
    global _bundle
    if _bundle is None:
        out = tmp_path_factory.mktemp("bundle") / "podvm-gpu-bundle"
        done = subprocess.run(["sh", str(REPO / "systemd/make-bundle.sh"), str(out), str(REPO)],
                              capture_output=True, text=True, timeout=600, env=bundle_env())
        assert done.returncode == 0, f"make-bundle.sh failed:\n{done.stdout}\n{done.stderr}"
        _bundle = out
    return _bundle


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


def _run(argv: list[str], timeout_s: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s, env={**os.environ, "SYSTEMD_COLORS": "0"})
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
    returncode, console, wall_s = _run(argv, timeout_s)

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
    argv = ["qemu-system-x86_64", "-machine", "q35", "-accel", accel, "-m", "1024", "-smp", "2",
            "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(kernels[-1]), "-initrd", str(rootfs / f"boot/initrd.img-{release}"),
            "-append", f"root=/dev/vda rw console=ttyS0 panic=-1 {append}".strip(),
            "-drive", f"file={disk},format=raw,if=virtio"]
    returncode, console, wall_s = _run(argv, timeout_s)
    files = {}
    try:
        for path in paths:
            done = subprocess.run(["debugfs", "-R", f"cat {path}", str(disk)], capture_output=True,
                                  text=True, errors="replace", timeout=60)
            if "not found" not in done.stderr:
                files[path] = done.stdout
    finally:
        disk.unlink()
    return returncode, console, wall_s, files


def boot_qemu(rootfs: Path, artifacts: Path, timeout_s: float = 300,
              extra: tuple[str, ...] = ()) -> Boot:
    """Boot rootfs as a VM (:func:`run_qemu`) until the kata-agent stand-in powers it off;
    ``extra`` files are read back too."""
    returncode, console, wall_s, files = run_qemu(rootfs, artifacts, [*RESULTS, *extra],
                                                  timeout_s=timeout_s)
    return _results(returncode, console, wall_s, files.get, artifacts, extra)
