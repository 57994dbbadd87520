"""``podvm-gpu boot``: the boot sequence (contract section 3) and its CPU fast path.

This module is imported on every pod VM boot, GPU or not, so it imports only the standard
library and the package's stdlib-only modules at the top. The GPU pipeline (pyudev, pydantic,
PyYAML) is imported only when the sysfs pre-scan finds an NVIDIA PCI function, or when a config
file exists (then it must be validated).
"""

from __future__ import annotations

import json
import os
import sys
import time

from podvm_gpu.host.fs import Root
from podvm_gpu.host.sysfs import scan_nvidia
from podvm_gpu.model import State, Status, Step, StepResult
from podvm_gpu.status import StatusFile

CONFIG_PATH = "/etc/podvm-gpu/config.yaml"


class Log:
    """One line per event on stderr, which systemd sends to the journal.

    Under systemd (``JOURNAL_STREAM`` set) each line starts with a syslog priority prefix
    (``<3>`` error, ``<4>`` warning, ``<6>`` info) that journald turns into the entry's priority;
    in a terminal the prefix is left out.
    """

    ERR, WARNING, INFO = 3, 4, 6

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.prefix = bool(os.environ.get("JOURNAL_STREAM"))

    def __call__(self, priority: int, text: str) -> None:
        label = {3: "error: ", 4: "warning: "}.get(priority, "")
        head = f"<{priority}>" if self.prefix else ""
        try:
            print(f"{head}podvm-gpu: {label}{text}", file=self.stream, flush=True)
        except OSError:
            pass  # a closed stderr must not fail the boot

    def step(self, step: Step) -> None:
        priority = self.ERR if step.result is StepResult.FAILED else self.INFO
        message = f": {step.message}" if step.message else ""
        self(priority, f"{step.name} {step.result} in {step.duration_s:.3f} s{message}")


def config_path_for(root: Root, config: str | None) -> str:
    """The config file's real path: ``--config`` / ``PODVM_GPU_CONFIG`` as given, else under root."""
    return config if config else root.resolve(CONFIG_PATH)


def run_boot(root_dir: str = "/", config: str | None = None, json_out: bool = False,
             dry_run: bool = False) -> int:
    """Run the boot sequence and return the exit code (0 ready/no-gpu, 1 failed).

    Args:
        root_dir: the root every host path is taken under (contract section 1).
        config: the config file path, or None for ``<root>/etc/podvm-gpu/config.yaml``.
        json_out: print the final status document on stdout instead of a summary line.
        dry_run: detect and plan, print the commands, change nothing.
    """
    started = time.monotonic()
    root = Root(root_dir)
    log = Log()
    status = Status()
    status_file = StatusFile(root, enabled=not dry_run)
    config_path = config_path_for(root, config)
    detect = Step("detect")
    status.steps.append(detect)
    try:
        status_file.write(status)
    except OSError as err:
        log(Log.ERR, f"cannot write the status file {status_file.path}: {err}")
        return 1
    scanned, nvidia = scan_nvidia()
    if not nvidia and not os.path.exists(config_path):
        # The CPU fast path: no NVIDIA function, no config to validate; defaults apply.
        detect.result = StepResult.OK
        detect.duration_s = time.monotonic() - started
        detect.message = f"no NVIDIA GPU on PCI ({scanned} devices scanned)"
        return finish_without_gpu(root, status, status_file, log, json_out, dry_run,
                                  write_spec=True)
    try:
        from podvm_gpu.pipeline import run_pipeline  # GPU or config present: the full path

        return run_pipeline(root, config_path, status, status_file, log, json_out=json_out,
                            dry_run=dry_run, started=started)
    except Exception as err:  # a bug or a broken install must still end 'failed', never hang
        import traceback

        log(Log.ERR, traceback.format_exc().replace("\n", " | "))
        return fail_unexpectedly(root, status, status_file, log, json_out, dry_run, err)


def fail_unexpectedly(root: Root, status: Status, status_file: StatusFile, log: Log,
                      json_out: bool, dry_run: bool, err: Exception) -> int:
    """End the boot ``failed`` after an error no step handled (a broken install, a bug),
    naming the step that was running."""
    running = next((s for s in reversed(status.steps) if s.result is StepResult.RUNNING),
                   status.steps[-1])
    running.result = StepResult.FAILED
    running.message = f"internal error: {type(err).__name__}: {err}"
    return finish_failed(root, status, status_file, log, f"{running.name}: {running.message}",
                         json_out, dry_run, write_spec=True)


def finish_failed(root: Root, status: Status, status_file: StatusFile, log: Log, reason: str,
                  json_out: bool, dry_run: bool, write_spec: bool) -> int:
    """End a boot ``failed`` with ``reason``: see :func:`finish`. Returns 1."""
    reason = " ".join(reason.split())
    log(Log.ERR, f"failed: {reason}")
    return finish(root, status, status_file, log, State.FAILED, reason, json_out, dry_run,
                  write_spec)


def finish_without_gpu(root: Root, status: Status, status_file: StatusFile, log: Log,
                       json_out: bool, dry_run: bool, write_spec: bool) -> int:
    """End a boot ``no-gpu`` with detect's message as the reason: see :func:`finish`. Returns 0,
    or 1 when the spec or status cannot be written."""
    detect = status.steps[0]
    log.step(detect)
    return finish(root, status, status_file, log, State.NO_GPU, f"detect: {detect.message}",
                  json_out, dry_run, write_spec)


def finish(root: Root, status: Status, status_file: StatusFile, log: Log, state: State,
           reason: str, json_out: bool, dry_run: bool, write_spec: bool) -> int:
    """The end of a boot without a usable GPU (``no-gpu`` or ``failed``): the unavailable spec
    (unless the config turned it off) with duplicates renamed aside, then the final status, then
    the report on stdout. A dry run only says so. Exit status 0 for no-gpu, 1 for failed."""
    code = 0 if state is State.NO_GPU else 1
    if dry_run:
        if json_out:
            print(json.dumps({"dry_run": True, "state": str(state), "reason": reason,
                              "commands": []}, indent=2))
        else:
            print(f"dry run: {state}: {reason}; would write the unavailable spec and the status")
        return code
    try:
        if write_spec:
            write_spec_and_disable_duplicates(root, status, state, reason)
        status_file.finish(status, state, reason)
    except OSError as err:
        log(Log.ERR, f"cannot write the spec or status under {root.path}: {err}")
        return 1
    report(status, json_out)
    return code


def write_spec_and_disable_duplicates(root: Root, status: Status, state: State,
                                      reason: str) -> None:
    """Install the unavailable spec, and rename other nvidia.com/gpu specs in /var/run/cdi aside
    so that kata-agent sees only it (their names go to the status warnings).

    Raises:
        OSError: the spec cannot be written.
    """
    from podvm_gpu.cdi_dir import disable_duplicates
    from podvm_gpu.unavailable import write_unavailable_spec

    status.warnings.extend(disable_duplicates(root))
    write_unavailable_spec(root, state, reason)


def report(status: Status, json_out: bool) -> None:
    """Print the outcome on stdout: the status document with ``--json``, else one line."""
    if json_out:
        print(json.dumps(status.to_dict(), indent=2))
        return
    if status.state is State.READY and status.cdi:
        detail = f"{len(status.gpus)} GPU(s), CDI spec {status.cdi['path']}"
    else:
        detail = status.reason
    print(f"{status.state}: {detail}" if detail else str(status.state))
