"""Read-only facts about the driver and daemons, shared by boot and check.

Every function reads files under the root (contract section 1) or parses a tool's text output;
none changes anything. Formats follow the kernel and the NVIDIA driver: ``/proc/modules``,
``/proc/devices``, ``/proc/driver/nvidia/gpus/<pci>/information`` (``Device Minor:``),
``/sys/module/<name>/version``. What nvidia-smi and NVML say of the GPUs is read in
podvm_gpu/gpufacts/ (issue 33).
"""

from __future__ import annotations

import collections
import glob
import os
import re

from podvm_gpu.host import kmod
from podvm_gpu.host.fs import Root

NVIDIA_MAJOR_NAME = "nvidia"  # /proc/devices name of the driver's character major (195)
UVM_MAJOR_NAME = "nvidia-uvm"
CTL_MINOR = 255
PERSISTENCED_PID = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
FABRICMANAGER_PID = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
# /proc/<pid>/comm holds at most 15 characters (TASK_COMM_LEN - 1).
PERSISTENCED_COMM = "nvidia-persiste"
FABRICMANAGER_COMM = "nv-fabricmanage"
NVLSM_PID = "/run/podvm-gpu/nvlsm.pid"  # NVLSM's pid file, the one boot gives it (steps/fabric/nvl5.py)
NVLSM_COMM = "nvlsm"
_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")


def kernel_release(root: Root) -> str:
    """The running kernel's release from ``/proc/sys/kernel/osrelease`` (``""`` if unknown)."""
    return (root.read_text("/proc/sys/kernel/osrelease") or "").strip()


def loaded_modules(root: Root) -> set[str]:
    """Names of the modules listed in ``/proc/modules``."""
    text = root.read_text("/proc/modules") or ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def module_loaded(root: Root, name: str) -> bool:
    """True when ``name`` is in ``/proc/modules`` or ``/sys/module/<name>/initstate`` says live."""
    if name in loaded_modules(root):
        return True
    return (root.read_text(f"/sys/module/{name}/initstate") or "").strip() == "live"


def char_majors(root: Root) -> dict[str, int]:
    """The character-device part of ``/proc/devices``: name -> major."""
    majors: dict[str, int] = {}
    in_char = False
    for line in (root.read_text("/proc/devices") or "").splitlines():
        head = line.strip()
        if head.endswith(":"):
            in_char = head.lower().startswith("character")
            continue
        parts = head.split(None, 1)
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def gpu_minor(root: Root, pci_address: str) -> int | None:
    """``Device Minor`` of a GPU from ``/proc/driver/nvidia/gpus/<pci>/information``, or None."""
    text = root.read_text(f"/proc/driver/nvidia/gpus/{pci_address.lower()}/information") or ""
    # the whole value, digits alone: "0A" is no minor 0 (a node for the wrong GPU)
    m = re.search(r"^[ \t]*Device Minor:[ \t]*(\d+)[ \t]*$", text, re.M)
    return int(m.group(1)) if m else None


def gpu_minors(root: Root, gpus) -> dict[str, int]:
    """PCI address -> minor from the driver; GPUs it does not list get the next free index."""
    minors = {g.pci_address: gpu_minor(root, g.pci_address) for g in gpus}
    used = {m for m in minors.values() if m is not None}
    free = (i for i in range(256) if i not in used)
    return {pci: (m if m is not None else next(free)) for pci, m in minors.items()}


def kernel_module_version(root: Root) -> str | None:
    """The nvidia kernel module's version: ``/sys/module/nvidia/version``, else the NVRM banner."""
    text = (root.read_text("/sys/module/nvidia/version") or "").strip()
    if text:
        return text
    banner = root.read_text("/proc/driver/nvidia/version") or ""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", banner)
    return m.group(1) if m else None


def modprobe_overrides(root: Root, module: str) -> list[str]:
    """``install``/``blacklist`` lines for ``module`` in modprobe.d, as ``file: line`` strings,
    in kmod's reading order (links resolved inside the root, podvm_gpu/host/kmod.py).

    An ``install nvidia /bin/true`` line makes ``modprobe nvidia`` exit 0 without loading it;
    ``blacklist`` makes ``modprobe -b`` (udev's autoload) exit 0 without loading it.
    """
    wanted = kmod.norm(module)
    return [rule.where for rule in kmod.read_rules(root)
            if rule.command in ("install", "blacklist") and kmod.norm(rule.name) == wanted]


def module_kernels(root: Root, module: str = "nvidia") -> list[str]:
    """Kernel releases under ``/lib/modules`` that have the module: a file ``modprobe <module>``
    reaches, or a file whose internal name is ``module`` under another file name
    (podvm_gpu/host/kmod.py; any compression)."""
    try:
        releases = sorted(os.listdir(root.resolve("/lib/modules")))
    except OSError:
        return []
    return [release for release in releases if kmod.read_resolve(root, release, module).file
            or kmod.files_named(root, release, module)]


# --- the user-space driver: where the loader finds libnvidia-ml.so.1 ----------------------

_TRUSTED_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")
_MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu")
NVML_SONAME = "libnvidia-ml.so.1"


def loader_dirs(root: Root) -> list[str]:
    """The dynamic loader's search directories: ``/etc/ld.so.conf`` (with ``include`` globs),
    then the multiarch and trusted default directories (ld.so(8), ldconfig(8))."""
    dirs: list[str] = []
    seen_files: set[str] = set()

    def read_conf(host_path: str) -> None:
        real = root.resolve(host_path)
        if real in seen_files:
            return
        seen_files.add(real)
        for line in (root.read_text(host_path) or "").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                pattern = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
                if not pattern.startswith("/"):
                    pattern = "/etc/" + pattern
                for match in sorted(glob.glob(root.resolve(os.path.dirname(pattern)) + "/"
                                              + os.path.basename(pattern))):
                    read_conf(root.host_path(match))
            elif line.startswith("/"):
                dirs.append(line.split("=", 1)[0].rstrip("/") or "/")

    read_conf("/etc/ld.so.conf")
    for base in ("/lib", "/usr/lib"):
        dirs.extend(f"{base}/{arch}" for arch in _MULTIARCH)
    dirs.extend(_TRUSTED_DIRS)
    return list(dict.fromkeys(dirs))


# Immutable records as named tuples, not frozen dataclasses: ``import dataclasses`` pulls in
# ``inspect``, several milliseconds of start-up for ``podvm-gpu metrics`` (model.py says the same).
class Library(collections.namedtuple("Library", "path target version")):
    """Where ``libnvidia-ml.so.1`` is (host path of the link), its target and the version in it
    (``str``, ``str``, ``str`` or None)."""

    __slots__ = ()


def _library_at(root: Root, host_path: str) -> Library | None:
    real = root.resolve(host_path, follow_last=False)
    if not os.path.lexists(real):
        return None
    target = os.path.basename(root.resolve(host_path))
    m = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", target)
    return Library(host_path, target, m.group(1) if m else None)


def find_nvml(root: Root) -> Library | None:
    """``libnvidia-ml.so.1`` in the loader's directories, or None."""
    for folder in loader_dirs(root):
        lib = _library_at(root, f"{folder}/{NVML_SONAME}")
        if lib:
            return lib
    return None


def find_nvml_elsewhere(root: Root, max_depth: int = 4) -> Library | None:
    """``libnvidia-ml.so.1`` anywhere under the usual install prefixes, for a better reason when
    the loader cannot see it (e.g. ``/usr/lib64/nvidia``, a folder not in ld.so.conf)."""
    for top in ("/usr/lib64", "/usr/lib", "/usr/local", "/opt", "/lib64", "/lib"):
        base = root.resolve(top)
        depth0 = base.rstrip("/").count("/")
        for dirpath, dirnames, files in os.walk(base):
            if dirpath.count("/") - depth0 >= max_depth:
                dirnames[:] = []
            if NVML_SONAME in files or any(f.startswith("libnvidia-ml.so.") for f in files):
                name = NVML_SONAME if NVML_SONAME in files else sorted(
                    f for f in files if f.startswith("libnvidia-ml.so."))[0]
                lib = _library_at(root, root.host_path(os.path.join(dirpath, name)))
                if lib:
                    return lib
    return None


def version_in(text: str) -> str | None:
    """The first ``NNN.NN[.NN]`` version number in ``text``."""
    m = _VERSION.search(text or "")
    return m.group(1) if m else None


# --- daemons -----------------------------------------------------------------------------

def daemon_pid(root: Root, pid_file: str, comm: str) -> int | None:
    """The pid of a running daemon: its pid file names a pid whose ``/proc/<pid>/comm`` is ``comm``.

    Under ``--root`` the ``/proc`` read is the root's (contract section 1).
    """
    text = (root.read_text(pid_file) or "").strip()
    if not text.isdigit():
        return None
    pid = int(text)
    name = (root.read_text(f"/proc/{pid}/comm") or "").strip()
    return pid if name and name[:15] == comm[:15] else None


# The daemons the boot may start: name -> (pid file, ``/proc/<pid>/comm``).
DAEMON_FILES = {"nvidia-persistenced": (PERSISTENCED_PID, PERSISTENCED_COMM),
                "nv-fabricmanager": (FABRICMANAGER_PID, FABRICMANAGER_COMM),
                "nvlsm": (NVLSM_PID, NVLSM_COMM)}


def running_daemons(root: Root) -> dict[str, int]:
    """The daemons of :data:`DAEMON_FILES` that run now: name -> pid (:func:`daemon_pid`)."""
    pids = {name: daemon_pid(root, *files) for name, files in DAEMON_FILES.items()}
    return {name: pid for name, pid in pids.items() if pid is not None}
