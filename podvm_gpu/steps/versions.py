"""Step 4, ``versions``: the kernel module's version must equal the user-space driver's, and on
NVSwitch machines the fabric manager's.

The user-space version is the one in the name of the file ``libnvidia-ml.so.1`` resolves to
(``libnvidia-ml.so.550.54.15``), found where the dynamic loader looks. A mismatch makes every
NVML client fail with "Driver/library version mismatch", so it is caught here, before any.
The fabric manager refuses to run with another driver version; ``nv-fabricmanager --version``
touches no GPU, so that comparison is made here too, before persistenced starts initialising
GPUs for a boot that cannot succeed (field case C23).
"""

from __future__ import annotations

from podvm_gpu import readers
from podvm_gpu.errors import CommandError, StepFailed, exit_text
from podvm_gpu.host import kmod
from podvm_gpu.readers import (
    FABRICMANAGER_COMM,
    FABRICMANAGER_PID,
    NVML_SONAME,
    daemon_pid,
    find_nvml,
    find_nvml_elsewhere,
    kernel_module_version,
    version_in,
)
from podvm_gpu.row import FAIL, PASS, SKIP, Check
from podvm_gpu.steps.context import BootContext


def fabricmanager_version(ctx: BootContext) -> str:
    """The version ``nv-fabricmanager --version`` prints (a call of at most 10 s).

    Raises:
        StepFailed: the fabric manager is missing, hangs, fails or prints no version: an
            NVSwitch VM cannot get its fabric without it, and a check left out is a guess.
    """
    try:
        done = ctx.runner.run(["nv-fabricmanager", "--version"],
                              timeout=ctx.harmless_timeout("nv-fabricmanager"))
    except CommandError as err:
        if err.returncode is None and not err.timed_out:
            raise StepFailed(f"{err}: an NVSwitch VM needs the fabric manager of driver "
                             f"{ctx.driver_version}") from err
        said = "timed out" if err.timed_out else f"{exit_text(err.returncode)}: " \
            f"{err.last_line() or 'no output'}"
        raise StepFailed(f"cannot tell the fabric manager's version (nv-fabricmanager --version "
                         f"{said})") from err
    version = version_in(done.output)
    if version is None:
        said = " ".join(done.output.split())[:200] or "nothing"
        raise StepFailed(f"cannot tell the fabric manager's version: nv-fabricmanager --version "
                         f"printed {said!r}")
    return version


def run(ctx: BootContext) -> str:
    """Compare the versions and record the driver version in the status.

    Raises:
        StepFailed: the module version is unknown, libnvidia-ml.so.1 is not where the loader
            looks (naming where it was found instead), or the versions differ (naming both).
    """
    kernel = kernel_module_version(ctx.root)
    if not kernel:
        raise StepFailed("cannot read the nvidia kernel module version "
                         "(/sys/module/nvidia/version, /proc/driver/nvidia/version)")
    ctx.driver_version = ctx.status.driver_version = kernel
    lib = find_nvml(ctx.root)
    if lib is None:
        elsewhere = find_nvml_elsewhere(ctx.root)
        if elsewhere:
            folder = elsewhere.path.rsplit("/", 1)[0]
            raise StepFailed(f"{NVML_SONAME} is not in the loader's directories (ld.so.conf and "
                             f"the default ones) but was found in {folder} ({elsewhere.target}); "
                             f"add {folder} to /etc/ld.so.conf.d/ and run ldconfig in the image")
        raise StepFailed(f"{NVML_SONAME} not found: the user-space driver {kernel} is not "
                         "installed in the image")
    if lib.version is None:
        raise StepFailed(f"cannot tell the user-space driver version: {lib.path} resolves to "
                         f"{lib.target}")
    if lib.version != kernel:
        raise StepFailed(f"kernel module {kernel} does not match user-space driver {lib.version} "
                         f"({lib.path} -> {lib.target}); rebuild the image with matching driver "
                         "packages")
    fm = ""
    if _fabric_managed_here(ctx) and \
            daemon_pid(ctx.root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        fm_version = fabricmanager_version(ctx)
        if fm_version != kernel:
            raise StepFailed(f"fabric manager (nv-fabricmanager) {fm_version} does not match "
                             f"driver {kernel}; install the fabric manager package of driver "
                             f"{kernel}")
        fm = f", nv-fabricmanager {fm_version}"
    return f"driver {kernel} (kernel module and {lib.path}{fm})"


def _fabric_managed_here(ctx: BootContext) -> bool:
    """The VM runs its own fabric manager: NVSwitch functions, or NVLink 5 management ports
    (the FM user guide: FM, NVLSM and the driver are of one release)."""
    fabric = getattr(ctx, "fabric", None)
    if fabric is None:
        return bool(ctx.nvswitches)
    return fabric.kind in ("nvswitch", "nvlink5")


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the fabric manager's version query, on NVSwitch and NVLink 5 VMs."""
    if _fabric_managed_here(ctx) and \
            daemon_pid(ctx.root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        return [["nv-fabricmanager", "--version"]]
    return []


# --- podvm-gpu check ----------------------------------------------------------------------

def versions_row(facts) -> Check:
    skip = facts.not_reached("versions") or facts.needs_driver("versions")
    if skip:
        return skip
    kernel = readers.kernel_module_version(facts.root)
    lib = readers.find_nvml(facts.root)
    if lib is None:
        other = readers.find_nvml_elsewhere(facts.root)
        where = f"; found in {other.path.rsplit('/', 1)[0]}" if other else ""
        return Check("versions", FAIL, f"{readers.NVML_SONAME} not in the loader's "
                     f"directories{where}", "add its folder to /etc/ld.so.conf.d/ and run "
                     "ldconfig in the image" if other else "install the user-space driver")
    if lib.version != kernel:
        return Check("versions", FAIL, f"kernel module {kernel}, user space {lib.version} "
                     f"({lib.path} -> {lib.target})",
                     f"rebuild the image with matching driver {kernel} user space")
    return Check("versions", PASS, f"kernel module and user space both {kernel}")


VM_ROWS = {"versions": versions_row}


def module_file_version(runner, path: str) -> str | None:
    """A module file's version: ``modinfo -F version FILE`` (``runner``: a read-only
    :class:`podvm_gpu.host.proc.Runner`), else the ``version=`` string of its ``.modinfo``
    section read from the file itself (plain, .xz or .gz; kmod.modinfo_fields)."""
    values = kmod.modinfo(runner, path, "version")
    return readers.version_in(values[0]) if values else None


def versions_image_row(image) -> Check:
    """The nvidia module of every kernel and the user-space driver (NVML) have one version."""
    root, runner = image.root, image.runner
    lib = readers.find_nvml(root)
    files = kmod.present_files(root, image.found)
    module_versions = {k: module_file_version(runner, root.resolve(f)) for k, f in files.items()}
    if lib is None:
        return Check("versions", FAIL, f"{readers.NVML_SONAME} not in the loader's directories",
                     "install the user-space driver (libnvidia-ml) in the image")
    if not files:  # nothing compared: not a pass; the modules row fails for the cause
        return Check("versions", SKIP, "no nvidia module in the image to read a version from "
                     "(see modules)", "fix the modules row first")
    wrong = {k: v for k, v in module_versions.items() if v != lib.version}
    if wrong:
        k, v = next(iter(wrong.items()))
        if v:
            return Check("versions", FAIL, f"module {files[k]} is {v}, "
                         f"user space {lib.path} is {lib.version}",
                         f"rebuild the image with matching driver {lib.version} modules")
        return Check("versions", FAIL, f"cannot read the version of module {files[k]} "
                     f"(user space {lib.path} is {lib.version})", kmod.UNREADABLE_MODULE_HINT)
    return Check("versions", PASS, f"modules and user space all {lib.version}")


IMAGE_ROWS = {"versions": versions_image_row}
