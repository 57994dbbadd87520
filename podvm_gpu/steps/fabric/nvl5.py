"""The NVLink 5 path's pieces before the fabric manager: the management port and NVLSM.

The order (NVIDIA/nvrc ``src/init.rs``/``src/daemon.rs``, the FM user guide's NVLink 5 chapter,
siderolabs/extensions#717 and #895):

1. the IB modules (``nvlink5.ib_modules``: mlx5_core, mlx5_ib, ib_umad) load in the ``modules``
   step (before ``modules.lock_after_boot`` may lock loading), so their devices register while
   persistenced starts;
2. :func:`find_port`: wait, bounded by ``nvlink5.ib_wait_s``, for an InfiniBand device on a
   management port (a ``SW_MNG`` function: only those; compute NICs sort first by name,
   siderolabs/extensions#893 shows the ports at mlx5_8-11 and NVRC's "first SM-enabled device of
   all" would take a NIC there) and for ``/dev/infiniband/umad*``; take the first such device by
   name whose port 1 ``cap_mask`` has IsSMDisabled (bit 10) clear (siderolabs#895, NVRC
   ``src/infiniband.rs``); its port GUID is the last 64 bits of ``ports/1/gids/0``;
3. :func:`start_nvlsm`: ``nvlsm -F <nvlink5.nvlsm_config_file> -g <GUID> -f stdout --pid_file
   /run/podvm-gpu/nvlsm.pid`` (``-F``, ``-g`` and ``-f stdout`` as NVRC ``spawn_nvlsm`` gives
   them; ``--pid_file`` as siderolabs's wrapper gives it; none checked against a real nvlsm,
   which this project never ran: docs/compatibility.md), in a unit of its own (``Type=exec``:
   it stays in the foreground) and ready when the socket it serves the fabric manager on,
   ``/run/nvidia-fabricmanager/fm_sm_ipc.socket``, accepts a connection *and* its pid file names
   a running nvlsm (the socket alone may be left from an earlier run; siderolabs waits for the
   same socket), bounded by ``nvlink5.nvlsm_ready_timeout_s``; NVLSM exiting before that fails
   with its own last lines;
4. then the fabricmanager step starts ``nv-fabricmanager -c <cfg> -g <GUID>`` and waits for
   every GPU's fabric Completed/Success as on NVSwitch boards (steps/fabric/step.py).
"""

from __future__ import annotations

import os
import time

from podvm_gpu.errors import CommandError, StepFailed, ended_text
from podvm_gpu.host import infiniband, kmod
from podvm_gpu.host.daemons import socket_answers
from podvm_gpu.readers import (
    FABRICMANAGER_COMM,
    FABRICMANAGER_PID,
    NVLSM_COMM,
    NVLSM_PID,
    daemon_pid,
    find_nvml,
    module_loaded,
    version_in,
)
from podvm_gpu.row import FAIL, PASS, SKIP, Check
from podvm_gpu.steps.fabric.fabric_kind import Fabric

FM_SM_SOCKET = "/run/nvidia-fabricmanager/fm_sm_ipc.socket"
NVLSM_LOG = "/run/podvm-gpu/nvlsm.log"
POLL_S = 0.05


def _names(devices) -> str:
    return ", ".join(f"{d.name} ({d.pci_address or 'no PCI parent'})" for d in devices[:6])


def find_port(ctx, fabric: Fabric) -> infiniband.IbDevice:
    """The IB device NVLSM and the fabric manager are given, once it and the umad nodes exist.

    Raises:
        StepFailed: no IB device on a management port, none with the subnet manager enabled,
            no GID, or no ``/dev/infiniband/umad*``, when ``nvlink5.ib_wait_s`` (cut to the
            budget) has passed; each names what was seen.
    """
    cfg = ctx.config.nvlink5
    dev_ib = ctx.root.resolve("/dev/infiniband")
    ports = set(fabric.port_addresses)
    devices: list = []
    candidates: list = []
    usable: list = []

    def look():
        nonlocal devices, candidates, usable
        devices = infiniband.ib_devices()
        candidates = [d for d in devices if d.pci_address in ports]
        usable = [d for d in candidates if d.sm_enabled and d.port_guid]
        return usable[0] if usable and infiniband.umad_nodes(dev_ib) else None

    found = ctx.wait(look, cfg.ib_wait_s, POLL_S)
    if found.held:
        return found.value
    waited = f"after {found.limit_s:g} s"
    where = ", ".join(sorted(ports))
    if not devices:
        raise StepFailed(f"no InfiniBand device in /sys/class/infiniband {waited} (mlx5_ib "
                         f"loaded; the management ports {where} registered none)")
    if not candidates:
        raise StepFailed(f"no InfiniBand device on the NVLink management ports ({where}) "
                         f"{waited}; /sys/class/infiniband has only {_names(devices)}")
    if not usable:
        raise StepFailed(f"no NVLink management port with the subnet manager enabled: "
                         f"{sm_said(candidates)}")
    raise StepFailed(f"no /dev/infiniband/umad* node {waited} (ib_umad loaded; the port "
                     f"{usable[0].name} is there): NVLSM cannot reach the switches")


def sm_said(candidates) -> str:
    """Why none of the IB devices on the management ports can carry NVLSM, one phrase each."""
    return "; ".join(
        f"{d.name} ({d.pci_address}): " + (
            "no port GUID in ports/1/gids/0" if d.sm_enabled else
            "cap_mask unreadable" if d.cap_mask is None else
            f"IsSMDisabled set (cap_mask 0x{d.cap_mask:08x})") for d in candidates)


def nvlsm_argv(ctx, guid: str) -> list[str]:
    """NVLSM's command line (the module docstring says where each flag comes from)."""
    conf = ctx.config.nvlink5.nvlsm_config_file
    conf = conf if ctx.root.is_host else ctx.root.resolve(conf)
    pid = NVLSM_PID if ctx.root.is_host else ctx.root.resolve(NVLSM_PID)
    return ["nvlsm", "-F", conf, "-g", guid, "-f", "stdout", "--pid_file", pid]


def start_nvlsm(ctx, guid: str):
    """Start NVLSM on ``guid`` unless one runs, and wait until it is ready; return
    ``(daemon or None, message)``.

    Raises:
        StepFailed: its config file or the program is missing, it could not be started, it
            exited before it was ready (its last lines), or the wait ran out.
    """
    root, cfg = ctx.root, ctx.config.nvlink5
    sock = root.resolve(FM_SM_SOCKET)

    def running():
        return daemon_pid(root, NVLSM_PID, NVLSM_COMM)

    pid = running()
    if pid is not None and socket_answers(sock):
        return None, f"NVLSM already running (pid {pid})"
    daemon = None
    if pid is None:
        if ctx.runner.which("nvlsm") is None:
            raise StepFailed(f"nvlsm not found: {ctx.runner.why_missing('nvlsm')} (NVLink 5 "
                             "boards need the nvlsm package of the driver's release)")
        if not root.exists(cfg.nvlsm_config_file):
            raise StepFailed(f"NVLSM's config {cfg.nvlsm_config_file} is missing (the nvlsm "
                             "package installs it)")
        try:
            daemon = ctx.start_daemon(nvlsm_argv(ctx, guid), NVLSM_LOG)
        except (CommandError, OSError) as err:
            raise StepFailed(f"cannot start nvlsm: {err}") from err
    started = time.monotonic()
    wait_s = cfg.nvlsm_ready_timeout_s

    def look() -> bool:
        if running() is not None and socket_answers(sock):
            return True
        code = daemon.exit_status() if daemon is not None else None
        if code is not None and running() is None:
            said = daemon.last_words()
            raise StepFailed(f"nvlsm {ended_text(code) if code else 'exited (status 0)'} "
                             f"before it was ready" + (f": {said}" if said else ""))
        return False

    waited = ctx.wait(look, wait_s, POLL_S)
    if waited.held:
        how = f"started ({daemon.where})" if daemon else f"running (pid {running()})"
        return daemon, (f"NVLSM {how} on port GUID {guid}, ready in "
                        f"{time.monotonic() - started:.2f} s")
    cut = " (cut to the boot budget)" if waited.limit_s < wait_s else ""
    have = "its pid file names no running nvlsm" if running() is None else \
        f"{FM_SM_SOCKET} does not answer"
    raise StepFailed(f"timed out after {waited.limit_s:g} s waiting for NVLSM to be ready "
                     f"(nvlink5.nvlsm_ready_timeout_s{cut}): {have}; left running")


def nvlsm_alive(root) -> int | None:
    """NVLSM's pid when its pid file names a running nvlsm (check, metrics)."""
    return daemon_pid(root, NVLSM_PID, NVLSM_COMM)


def fm_sm_socket_present(root) -> bool:
    return os.path.exists(root.resolve(FM_SM_SOCKET))


# --- podvm-gpu check (steps/fabric/step.py's rows) ----------------------------------------------

def daemon_unit(root, pid: int) -> str | None:
    """The systemd unit a process runs in: the last ``*.service`` of its cgroup v2 path
    (``0::/system.slice/podvm-gpu-nvlsm.service``, ``/proc/<pid>/cgroup``); None when unknown."""
    for line in (root.read_text(f"/proc/{pid}/cgroup") or "").splitlines():
        if line.startswith("0::"):
            units = [p for p in line[3:].split("/") if p.endswith(".service")]
            return units[-1] if units else None
    return None


def _alive(root, name: str, pid: int) -> str:
    unit = daemon_unit(root, pid)
    return f"{name} running (pid {pid}" + (f", unit {unit})" if unit else ")")


def diagnose(root, config, fabric: Fabric, booted: dict | None) -> tuple[list[str], list[str]]:
    """What a running NVLink 5 VM has of the path (module docstring) and what it lacks, as
    ``(found, problems)`` phrases, read as the boot reads them (host/infiniband.py) but without
    touching anything: NVLSM's socket is looked at, never connected to.

    Args:
        root: the VM's root; config: the config in force (``nvlink5``).
        fabric: the kind found on PCI now (``nvlink5``).
        booted: status.json's ``fabric`` object of the last boot, or None (its ``port_guid``
            is the GUID NVLSM was given).
    """
    found = [f"management port(s) {', '.join(p.describe() for p in fabric.ports)}"]
    problems = []
    modules = tuple(config.nvlink5.ib_modules)
    missing = [m for m in modules if not module_loaded(root, m)]
    if missing:
        problems.append(f"IB module(s) not loaded: {', '.join(missing)}")
    else:
        found.append(f"IB modules {', '.join(modules)} loaded")
    devices = infiniband.ib_devices()
    ports = set(fabric.port_addresses)
    candidates = [d for d in devices if d.pci_address in ports]
    usable = [d for d in candidates if d.sm_enabled and d.port_guid]
    if not devices:
        problems.append("no InfiniBand device in /sys/class/infiniband")
    elif not candidates:
        problems.append(f"no InfiniBand device on the management ports; /sys/class/infiniband "
                        f"has only {_names(devices)}")
    elif not usable:
        problems.append(f"no management port with the subnet manager enabled: "
                        f"{sm_said(candidates)}")
    else:
        port = usable[0]
        found.append(f"port {port.name} ({port.pci_address}), GUID {port.port_guid}, subnet "
                     "manager enabled")
        given = (booted or {}).get("port_guid")
        if given and given != port.port_guid:
            problems.append(f"NVLSM was given GUID {given} at boot, but the first management "
                            f"port with the subnet manager enabled is now {port.name} "
                            f"({port.port_guid})")
    umad = infiniband.umad_nodes(root.resolve("/dev/infiniband"))
    if umad:
        found.append(f"{len(umad)} /dev/infiniband/umad* node(s)")
    else:
        problems.append("no /dev/infiniband/umad* node (ib_umad's)")
    pid = nvlsm_alive(root)
    if pid is None:
        problems.append(f"NVLSM is not running ({NVLSM_PID} names no live nvlsm)")
    elif not fm_sm_socket_present(root):
        problems.append(f"NVLSM runs (pid {pid}) but has no {FM_SM_SOCKET}")
    else:
        found.append(_alive(root, "NVLSM", pid) + f", {FM_SM_SOCKET} present")
    fm = daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM)
    found.append(_alive(root, "nv-fabricmanager", fm) if fm else
                 "nv-fabricmanager not running (see the fabricmanager row)")
    return found, problems


def fm_package_version(root) -> str | None:
    """The version of the fabric manager package installed in an image root, from dpkg's
    database (``/var/lib/dpkg/status``: NVIDIA's CUDA repository names it
    ``nvidia-fabricmanager-<branch>``, newer releases ``nvidia-fabricmanager``); None when no
    such package is installed or the image has no dpkg database."""
    for block in (root.read_text("/var/lib/dpkg/status") or "").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if fields.get("Package", "").startswith("nvidia-fabricmanager") and \
                fields.get("Status", "").endswith(" installed"):
            return version_in(fields.get("Version", ""))
    return None


def image_lacks(image) -> tuple[list[str], list[str]]:
    """What an image has and lacks for NVLink 5 VMs, as ``(have, lacks)`` phrases: the IB
    modules (``nvlink5.ib_modules``) for every kernel, as ``modprobe`` would find them
    (kmod.resolve); nvlsm where boot would run it and its config file; nv-fabricmanager of the
    user-space driver's version (``nv-fabricmanager --version`` on the root ``/``, else the
    dpkg package's version: :func:`fm_package_version`).

    Args:
        image: a :class:`podvm_gpu.check.image.Image` (``tool(name)``: where boot finds it).
    """
    root, cfg = image.root, image.config.nvlink5
    have, lacks = [], []
    for kernel in image.kernels:
        gone = [m for m in cfg.ib_modules
                if not kmod.resolve(root, kernel, m, image.runner).found]
        if gone:
            lacks.append(f"IB module(s) {', '.join(gone)} for kernel {kernel}")
    if not image.kernels:
        lacks.append("a kernel with the IB modules (no /boot/vmlinuz-*, no /lib/modules/*)")
    elif not lacks:
        have.append(f"IB modules {', '.join(cfg.ib_modules)} for {len(image.kernels)} kernel(s)")
    nvlsm = image.tool("nvlsm")
    if nvlsm is None:
        lacks.append("nvlsm (the nvlsm package of the driver's release)")
    elif not root.exists(cfg.nvlsm_config_file):
        lacks.append(f"NVLSM's config {cfg.nvlsm_config_file}")
    else:
        have.append(f"nvlsm at {nvlsm} and {cfg.nvlsm_config_file}")
    lib = find_nvml(root)
    driver = lib.version if lib is not None else None
    fm = image.tool("nv-fabricmanager")
    if fm is None:
        lacks.append(f"nv-fabricmanager (the fabric manager of driver {driver})" if driver else
                     "nv-fabricmanager (the fabric manager of the user-space driver's release; "
                     "the image has no libnvidia-ml.so.1 to tell which)")
        return have, lacks
    version = None
    if root.is_host:
        version = version_in(image.runner.run(["nv-fabricmanager", "--version"],
                                              check=False).output)
    version = version or fm_package_version(root)
    if version is None:
        lacks.append("a fabric manager whose version can be told (no nv-fabricmanager "
                     "--version here, no nvidia-fabricmanager package in dpkg's database)")
    elif driver and version != driver:
        lacks.append(f"the fabric manager of driver {driver} (nv-fabricmanager is {version})")
    else:
        have.append(f"nv-fabricmanager {version}" + (" = the driver's" if driver else ""))
    return have, lacks


def fabric_image_row(image) -> Check:
    """What the image lacks for NVLink 5 VMs (HGX B200/B300; :func:`image_lacks`): ``fail``
    when the config's ``nvlink5.image_serves`` says the image serves them; otherwise ``skip``
    naming what it lacks: a ``warn`` whose only advice is "nothing to do" made every default
    image end with a warning (issue 35 item 9)."""
    have, lacks = image_lacks(image)
    if not lacks:
        return Check("fabric", PASS, f"NVLink 5: {'; '.join(have)}")
    install = "install the IB modules for every kernel, nvlsm and the fabric manager of the " \
        "driver's release"
    if image.config.nvlink5.image_serves:
        return Check("fabric", FAIL, f"for NVLink 5 VMs the image lacks: {'; '.join(lacks)} "
                     "(nvlink5.image_serves is true)", install)
    return Check("fabric", SKIP, f"for NVLink 5 VMs the image lacks: {'; '.join(lacks)} (not "
                 "required: nvlink5.image_serves is false, and only NVLink 5 VMs need them)",
                 f"for an image that serves NVLink 5 VMs (HGX B200/B300), {install}, and set "
                 "nvlink5.image_serves: true so that this row fails until it has them")
