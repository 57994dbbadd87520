"""Step 7, ``fabricmanager``: on NVSwitch machines start nv-fabricmanager and wait, bounded, until
every GPU reports fabric State Completed with Status Success.

Without NVSwitches the fabric manager is never started; if the GPUs still report a fabric state
other than not-supported (shared-NVSwitch virtualization: the fabric is managed outside the VM),
the same wait applies. The state comes from the ``Fabric`` block of ``nvidia-smi -q -d FABRIC``.
"""

from __future__ import annotations

import time

from podvm_gpu.steps.context import BootContext
from podvm_gpu.errors import CommandError, StepFailed, ended_text
from podvm_gpu.host.daemons import Daemon
from podvm_gpu.readers import (FABRICMANAGER_COMM, FABRICMANAGER_PID, FabricState, daemon_pid,
                               nvsmi_no_driver, parse_fabric)
from podvm_gpu.steps import Skipped
from podvm_gpu import readers, units
from podvm_gpu.check import FAIL, PASS, SKIP, Check

LOG_PATH = "/run/podvm-gpu/nv-fabricmanager.log"


def query(ctx: BootContext, timeout: float | None = None) -> list[FabricState]:
    """Every GPU's fabric state (one ``nvidia-smi -q -d FABRIC`` call).

    Raises:
        CommandError: nvidia-smi failed or timed out.
    """
    return parse_fabric(ctx.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"],
                                       timeout=timeout).stdout)


def summarize(states: list[FabricState]) -> str:
    """``State X, Status Y on N GPU(s)`` for each distinct pair."""
    pairs: dict[tuple[str, str], int] = {}
    for s in states:
        pairs[(s.state, s.status)] = pairs.get((s.state, s.status), 0) + 1
    return "; ".join(f"State {a}, Status {b} on {n} GPU(s)" for (a, b), n in pairs.items())


def bus_id(address: str) -> str:
    """A PCI address as both nvidia-smi (``00000000:18:00.0``) and sysfs (``0000:18:00.0``) can
    be compared: the domain as a number, lower case."""
    domain, _, rest = address.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):x}:{rest}"
    except ValueError:
        return address.strip().lower()


def not_ready(ctx: BootContext, states: list[FabricState]) -> list[str]:
    """The GPUs of the VM (PCI addresses) that do not report fabric Completed/Success: every
    GPU must, not just the ones nvidia-smi happens to list."""
    done = {bus_id(s.gpu) for s in states if s.success}
    return [g.pci_address for g in ctx.gpus if bus_id(g.pci_address) not in done]


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


def wait_for_fabric(ctx: BootContext, daemon: Daemon | None) -> list[FabricState]:
    """Poll the fabric state until every GPU of the VM reports Completed/Success; fail at once
    when a GPU is Completed with another status (unhealthy), the fabric manager exits with an
    error or nvidia-smi cannot run at all. Every failure says the last state seen.

    Raises:
        StepFailed: see above, or the wait (``ready_timeout_s + per_gpu_s * GPUs``, cut to the
            budget) ran out.
    """
    cfg = ctx.config.fabricmanager
    wanted = cfg.ready_timeout_s + cfg.per_gpu_s * ctx.gpu_count
    limit = ctx.wait_limit(wanted)
    end = time.monotonic() + limit
    states: list[FabricState] = []
    while True:
        ctx.check_stop()
        try:
            states = query(ctx)
        except CommandError as err:
            no_driver = nvsmi_no_driver(err.returncode, err.stdout + err.stderr)
            if no_driver:
                raise StepFailed(no_driver) from err
            if err.returncode is None and not err.timed_out:  # not there, cannot run
                raise StepFailed(f"cannot query the NVLink fabric: {err}") from err
            if err.timed_out or time.monotonic() >= end:
                raise StepFailed(f"nvidia-smi fabric query failed: {err}; last seen: "
                                 f"{seen(ctx, states)}") from err
        if states and not not_ready(ctx, states):
            return states
        bad = [s for s in states if s.completed and not s.success]
        if bad:
            raise StepFailed(f"fabric unhealthy: {summarize(bad)}")
        code = daemon.exit_status() if daemon is not None else None
        if code not in (None, 0):
            said = daemon.last_words()
            raise StepFailed(f"nv-fabricmanager {ended_text(code)}"
                             + (f": {said}" if said else "") + f"; last seen: {seen(ctx, states)}")
        if time.monotonic() >= end:
            cut = " (cut to the boot budget)" if limit < wanted else ""
            raise StepFailed(f"timed out after {limit:g} s waiting for the NVLink fabric "
                             f"(wait {cfg.ready_timeout_s:g} s + {cfg.per_gpu_s:g} s x "
                             f"{ctx.gpu_count} GPU(s){cut}): {seen(ctx, states)}")
        time.sleep(min(cfg.poll_s, max(end - time.monotonic(), 0.01)))


def fabricmanager_argv(ctx: BootContext) -> list[str]:
    """``nv-fabricmanager [-c CONFIG]``: the configured file when the root has it (under
    ``--root``, its path in the root); without it the daemon takes its built-in defaults."""
    argv = ["nv-fabricmanager"]
    cfg_file = ctx.config.fabricmanager.config_file
    if ctx.root.exists(cfg_file):
        argv += ["-c", cfg_file if ctx.root.is_host else ctx.root.resolve(cfg_file)]
    return argv


def run(ctx: BootContext) -> str:
    """Start the fabric manager where it belongs and wait for the fabric."""
    root = ctx.root
    if not ctx.nvswitches:
        try:  # a probe: the fabric may be managed outside the VM (shared-NVSwitch)
            states = query(ctx, timeout=ctx.harmless_timeout("nvidia-smi"))
        except CommandError as err:
            no_driver = nvsmi_no_driver(err.returncode, err.stdout + err.stderr)
            if no_driver:  # the loaded driver does not answer: every later client fails too
                raise StepFailed(no_driver) from err
            if err.budget_spent:
                raise StepFailed(f"timed out: the boot budget was spent in {err}") from err
            raise Skipped(f"no NVSwitch; fabric state unknown ({err})") from err
        if not any(s.supported for s in states):
            raise Skipped("no NVSwitch, and the GPUs report no NVLink fabric")
        wait_for_fabric(ctx, None)
        return f"no NVSwitch in the VM; fabric managed outside it: {summarize(states)} -> ready"
    pid = daemon_pid(root, FABRICMANAGER_PID, FABRICMANAGER_COMM)
    daemon = None
    if pid is None:
        daemon = ctx.start_daemon(fabricmanager_argv(ctx), LOG_PATH)
    started = time.monotonic()
    states = wait_for_fabric(ctx, daemon)
    how = f"started ({daemon.where})" if daemon is not None else f"already running (pid {pid})"
    return (f"{how}; {len(ctx.nvswitches)} NVSwitch(es); fabric Completed/Success on "
            f"{len(states)} GPU(s) in {time.monotonic() - started:.2f} s")


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the fabric manager on NVSwitch machines, then the fabric query."""
    argvs = []
    if ctx.nvswitches and daemon_pid(ctx.root, FABRICMANAGER_PID, FABRICMANAGER_COMM) is None:
        argvs.append(fabricmanager_argv(ctx))
    return [*argvs, ["nvidia-smi", "-q", "-d", "FABRIC"]]


# --- podvm-gpu check ----------------------------------------------------------------------

def fabricmanager_row(facts) -> Check:
    """The fabric manager's version is checked even when the last boot never reached the step
    (a property of the image)."""
    if not facts.nvswitches:
        skip = facts.not_reached("fabricmanager")
        if skip:
            return skip
    skip = facts.needs_driver("fabricmanager")
    if skip:
        return skip
    driver = readers.kernel_module_version(facts.root)
    if not facts.nvswitches:
        note = ""
        if units.enabled_by(facts.root, "nvidia-fabricmanager.service"):
            note = ("; the image's nvidia-fabricmanager.service is enabled and fails with "
                    "NV_WARN_NOTHING_TO_DO here, which is harmless")
        # shared-NVSwitch virtualization: the fabric is managed outside the VM, and the
        # GPUs still report it; one that never completed is as unusable as with NVSwitches
        done = facts.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"], check=False)
        states = readers.parse_fabric(done.stdout) if done.returncode == 0 else []
        managed = [s for s in states if s.supported]
        bad = [s for s in managed if not s.success]
        if bad:
            what = ", ".join(f"{s.gpu}: State {s.state}, Status {s.status}" for s in bad[:3])
            return Check("fabricmanager", FAIL, f"no NVSwitch in the VM, but the fabric "
                         f"managed outside it is not ready: {what}",
                         "the host's fabric manager has not finished this VM's partition: "
                         "ask the provider, or replace the VM")
        if managed:
            return Check("fabricmanager", PASS, f"no NVSwitch in the VM; fabric managed "
                         f"outside it Completed/Success on {len(managed)} GPU(s)")
        return Check("fabricmanager", SKIP, f"no NVSwitch on PCI{note}")
    done = facts.runner.run(["nv-fabricmanager", "--version"], check=False)
    fm = readers.version_in(done.output)
    if fm and driver and fm != driver:
        return Check("fabricmanager", FAIL, f"fabric manager {fm}, driver {driver}",
                     f"install the fabric manager package of driver {driver}")
    if facts.failed_before("fabricmanager"):
        return Check("fabricmanager", SKIP, f"fabric manager {fm or '(version unknown)'}; not "
                     f"started: the last boot failed at {facts.failed_at} (see status)")
    pid = readers.daemon_pid(facts.root, readers.FABRICMANAGER_PID, readers.FABRICMANAGER_COMM)
    if pid is None:
        return Check("fabricmanager", FAIL, f"{len(facts.nvswitches)} NVSwitch(es) but "
                     "nv-fabricmanager is not running", "see the fabricmanager step in "
                     "podvm-gpu status and /var/log/fabricmanager.log")
    states = readers.parse_fabric(facts.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"]).stdout)
    bad = [s for s in states if not s.success]
    if bad or not states:
        what = ", ".join(f"{s.gpu}: State {s.state}, Status {s.status}" for s in bad[:3])
        return Check("fabricmanager", FAIL, f"fabric not ready: {what or 'no state'}",
                     "read /var/log/fabricmanager.log")
    return Check("fabricmanager", PASS, f"running (pid {pid}); fabric Completed/Success on "
                 f"{len(states)} GPU(s)")


VM_ROWS = {"fabricmanager": fabricmanager_row}
