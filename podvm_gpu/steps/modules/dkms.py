"""What DKMS did with the image's nvidia module sources, read from its tree (nothing is run).

An image build that installs a driver's DKMS package builds the module for the image's kernels
while the package is configured; when the build fails, dpkg leaves the package half-configured
and the image has no module, but an image build that tolerates the failure ships it anyway
(Debian 13's 550.163.01 on kernel 6.12.117). ``check --image`` then says why the module is
missing from this tree, which is what ``dkms status`` reads too (dkms 3.0 and 3.2):

- ``/var/lib/dkms/<module>/<version>/source``: the source is added (``dkms status``: ``added``);
- ``/var/lib/dkms/<module>/<version>/<kernel>/<arch>/module/``: built for that kernel (``built``);
- ``/var/lib/dkms/<module>/kernel-<kernel>-<arch>``: installed for it (``installed``);
- ``/var/lib/dkms/<module>/<version>/build/make.log``: the log of the last build, kept when it
  failed (dkms prints "Consult .../build/make.log for more information."), and
  ``<kernel>/<arch>/log/make.log`` for a build that succeeded.
"""

from __future__ import annotations

import os
import re

from podvm_gpu.host.fs import Root
from podvm_gpu.record import REQUIRED, Record

DKMS_TREE = "/var/lib/dkms"
_MAX_LOG = 4 << 20  # a failed nvidia build log is tens of KiB; a larger one is read this far
# gcc's diagnostics: "<path>/nv-pci.c:237:9: error: too few arguments to function '...'"
_COMPILER_ERROR = re.compile(r"^(?P<file>\S+?):(?P<line>\d+)(?::\d+)?: (?:fatal )?error: .+$", re.M)
_MAKE_ERROR = re.compile(r"^make(?:\[\d+\])?: \*\*\* .+$", re.M)


class Build(Record):
    """One DKMS module source and what DKMS made of it for one kernel.

    Attributes:
        module: the DKMS module name (``nvidia-current-open``).
        version: its version (``550.163.01``).
        kernel: the kernel release.
        state: ``installed``, ``built`` or ``added`` (the source only), as ``dkms status`` says.
        log: host path (inside the root) of the build's make.log, or None.
        error: the first compiler error in that log (its file name shortened to the part below
            the build folder), else its first ``make: ***`` line, or None.
    """

    FIELDS = (("module", REQUIRED), ("version", REQUIRED), ("kernel", REQUIRED), ("state", REQUIRED),
              ("log", None), ("error", None))


def _listdir(root: Root, path: str) -> list[str]:
    try:
        return sorted(os.listdir(root.resolve(path)))
    except OSError:
        return []


def first_error(text: str, build_dir: str) -> str | None:
    """The first compiler error of a make.log (``nv-pci.c:237:9: error: ...``), the path of the
    file below ``build_dir`` (as DKMS's build folder holds it), else the first ``make: ***`` line."""
    found = _COMPILER_ERROR.search(text)
    if found:
        line = found.group(0)
        path = found.group("file")
        short = path.split(build_dir.rstrip("/") + "/", 1)[-1] if build_dir else path
        return (short + line[len(path):])[:300]
    found = _MAKE_ERROR.search(text)
    return found.group(0)[:300] if found else None


def builds(root: Root, kernel: str, prefix: str = "nvidia") -> list[Build]:
    """Every DKMS module whose name starts with ``prefix``, each version, for ``kernel``."""
    out = []
    for module in _listdir(root, DKMS_TREE):
        if not module.startswith(prefix):
            continue
        base = f"{DKMS_TREE}/{module}"
        installed = {name for name in _listdir(root, base) if name.startswith(f"kernel-{kernel}-")}
        for version in _listdir(root, base):
            if version.startswith("kernel-") or not os.path.lexists(root.resolve(f"{base}/{version}/source")):
                continue
            arches = _listdir(root, f"{base}/{version}/{kernel}")
            built = [a for a in arches if os.path.isdir(root.resolve(f"{base}/{version}/{kernel}/{a}/module"))]
            state = "added"
            if built:
                state = "installed" if any(f"kernel-{kernel}-{a}" in installed for a in built) else "built"
            log = None
            for candidate in ([f"{base}/{version}/{kernel}/{a}/log/make.log" for a in built]
                              if built else [f"{base}/{version}/build/make.log"]):
                if os.path.isfile(root.resolve(candidate)):
                    log = candidate
                    break
            error = None
            if log and state == "added":
                error = first_error(_read(root, log), f"{base}/{version}/build")
            out.append(Build(module, version, kernel, state, log, error))
    return out


def _read(root: Root, path: str) -> str:
    try:
        with open(root.resolve(path), "rb") as f:
            return f.read(_MAX_LOG).decode(errors="replace")
    except OSError:
        return ""


def why_not_built(root: Root, kernels: list[str]) -> tuple[str, str] | None:
    """Why DKMS left no nvidia module for ``kernels``: (reason, what to do), or None when the
    image has no nvidia DKMS source (the module comes from elsewhere, or from nothing)."""
    found = [b for k in kernels for b in builds(root, k)]
    unbuilt = [b for b in found if b.state == "added"]
    if not found or not unbuilt:
        return None
    first = unbuilt[0]
    reason = (f"DKMS {first.module}/{first.version} is not built for {first.kernel} "
              f"(dkms status: added)")
    if first.error:
        reason += f"; its build failed: {first.error} ({first.log})"
    elif first.log:
        reason += f"; its last build log is {first.log}"
    else:
        reason += "; no build was tried (no kernel headers for it?)"
    others = sorted({b.kernel for b in builds_elsewhere(root, first)} - set(kernels))
    if others:
        reason += f"; it is built for {', '.join(others)}"
    hint = (f"install a driver release whose module builds for kernel {first.kernel}, or the "
            f"kernel {first.module} {first.version} supports (with its headers), and rebuild the "
            "image; an image build must fail when the DKMS package fails to configure")
    return reason, hint


def builds_elsewhere(root: Root, build: Build) -> list[Build]:
    """The kernels under the DKMS tree for which ``build``'s module and version are built."""
    base = f"{DKMS_TREE}/{build.module}/{build.version}"
    return [Build(build.module, build.version, k, "built") for k in _listdir(root, base)
            if k not in ("source", "build") and any(
                os.path.isdir(root.resolve(f"{base}/{k}/{a}/module")) for a in _listdir(root, f"{base}/{k}"))]
