"""Step 7, ``fabricmanager``: the VM's NVLink fabric, by its kind (podvm_gpu/steps/fabric/fabric_kind.py).

- ``nvswitch``: start nv-fabricmanager and wait, bounded, until every GPU reports fabric State
  Completed with Status Success.
- ``nvlink5``: find the management port, start NVLSM and wait for it (podvm_gpu/steps/fabric/nvl5.py), then
  start nv-fabricmanager with the port's GUID (``-g``) and wait as above. Each part is recorded
  in status.json's ``fabric.steps``.
- ``none``: the fabric manager is never started; if the GPUs still report a fabric state other
  than not-supported (shared-NVSwitch virtualization: the fabric is managed outside the VM), the
  same wait applies.
- ``mixed``: fails (NVRC ``src/mode.rs`` refuses it as an unexpected topology).

Before the fabric manager of ``nvswitch`` or ``nvlink5`` starts, a module loaded with
``NVreg_ModifyDeviceFiles=0`` fails the step (podvm_gpu/steps/fabric/params.py, issue 36).

The state comes from ``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status
--format=csv,noheader`` (gpufacts/smi.py fabric_argv; NVIDIA's real 535 to 555 builds refuse ``-q -d
FABRIC``: ``Failed to parse --display/-d flags``, exit 2, nvidia-smi-real.md), whose rows are
also the GPUs NVML enumerates: fewer than PCI has fails the step (siderolabs/talos#14015, where
NVML saw 0 of 4 passed-through A100s and nvidia-ctk later said only "empty device edits"); a
query that gets no answer proves nothing and is not counted. A GPU lost (exit 15 naming it, or
``[GPU is lost]`` in its row) fails the step naming it; so do the other exit statuses that say
the driver cannot answer (gpufacts/words.py NVSMI_BROKEN).

The fabric manager gets ``-c`` with a copy of the stock fabricmanager.cfg under /run with the keys
the role needs (fabric_kind.fm_keys: FABRIC_MODE=0, PARTITION_RAIL_POLICY greedy on NVLink 4,
symmetric on NVLink 5; NVRC ``src/daemon.rs``), read-only; an operator's own
``fabricmanager.config_file`` (any other path than the stock one) is given as it is.
"""

from __future__ import annotations

import time

from podvm_gpu import readers, units
from podvm_gpu.errors import CommandError, StepFailed, ended_text
from podvm_gpu.gpufacts import ask, judge, smi, words
from podvm_gpu.gpufacts.smi import FabricState, summarize
from podvm_gpu.gpufacts.words import bus_id
from podvm_gpu.host.daemons import Daemon
from podvm_gpu.host.fs import atomic_write, ensure_dir
from podvm_gpu.readers import FABRICMANAGER_COMM, FABRICMANAGER_PID, daemon_pid
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, WARN, Check
from podvm_gpu.steps import Skipped
from podvm_gpu.steps.context import BootContext
from podvm_gpu.steps.fabric import fabric_kind, nvl5, params
from podvm_gpu.steps.fabric.fm_watch import FmWatch
from podvm_gpu.steps.fabric.parse import health_summary, summary_row

LOG_PATH = "/run/podvm-gpu/nv-fabricmanager.log"


# check's fix for a fabric query that gave no rows: the query as one types it
BY_HAND = "run " + " ".join(smi.fabric_argv()).replace(",noheader", "") + " by hand"
NO_DEVICES = "No devices were found"  # nvidia-smi's words, exit 6 (words.NVSMI_NOT_FOUND_RC), when NVML lists no GPU


def nvml_bus_ids(states: list[FabricState] | None) -> set[str] | None:
    """The GPUs the fabric query's rows list, as :func:`bus_id` gives them: the GPUs NVML
    enumerates. None when there is no answer: garbage or an empty answer is no evidence that
    NVML sees fewer GPUs (issue 16: "a query nobody answers is not evidence")."""
    if states is None:
        return None
    return {bus_id(s.gpu) for s in states if not s.lost}


def lost_text(ctx: BootContext, states: list[FabricState]) -> str:
    """``GPU lost: ...`` for rows of ``[GPU is lost]``, naming the PCI GPUs no row answered for."""
    answered = {bus_id(s.gpu) for s in states if not s.lost}
    silent = [g.pci_address for g in ctx.gpus if bus_id(g.pci_address) not in answered]
    lost = sum(s.lost for s in states)
    return (f"{lost} GPU(s) lost (nvidia-smi printed {words.GPU_LOST} for "
            f"{'it' if lost == 1 else 'them'}; not answering: {', '.join(silent) or 'unknown'}): "
            "the GPU fell off the bus or needs a reset; reboot the VM or ask for another host")


def query(ctx: BootContext, timeout: float | None = None) -> list[FabricState]:
    """Every GPU's fabric state (one :func:`~podvm_gpu.gpufacts.smi.fabric_argv` call,
    gpufacts/ask.py ``fabric_states``); the GPUs it lists are kept in ``ctx.nvml_seen`` (an
    empty set when nvidia-smi says it found no device).

    Raises:
        StepFailed: a GPU is lost (exit 15 naming its bus id, or rows of ``[GPU is lost]``),
            or another status of words.NVSMI_BROKEN.
        CommandError: nvidia-smi failed otherwise, timed out, or printed no rows (also for "No
            devices were found").
    """
    try:
        states = ask.fabric_states(ctx.runner, timeout)
    except CommandError as err:
        if err.returncode == words.NVSMI_NOT_FOUND_RC and NO_DEVICES in err.stdout + err.stderr:
            ctx.nvml_seen = set()
        broken = words.broken(err.returncode, err.stdout + err.stderr)
        if broken:
            raise StepFailed(broken) from err
        raise
    if any(s.lost for s in states):
        raise StepFailed(lost_text(ctx, states))
    ctx.nvml_seen = nvml_bus_ids(states)
    return states


def nvml_count(ctx: BootContext, states: list[FabricState]) -> None:
    """Fail when the last answered query listed fewer GPUs than PCI has.

    Raises:
        StepFailed: both counts, the PCI addresses NVML does not list, the fabric state of the
            others (the pipeline adds what the kernel log says).
    """
    seen = ctx.nvml_seen
    if seen is None:
        return
    missing = [g.pci_address for g in ctx.gpus if bus_id(g.pci_address) not in seen]
    if not missing:
        return
    few = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
    fabric = summarize(states) if states else "no fabric state reported"
    # issue 46: GPUs the driver attached but NVML does not list: a driver an early client
    # re-initialised (gpufacts/early_client.py), not a GPU the driver could not take
    from podvm_gpu.gpufacts.early_client import fewer_in_nvml

    reinit = fewer_in_nvml(ctx.root, seen, "the fabric query") if seen else None
    raise StepFailed(f"NVML sees {ctx.gpu_count - len(missing)} of the {ctx.gpu_count} GPU(s) "
                     f"on PCI; not seen: {few}; fabric: {fabric}" + (f"; {reinit}" if reinit else ""))


def seen(ctx: BootContext, states: list[FabricState]) -> str:
    """The last fabric state seen, for a reason: the pairs, and the GPUs that did not report."""
    if not states:
        return "no fabric state reported"
    reported = {bus_id(s.gpu) for s in states}
    silent = [g.pci_address for g in ctx.gpus if bus_id(g.pci_address) not in reported]
    text = summarize(states)
    if silent:
        text += f"; {len(silent)} of {ctx.gpu_count} GPU(s) reported no state ({', '.join(silent[:4])}" \
                + (", ..." if len(silent) > 4 else "") + ")"
    return text


def wait_for_fabric(ctx: BootContext, daemon: Daemon | None,
                    nvlsm: Daemon | None = None, pid: int | None = None) -> list[FabricState]:
    """Poll the fabric state until every GPU of the VM reports Completed/Success; fail at once
    when a GPU is Completed with another status (unhealthy), the fabric manager is gone
    (:class:`FmWatch`: exited with an error, or its daemon died or never ran) or nvidia-smi
    cannot run at all. Every failure says the last state seen.

    Args:
        daemon: the fabric manager the boot started; pid: one found running instead.

    Raises:
        StepFailed: see above, or the wait (``ready_timeout_s + per_gpu_s * GPUs``, cut to the
            budget) ran out.
    """
    cfg = ctx.config.fabricmanager
    wanted = cfg.ready_timeout_s + cfg.per_gpu_s * ctx.gpu_count
    states: list[FabricState] = []
    failed_query: CommandError | None = None  # the last query's failure, when it failed
    counted = False
    watch = FmWatch(ctx.root, daemon, pid)
    nvl5_vm = ctx.fabric is not None and ctx.fabric.kind == fabric_kind.NVLINK5
    since = {"said": "", "at": time.monotonic()}

    def note() -> None:
        """The state last seen and since when, for the pipeline when the budget ends the wait."""
        said = seen(ctx, states)
        if said != since["said"]:
            since.update(said=said, at=time.monotonic())
        ctx.last_seen["fabricmanager"] = f"{said} for {time.monotonic() - since['at']:.1f} s"

    note()

    def look() -> bool:
        nonlocal states, failed_query, counted
        failed_query = None
        try:
            states = query(ctx)
            note()
            if not counted:
                nvml_count(ctx, states)
                counted = True
        except CommandError as err:
            note()  # how long the last state has stood, up to this failed query
            if ctx.nvml_seen == set():
                nvml_count(ctx, [])
            no_driver = words.no_driver(err.returncode, err.stdout + err.stderr)
            if no_driver:
                raise StepFailed(no_driver) from err
            if err.returncode is None and not err.timed_out:  # not there, cannot run
                raise StepFailed(f"cannot query the NVLink fabric: {err}") from err
            if err.timed_out:
                raise StepFailed(f"nvidia-smi fabric query failed: {err}; last seen: "
                                 f"{seen(ctx, states)}") from err
            failed_query = err  # asked again until the wait ends
        _, unhealthy, ready = judge.fabric_state(states, [g.pci_address for g in ctx.gpus])
        if ready:
            return True
        if unhealthy:
            raise StepFailed(f"fabric unhealthy: {summarize(unhealthy)}")
        watch.check(seen(ctx, states))  # issue 28: exited, died, or never ran
        if nvl5_vm and nvl5.nvlsm_alive(ctx.root) is None:
            code = nvlsm.exit_status() if nvlsm is not None else None
            said = nvlsm.last_words() if nvlsm is not None else ""
            how = ended_text(code) if code else "is no longer running"
            raise StepFailed(f"NVLSM {how} during the fabric wait" + (f": {said}" if said else "")
                             + f"; last seen: {seen(ctx, states)}")
        return False

    waited = ctx.wait(look, wanted, cfg.poll_s)
    if waited.held:
        return states
    if failed_query is not None:
        raise StepFailed(f"nvidia-smi fabric query failed: {failed_query}; last seen: "
                         f"{seen(ctx, states)}") from failed_query
    limit = waited.limit_s
    cut = " (cut to the boot budget)" if limit < wanted else ""
    raise StepFailed(f"timed out after {limit:g} s waiting for the NVLink fabric "
                     f"(wait {cfg.ready_timeout_s:g} s + {cfg.per_gpu_s:g} s x "
                     f"{ctx.gpu_count} GPU(s){cut}): {seen(ctx, states)}")


def fm_config(ctx: BootContext, write: bool = True) -> str | None:
    """The config file nv-fabricmanager gets with ``-c`` (its path as the daemon sees it), or
    None (the daemon's built-in defaults: no stock file in the image).

    An operator's ``fabricmanager.config_file`` (any path but the stock one) is used as it is,
    when it exists. Otherwise the stock file is copied to /run/podvm-gpu/fabricmanager.cfg with
    :func:`podvm_gpu.steps.fabric.fabric_kind.fm_keys` set, mode 0400 (``write=False``: the path only, for
    ``boot --dry-run``).

    Raises:
        OSError: the copy cannot be written.
    """
    root = ctx.root
    chosen = ctx.config.fabricmanager.config_file

    def seen_as(path: str) -> str:
        return path if root.is_host else root.resolve(path)

    if chosen != fabric_kind.STOCK_FM_CONFIG:
        return seen_as(chosen) if root.exists(chosen) else None
    stock = root.read_text(fabric_kind.STOCK_FM_CONFIG)
    if stock is None:
        return None
    if write:
        kind = ctx.fabric.kind if ctx.fabric is not None else fabric_kind.NVSWITCH
        path = root.resolve(fabric_kind.RUN_FM_CONFIG, follow_last=False)
        ensure_dir(root.resolve("/run/podvm-gpu"))
        atomic_write(path, fabric_kind.set_keys(stock, fabric_kind.fm_keys(kind)), mode=0o400)
    return seen_as(fabric_kind.RUN_FM_CONFIG)


def fabricmanager_argv(ctx: BootContext, write: bool = True) -> list[str]:
    """``nv-fabricmanager [-c CONFIG] [-g GUID]``: :func:`fm_config`; on NVLink 5 the port GUID
    NVLSM runs on (NVRC ``spawn_fabricmanager``; bottlerocket-kernel-kit#142 shows the real
    daemon so: ``nv-fabricmanager -c /etc/nvidia/fabricmanager.cfg -g 0xe09d...``)."""
    argv = ["nv-fabricmanager"]
    path = fm_config(ctx, write)
    if path:
        argv += ["-c", path]
    guid = ctx.fabric.guid if ctx.fabric is not None else None
    if guid:
        argv += ["-g", guid]
    return argv


def probe_outside(ctx: BootContext) -> str:
    """No fabric in the VM: the GPUs' fabric state may still be managed outside it."""
    try:  # a probe: the fabric may be managed outside the VM (shared-NVSwitch)
        states = query(ctx, timeout=ctx.harmless_timeout("nvidia-smi"))
    except CommandError as err:
        no_driver = words.no_driver(err.returncode, err.stdout + err.stderr)
        if no_driver:  # the loaded driver does not answer: every later client fails too
            raise StepFailed(no_driver) from err
        if ctx.nvml_seen == set():
            nvml_count(ctx, [])
        if err.budget_spent:
            raise StepFailed(f"timed out: the boot budget was spent in {err}") from err
        raise Skipped(f"no NVSwitch; fabric state unknown ({err})") from err
    nvml_count(ctx, states)
    if not any(s.supported for s in states):
        raise Skipped("no NVSwitch, and the GPUs report no NVLink fabric")
    wait_for_fabric(ctx, None)
    return f"no NVSwitch in the VM; fabric managed outside it: {summarize(states)} -> ready; " \
        f"{health_summary(ctx)}"


def _part(ctx: BootContext, name: str, func):
    """Run one part of the NVLink 5 path and record it in ``fabric.steps``."""
    t0 = time.monotonic()
    try:
        value = func()
    except StepFailed as err:
        ctx.fabric.record(name, "failed", str(err), time.monotonic() - t0)
        raise
    return value, time.monotonic() - t0


def run(ctx: BootContext) -> str:
    """Start what the VM's fabric kind needs and wait for the fabric."""
    root = ctx.root
    fabric = ctx.fabric or fabric_kind.detect([s.pci_address for s in ctx.nvswitches],
                                              gpus=ctx.gpus)
    ctx.fabric = fabric
    if fabric.kind == fabric_kind.MIXED:
        raise StepFailed(f"mixed fabric topology: {fabric.why()}; a VM has NVSwitch functions "
                         "or ConnectX NVLink management ports, never both (NVRC refuses it too)")
    if fabric.kind == fabric_kind.NONE:
        return probe_outside(ctx)
    if fabric.kind == fabric_kind.RACK:  # issue 28: the rack runs the fabric; never start an FM
        said = probe_outside(ctx).replace("no NVSwitch in the VM; fabric managed outside it",
                                          "rack-scale NVLink (the rack manages the fabric)")
        return f"{said}; {fabric_kind.rack_cliques(ctx, fabric)}"
    params.refuse_without_device_files(root, f"{len(ctx.nvswitches)} NVSwitch(es)" if
                                       fabric.kind == fabric_kind.NVSWITCH else "NVLink 5")
    nvlsm_daemon, parts = None, []
    if fabric.kind == fabric_kind.NVLINK5:
        port, took = _part(ctx, "management-port", lambda: nvl5.find_port(ctx, fabric))
        fabric.port, fabric.guid = port.name, port.port_guid
        said = (f"{port.name} ({port.pci_address}), port GUID {port.port_guid}, subnet manager "
                f"enabled; {len(nvl5.infiniband.umad_nodes(root.resolve('/dev/infiniband')))} "
                "umad node(s)")
        fabric.record("management-port", "ok", said, took)
        (nvlsm_daemon, said), took = _part(ctx, "nvlsm",
                                           lambda: nvl5.start_nvlsm(ctx, port.port_guid))
        fabric.record("nvlsm", "ok", said, took)
        parts = [f"port {port.name} GUID {port.port_guid}", said]
    pid = daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM)
    daemon = None
    if pid is None:
        daemon = ctx.start_daemon(fabricmanager_argv(ctx), LOG_PATH)
    started = time.monotonic()
    how = f"started ({daemon.where})" if daemon is not None else f"already running (pid {pid})"
    if fabric.kind == fabric_kind.NVLINK5:
        fabric.record("fabricmanager", "ok", f"nv-fabricmanager {how}", 0.0)
        states, took = _part(ctx, "fabric", lambda: wait_for_fabric(ctx, daemon, nvlsm_daemon, pid))
        fabric.record("fabric", "ok", f"Completed/Success on {len(states)} GPU(s)", took)
        return (f"NVLink 5: {'; '.join(parts)}; fabric manager {how}; fabric Completed/Success "
                f"on {len(states)} GPU(s) in {time.monotonic() - started:.2f} s; "
                f"{health_summary(ctx)}")
    states = wait_for_fabric(ctx, daemon, pid=pid)
    return (f"{how}; {len(ctx.nvswitches)} NVSwitch(es); fabric Completed/Success on "
            f"{len(states)} GPU(s) in {time.monotonic() - started:.2f} s; {health_summary(ctx)}")


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: NVLSM (its GUID is known only at boot: ``<port GUID>``) and the
    fabric manager where the kind needs them, then the fabric query."""
    argvs = []
    kind = fabric_kind.kind_of(ctx.fabric, ctx.nvswitches)
    if kind == fabric_kind.NVLINK5 and nvl5.nvlsm_alive(ctx.root) is None:
        argvs.append(nvl5.nvlsm_argv(ctx, "<port GUID>"))
    if kind in (fabric_kind.NVSWITCH, fabric_kind.NVLINK5) and \
            daemon_pid(ctx.root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        argv = fabricmanager_argv(ctx, write=False)
        argvs.append(argv + (["-g", "<port GUID>"] if kind == fabric_kind.NVLINK5 else []))
    return [*argvs, smi.fabric_argv(), smi.fabric_health_argv(), smi.fabric_detail_argv()]


# --- podvm-gpu check ----------------------------------------------------------------------

def fabricmanager_row(facts) -> Check:
    """The fabric manager of a VM whose fabric kind runs one (``nvswitch``, ``nvlink5``): its
    version equals the driver's (checked even when the last boot never reached the step: a
    property of the image), it runs, every GPU's fabric is Completed/Success. Kind ``none``:
    the state of a fabric managed outside the VM, if the GPUs report one; ``mixed``: the
    fabric row fails it."""
    kind = fabric_kind.kind_of(facts.fabric, facts.nvswitches)
    managed_here = kind in (fabric_kind.NVSWITCH, fabric_kind.NVLINK5)
    if not managed_here:
        skip = facts.not_reached("fabricmanager")
        if skip:
            return skip
    skip = facts.needs_driver("fabricmanager")
    if skip:
        return skip
    if kind == fabric_kind.MIXED:
        return Check("fabricmanager", SKIP, "mixed fabric topology: no fabric manager is "
                     "started (see fabric)")
    if not managed_here:
        return _outside_row(facts)
    driver = readers.kernel_module_version(facts.root)
    done = facts.runner.run(["nv-fabricmanager", "--version"], check=False)
    fm = readers.version_in(done.output)
    if fm and driver and fm != driver:
        return Check("fabricmanager", FAIL, f"fabric manager {fm}, driver {driver}",
                     f"install the fabric manager package of driver {driver}")
    if facts.failed_before("fabricmanager"):
        return Check("fabricmanager", SKIP, f"fabric manager {fm or '(version unknown)'}; not "
                     f"started: the last boot failed at {facts.failed_at} (see status)")
    pid = readers.daemon_pid(facts.root, readers.FABRICMANAGER_PID, readers.FABRICMANAGER_COMM)
    what = f"{len(facts.nvswitches)} NVSwitch(es)" if kind == fabric_kind.NVSWITCH else \
        "NVLink 5 management ports"
    if pid is None:
        return Check("fabricmanager", FAIL, f"{what} but nv-fabricmanager is not running",
                     "see the fabricmanager step in podvm-gpu status and "
                     "/var/log/fabricmanager.log")
    states, done = ask.fabric_rows(facts.runner)
    if states is None:
        return Check("fabricmanager", FAIL, f"fabric state not read: {ask.fabric_query_said(done)}",
                     BY_HAND)
    waiting, _, ready = judge.fabric_state(states, [g.pci_address for g in facts.gpus])
    if not ready:
        return Check("fabricmanager", FAIL, f"fabric not ready: {not_ready(states, waiting)}",
                     "read /var/log/fabricmanager.log" + (
                         " and NVLSM's journal (podvm-gpu-nvlsm.service)"
                         if kind == fabric_kind.NVLINK5 else ""))
    return summary_row(facts, f"running (pid {pid}); fabric Completed/Success on "
                              f"{len(states)} GPU(s)")


def not_ready(states: list[FabricState], waiting: list[str], most: int = 3) -> str:
    """The GPUs not Completed/Success, for a row: ``<gpu>: State X, Status Y``, then the
    GPUs that reported nothing (``waiting``: gpufacts/judge.py ``fabric_state``); ``no state``
    when nothing was reported."""
    reported = {bus_id(s.gpu) for s in states}
    said = [f"{s.gpu}: State {s.state}, Status {s.status}" for s in states if not s.success]
    said += [f"{g}: no state" for g in waiting if bus_id(g) not in reported]
    return ", ".join(said[:most]) or "no state"


def _outside_row(facts) -> Check:
    """Kind ``none``: shared-NVSwitch virtualization manages the fabric outside the VM, and the
    GPUs still report it; one that never completed is as unusable as with NVSwitches."""
    note = ""
    if units.enabled_by(facts.root, "nvidia-fabricmanager.service"):
        note = ("; the image's nvidia-fabricmanager.service is enabled and fails with "
                "NV_WARN_NOTHING_TO_DO here, which is harmless")
    states, done = ask.fabric_rows(facts.runner)
    if states is None:
        broken = words.broken(done.returncode, done.output)
        return Check("fabricmanager", FAIL if broken else WARN, "no NVSwitch in the VM; the "
                     f"fabric state is not read: {ask.fabric_query_said(done)}", BY_HAND)
    managed = [s for s in states if s.supported]
    if not all(s.success for s in managed):
        return Check("fabricmanager", FAIL, f"no NVSwitch in the VM, but the fabric "
                     f"managed outside it is not ready: {not_ready(managed, [])}",
                     "the host's fabric manager has not finished this VM's partition: "
                     "ask the provider, or replace the VM")
    if managed:
        return summary_row(facts, f"no NVSwitch in the VM; fabric managed outside it "
                                  f"Completed/Success on {len(managed)} GPU(s)")
    return Check("fabricmanager", SKIP, f"no NVSwitch on PCI{note}")


def fabric_row(facts) -> Check:
    """Which fabric kind PCI shows and why (the boot's reader, fabric_kind.detect), against the
    kind the last boot recorded; on NVLink 5 every part of the path (nvl5.diagnose: the IB
    modules, the port with its GUID and subnet manager, the umad nodes, NVLSM and the fabric
    manager alive and their units). The fabric manager's version and the fabric state are the
    fabricmanager row's."""
    if not facts.gpus:
        return Check("fabric", SKIP, NO_GPU)
    fabric = facts.fabric
    if fabric is None:
        return Check("fabric", FAIL, "cannot read the fabric kind from PCI (the VPD of the "
                     "ConnectX functions)", "report this with podvm-gpu check --json")
    said = f"{fabric.kind}: {fabric.why()}"
    booted = (facts.boot_fabric or {}).get("kind")
    if booted and booted != fabric.kind:
        return Check("fabric", FAIL, f"{said}; the last boot found {booted}",
                     "PCI changed since the boot: reboot the VM")
    if fabric.kind == fabric_kind.MIXED:
        return Check("fabric", FAIL, said, "a VM has NVSwitch functions or ConnectX NVLink "
                     "management ports, never both: ask the provider for a shape with one")
    if fabric.kind != fabric_kind.NVLINK5:
        return Check("fabric", PASS, said)
    if facts.failed_before("fabricmanager"):
        return Check("fabric", SKIP, f"{said}; not reached: the last boot failed at "
                     f"{facts.failed_at} (see status)")
    found, problems = nvl5.diagnose(facts.root, facts.config, fabric, facts.boot_fabric)
    if problems:
        return Check("fabric", FAIL, f"NVLink 5: {'; '.join(problems)} (found: "
                     f"{'; '.join(found)})", "see the fabricmanager step in podvm-gpu status "
                     "and NVLSM's journal (journalctl -u podvm-gpu-nvlsm)")
    return Check("fabric", PASS, f"NVLink 5: {'; '.join(found)}")


VM_ROWS = {"fabric": fabric_row, "fabricmanager": fabricmanager_row}


IMAGE_ROWS = {"fabric": nvl5.fabric_image_row}
