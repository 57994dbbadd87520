"""``podvm-gpu boot``: the boot sequence (contract section 3) and its CPU fast path.

This module is imported on every pod VM boot, GPU or not, so it imports only the standard
library's cheapest modules and the package's stdlib-only modules at the top. pyudev comes in
only when the sysfs pre-scan finds an NVIDIA PCI function or a GPU on its way (a Hyper-V PCI
pass-through channel without its PCI device, or fewer GPUs than the config expects: see
:mod:`podvm_gpu.boot.late`), PyYAML only when a config file is there, the GPU pipeline
(:mod:`podvm_gpu.boot.pipeline`) only when a GPU is. What a run is and how it ends:
:mod:`podvm_gpu.boot.run`.
"""

from __future__ import annotations

import _signal
import os
import time

from podvm_gpu.boot.run import BudgetExpired, Interrupted, Log, Run, Signals
from podvm_gpu.ending import oserror, untrusted_root
from podvm_gpu.host.fs import Root
from podvm_gpu.host.sysfs import channels_without_pci, scan_nvidia
from podvm_gpu.model import State, Step, StepResult
from podvm_gpu.status import LOCK_PATH, STATUS_PATH, acquire_lock, remove_leftovers

CONFIG_PATH = "/etc/podvm-gpu/config.yaml"
DEFAULT_BUDGET_S = 240.0  # config/model.py's budget_s default (tests/test_interface.py ties them)


def config_path_for(root: Root, config: str | None) -> str:
    """The config file's real path: ``--config`` / ``PODVM_GPU_CONFIG`` as given, else under root.

    Raises:
        OSError: the default path cannot be resolved under the root (a link loop).
    """
    return config if config else root.resolve(CONFIG_PATH)


def run_boot(root_dir: str = "/", config: str | None = None, json_out: bool = False,
             dry_run: bool = False) -> int:
    """Run the boot sequence and return the exit code (0 ready/no-gpu, 1 failed).

    Args:
        root_dir: the root every host path is taken under (contract section 1).
        config: the config file asked for (``--config``, ``PODVM_GPU_CONFIG``; a missing one is
            an error), or None for ``<root>/etc/podvm-gpu/config.yaml`` (optional).
        json_out: print the final status document on stdout instead of a summary line.
        dry_run: detect and plan, print the commands, change nothing.
    """
    # Files 0644 and folders 0755 whatever the umask boot was started with, and the tools and
    # daemons it starts get systemd's default too (a shell's umask 000 would reach them).
    os.umask(0o022)
    run = Run(Root(root_dir), json_out, dry_run, Log())
    try:
        run.signals = Signals()
        return _boot(run, config)
    except BaseException as err:  # every way out of a boot but its return ends in a final state
        return _end_after(run, err)
    finally:
        if run.signals:
            run.signals.restore()


def _end_after(run: Run, err: BaseException) -> int:
    """The one guard every way out of a boot but its return goes through: ``err`` is what ended
    it (SIGTERM and the like, the budget's timer, a bug or a broken install), or what an ending
    already under way raised. The ending begins with the budget's timer cancelled and later
    signals only noted (:meth:`Run.finishing`); then the end for ``err`` (docs/interface.md
    3.3); and when an ending raises (this one, or the one under way), :meth:`Run.last_resort`
    still writes the final ``failed`` status and the unavailable spec, naming the error."""
    try:
        run.finishing()
        if run.ending is None:
            if isinstance(err, KeyboardInterrupt):  # SIGINT before boot's handler was in place
                err = Interrupted(_signal.SIGINT)
            if isinstance(err, Interrupted):
                if not run.status.steps:  # still waiting for the lock: the other boot owns the state
                    run.log(Log.ERR, f"stopped by {err.name} before this boot began (nothing "
                                     "written)")
                    return 1
                return run.interrupted(err)
            if isinstance(err, BudgetExpired) and run.status.steps:  # the timer, outside a step
                return run.fail(f"{run.running_step().name}: timed out: the boot budget of "
                                f"{run.budget_s:g} s is spent")
            import traceback  # a bug or a broken install must still end 'failed', never hang

            run.log(Log.ERR, traceback.format_exc().replace("\n", " | "))
            if not run.status.steps:
                return _fail_before_start(run, err)
            return run.fail_unexpectedly(err)
    except BaseException as again:  # the ending itself raised
        err = again
    return run.last_resort(err)


def _config_warning(run: Run, line: str) -> None:
    run.log(Log.WARNING, f"config: {line}")
    run.status.warnings.append(f"config: {line}")


def _fail_before_start(run: Run, err: BaseException) -> int:
    """End ``failed`` after an error no step handled before the first status write (a bug, a
    broken install): the lock is taken as a boot takes it (the status is written only with it
    held; without it, the unavailable spec and the console line alone), then the same ending as
    every failed boot. A dry run says it and exits 1."""
    reason = f"detect: internal error: {type(err).__name__}: {err}"
    if run.dry_run:
        return run.fail(reason)
    try:
        untrusted = untrusted_root(run.root)
    except Exception:  # cannot tell: fail closed, as for an untrusted root
        untrusted = "its folders cannot be checked"
    if untrusted:  # nothing may be written under it (3.1), not even the spec
        run.log(Log.ERR, f"refusing to write under {run.root.path}: {untrusted}")
        return 1
    if not run.locked:
        try:
            lock = acquire_lock(run.root, run.budget_s - (time.monotonic() - run.started),
                                run.log)
        except Exception:  # no lock file can be made: no other boot can hold it either
            run.status_file.enabled = False
        else:
            if lock is None:  # another boot holds it: that boot's files are its own
                run.log(Log.ERR, f"another boot still holds {LOCK_PATH}; this one ends "
                                 "without writing anything")
                return 1
            run.locked = True
    return run.fail(reason)


def _boot(run: Run, config: str | None) -> int:
    """The boot sequence's phases in order: the config read, the root check and the lock,
    detect (with its wait for GPUs that come late), the config's failure, the pod's initdata,
    then ``no-gpu`` or the GPU pipeline. Returns the exit code, as :func:`run_boot`."""
    scanned, nvidia = scan_nvidia()
    coming = channels_without_pci()  # [] off Hyper-V (one failed listdir) and on most VMs there
    settings, config_error = _read_config(run, config)
    refused = _lock(run)
    if refused is not None:
        return refused
    detect = Step("detect")
    run.status.steps.append(detect)
    try:
        run.status_file.write(run.status)
    except OSError as err:
        # nothing can be recorded; the spec and the console line still say why
        return run.fail(f"status: cannot write {STATUS_PATH}: {oserror(err)}")
    _detect(run, detect, settings, config_error, coming, scanned, nvidia)
    if detect.result == StepResult.FAILED:  # a GPU was announced but never came: not no-gpu
        return run.fail(f"detect: {detect.message}")
    if config_error is not None:
        step = Step("config", StepResult.FAILED, message=config_error)
        run.status.steps.append(step)
        run.log.step(step)
        return run.fail(f"config: {config_error}")
    if settings is not None and settings.initdata.path and not run.dry_run:
        failure = _initdata(run, settings, detect)
        if failure is not None:  # expected GPUs and none on PCI: failed, never no-gpu
            return run.fail(f"initdata: {failure}")
    if not run.status.gpus:
        standing = _standing_finding(run)
        if standing:  # the failed GPU may have left PCI itself: still not no-gpu
            return run.fail(standing)
        return run.end(State.NO_GPU, f"detect: {detect.message}")
    from podvm_gpu.boot.pipeline import run_pipeline  # a GPU is there: the full path
    from podvm_gpu.host.kmsg_once import SharedLog

    with SharedLog(run.root):  # the kernel log read once for all the steps (issue 38)
        return run_pipeline(run, settings)


def _read_config(run: Run, config: str | None) -> tuple:
    """The config phase: ``(settings, config_error)``, one of them None (both when there is no
    config file). ``config`` is the file asked for (None: the default path under the root, which
    may be absent). A config that cannot be read is an error the boot reports at its config
    step, after detect; a read one sets the run's spec mode, metrics, bind mode and budget (the
    default budget without one)."""
    root = run.root
    try:
        config_path = config_path_for(root, config)
        # an entry where the config goes (a dangling link too) is a config that must be read
        present = config is not None or os.path.lexists(
            root.resolve(CONFIG_PATH, follow_last=False))
    except OSError as err:
        config_path, present = f"{root.path}{CONFIG_PATH}", err
    settings, config_error = None, None
    if present is True:
        from podvm_gpu.config.load import link_to_nothing, load_config
        from podvm_gpu.errors import ConfigError

        try:
            nothing = link_to_nothing(root) if config is None else None
            if nothing:
                raise ConfigError(nothing)
            settings = load_config(config_path, required=True, trusted=True,
                                   warn=lambda line: _config_warning(run, line))
        except ConfigError as err:
            config_error = str(err)
        except Exception as err:  # a bug in the validator must still end at the config step
            config_error = f"{config_path}: internal error: {type(err).__name__}: {err}"
    elif present is not False:
        config_error = f"{config_path}: cannot resolve: {oserror(present)}"
    if settings is not None:
        run.write_spec, run.metrics = settings.unavailable_spec, settings.metrics
        run.bind_mode = settings.confidential_computing.bind
    run.budget_s = settings.budget_s if settings is not None else DEFAULT_BUDGET_S
    return settings, config_error


def _lock(run: Run) -> int | None:
    """The root check and the boot lock: None when the boot may go on (the lock held, or a dry
    run, which takes none), else the exit code it ends with. An untrusted root is refused before
    anything is written; the lock is waited for up to the budget (the wait is recorded as
    ``run.lock_wait_s``); with it held, a previous boot's leftovers are removed."""
    root, log, budget = run.root, run.log, run.budget_s
    untrusted = untrusted_root(root)
    if untrusted:
        # nothing can be written safely, not even a failed status: the journal says why; a dry
        # run says the same refusal and ends as the boot would
        refusal = (f"refusing to write under {root.path}: {untrusted}; another user could "
                   "redirect root's writes through it (make it root's, mode go-w)")
        log(Log.ERR, refusal)
        return run.dry_run_refusal(refusal) if run.dry_run else 1
    if run.dry_run:
        return None
    waited_from = time.monotonic()
    try:
        lock = acquire_lock(root, budget, log)
    except OSError as err:
        # no lock file means no status file either (same folder), and no other boot can
        # hold the lock: end failed with what can still be written without it (the spec,
        # the console line, the journal); the status is written only with the lock held
        run.status_file.enabled = False
        if err.filename and str(err.filename).endswith("/" + os.path.basename(LOCK_PATH)):
            return run.fail(f"status: cannot open the boot lock {LOCK_PATH}: "
                            f"{err.strerror or err}")
        return run.fail(f"status: cannot make {os.path.dirname(STATUS_PATH)} for the boot "
                        f"lock and the status: {oserror(err)}")
    if lock is None:
        log(Log.ERR, f"another boot still holds {LOCK_PATH} after {budget:g} s; this one "
                     "ends without writing anything")
        return 1
    run.locked = True
    # the wait is its own line ("got ... after N s"), never detect's time (issue 47 item 9)
    run.lock_wait_s = time.monotonic() - waited_from
    remove_leftovers(root)
    return None


def _detect(run: Run, detect: Step, settings, config_error: str | None, coming: list,
            scanned: int, nvidia: list[str]) -> None:
    """The detect step (already in the written status): the wait for GPUs that come late when
    some are announced (``coming``: Hyper-V channels without their PCI device) or the config
    expects more than ``nvidia`` (the NVIDIA functions of the first scan of ``scanned`` PCI
    devices) holds, the GPUs and NVSwitches discovered into the status, and the step's result
    and message set and logged: FAILED when an awaited GPU never came (a dry run: would not
    have come yet)."""
    late = None
    if config_error is None and (coming or settings is not None and settings.detect.expected_gpus):
        late = _late_wait(run, settings, coming, nvidia)
    if late is not None and not run.dry_run:
        scanned, nvidia = _wait(run, detect, late)
    if nvidia:
        from podvm_gpu.host.sysfs import discover

        run.status.gpus, run.status.nvswitches = discover(nvidia)
    gpus, switches = run.status.gpus, run.status.nvswitches
    detect.result = StepResult.OK
    detect.duration_s = time.monotonic() - run.started - run.lock_wait_s
    if not gpus:
        detect.message = (f"no NVIDIA GPU on PCI ({scanned} devices scanned)" +
                          (f"; {len(switches)} NVSwitch(es): a fabric manager service VM?"
                           if switches else ""))
    else:
        detect.message = f"{len(gpus)} GPU(s), {len(switches)} NVSwitch(es)"
    if late is not None:
        detect.message += f"; {late.outcome()}" if not run.dry_run else \
            f"; a boot would wait up to {late.limit()} for {late.awaited()}"
        if late.missing_parts():
            # a dry run ends as a boot would with the PCI it sees now: failed, unless the
            # awaited devices come within the wait
            detect.result, detect.message = StepResult.FAILED, late.failure() if not \
                run.dry_run else (f"{detect.message}; none of it has come yet: a boot that "
                                  f"waits in vain ends failed ({'; '.join(late.missing_parts())})")
    run.log.step(detect)


def _initdata(run: Run, settings, detect: Step) -> str | None:
    """The initdata step, when the config names the pod's initdata file (not in a dry run): the
    failure that ends the boot (expected GPUs and none on PCI), or None. The step is in the
    status while it reads (and waits for) the file, so the wait is named for what it is
    (status, a signal's reason, the budget's); it stays in the final document only when it
    fails (3.13). ``run.status.gpus`` holds the GPUs on PCI afterwards."""
    from podvm_gpu import initdata  # only when the config names the file

    step = Step("initdata")
    run.status.steps.append(step)
    failure = initdata.apply(run, settings, run.status.gpus, step,
                             lambda count: _initdata_wait(run, settings, detect, count))
    step.duration_s = time.monotonic() - step.started
    if failure is not None:
        step.result, step.message = StepResult.FAILED, failure
        run.log.step(step)
        return failure
    if step.result == StepResult.RUNNING:
        step.result = StepResult.OK  # read (skipped: not there)
    run.log.step(step)
    run.status.steps.remove(step)
    return None


def _late_wait(run: Run, settings, coming: list, nvidia: list[str]):
    """The wait for GPUs that appear late (:mod:`podvm_gpu.boot.late`), or None when none is coming:
    ``coming`` are the VMBus PCI pass-through channels without their PCI device, ``nvidia`` the
    NVIDIA functions on PCI now; the config's ``detect`` section (defaults without a config)
    gives the limit and the expected count. Imports the config and wait modules only here."""
    from podvm_gpu.boot.late import plan_wait
    from podvm_gpu.config.model import DetectConfig
    from podvm_gpu.host.sysfs import nvidia_gpus

    detect = settings.detect if settings is not None else DetectConfig()
    budget = settings.budget_s if settings is not None else DEFAULT_BUDGET_S
    gpus_now = len(nvidia_gpus(nvidia)) if detect.expected_gpus else 0
    return plan_wait(coming, detect.expected_gpus, gpus_now, detect.late_gpu_wait_s,
                     run.started + budget - time.monotonic())


def _initdata_wait(run: Run, settings, detect: Step, count: int) -> list:
    """The late-GPU wait for the ``expected_gpus`` of the pod's initdata (issue 37 item 7):
    as for ``detect.expected_gpus``, at most ``detect.late_gpu_wait_s`` cut to the budget; the
    GPUs on PCI afterwards (status and detect's message updated)."""
    from podvm_gpu.boot.late import plan_wait
    from podvm_gpu.host.sysfs import discover, nvidia_gpus

    _, nvidia = scan_nvidia()
    late = plan_wait([], count, len(nvidia_gpus(nvidia)), settings.detect.late_gpu_wait_s,
                     run.started + settings.budget_s - time.monotonic())
    if late is None:
        return run.status.gpus
    late.who = ("the pod's initdata expects", f'initdata {settings.initdata.path}, '
                'data."podvm-gpu.toml" expected_gpus')
    message = detect.message
    nvidia = _wait(run, detect, late)[1]
    if nvidia:
        run.status.gpus, run.status.nvswitches = discover(nvidia)
    detect.message = f"{message}; {late.outcome()}"
    return run.status.gpus


def _wait(run: Run, detect: Step, late) -> tuple[int, list[str]]:
    """Wait for what ``late`` expects, the detect step saying so in the status meanwhile; then
    scan PCI again: :func:`podvm_gpu.host.sysfs.scan_nvidia`'s ``(devices scanned, NVIDIA
    functions)``."""
    from podvm_gpu.host.udev import wait_for_pci

    detect.message = f"waiting up to {late.limit()} for {late.awaited()}"
    run.log(Log.INFO, f"detect: {detect.message}")
    try:
        run.status_file.write(run.status)
    except OSError:
        pass  # the status was written a moment ago; the final write reports a failure
    late.run(wait_for_pci)
    return scan_nvidia()


# podvm_gpu/watchfile.py's WATCH_PATH (tests/test_watch_units.py holds them equal): that module
# imports json, which the CPU fast path does not load
WATCH_PATH = "/run/podvm-gpu/watch.json"


def _standing_finding(run: Run) -> str | None:
    """A boot that finds no GPU while the watcher's finding stands (issue 34) fails naming it,
    as the GPU path does (boot/pipeline.py): a GPU that fell off the bus can be gone from PCI
    too, and ``no-gpu`` would pass the status row while the watch row fails. One ``lstat`` on
    the CPU fast path; the finding is read only when watch.json is there."""
    if run.dry_run:
        return None
    try:
        if not os.path.lexists(run.root.resolve(WATCH_PATH, follow_last=False)):
            return None
    except (OSError, ValueError):
        pass  # a path that cannot be resolved: watchfile.load decides, as on the GPU path
    from podvm_gpu.boot.pipeline import _standing_finding as standing

    return standing(run)
