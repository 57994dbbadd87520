"""What the boot steps share: the root, config, runner, findings so far, and the budget."""

from __future__ import annotations

import os
import time

from podvm_gpu.config.model import Config
from podvm_gpu.errors import Cancelled, StepFailed
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.host.wait import until
from podvm_gpu.model import PciDevice, Status, cut_reason

# A call whose failure the boot survives (an optional module, a version or state probe) may
# take at most this long, whatever the tool's timeout: a hang there must not spend the budget
# of the steps that matter.
HARMLESS_CALL_S = 10.0


def harmless_timeout(runner: Runner, tool: str) -> float:
    """The one rule for the timeout of a call the agent survives the failure of (boot's probes,
    check's health rows, the watcher's polls): ``tool``'s own timeout in ``runner`` (the
    config's ``tools``), at most :data:`HARMLESS_CALL_S` seconds."""
    return min(runner.timeouts.get(tool, HARMLESS_CALL_S), HARMLESS_CALL_S)


class BootContext:
    """Facts and handles for one boot run (a plain class: ``dataclasses`` costs the GPU path
    several milliseconds of import).

    Attributes:
        root: the root every host path is taken under.
        config: the validated config.
        runner: runs tools with timeouts cut to the budget.
        status: the status document being built (steps append warnings here).
        deadline: ``time.monotonic()`` value at which the budget is spent.
        gpus, nvswitches: what detect found, sorted by PCI address.
        driver_version: the kernel module's version once the versions step has read it.
        fabric: the fabric kind and the NVL5 path's record (podvm_gpu/steps/fabric/fabric_kind.py).
        minors: PCI address -> device minor of ``/dev/nvidia<minor>``, from the driver.
        stopping: a ``threading.Event`` set when the steps in flight must stop (pipeline.py),
            or None; ``stopped_because`` says why.
        last_seen: step name -> what its wait saw last and for how long (``State In Progress,
            Status N/A on 8 GPU(s) for 12 s``): the pipeline names it when the boot budget
            ends the step (issue 33).
        attested_gpus: the GPUs the attestation's verdict covers (steps/cc/identity.py's
            ``GpuIdentity``: index, bus id, UUID, ueid), once it passed (issue 45); status.json
            has them too.
        early: call name -> a call started before the step that reads it
            (podvm_gpu/steps/cdi/toolkit.py ``start_version_read``: nvidia-ctk's version,
            read while persistenced starts, issue 38; the likely hooks' asks).
    """

    def __init__(self, root: Root, config: Config, runner: Runner, status: Status,
                 deadline: float, gpus: list[PciDevice] | None = None,
                 nvswitches: list[PciDevice] | None = None):
        self.root, self.config, self.runner, self.status = root, config, runner, status
        self.deadline = deadline
        self.gpus = list(gpus or [])
        self.nvswitches = list(nvswitches or [])
        self.driver_version: str | None = None
        self.minors: dict[str, int] = {}
        self.fabric = None  # podvm_gpu.steps.fabric.fabric_kind.Fabric, set by the pipeline before the steps
        self.nvml_seen: set[str] | None = None  # bus ids the last answered fabric query listed
        self.stopping = None
        self.stopped_because = ""
        self.last_seen: dict[str, str] = {}
        self.early: dict[str, object] = {}
        # issue 45 (podvm_gpu/steps/cc/identity.py): the GPU set read before nvattest, and the
        # identities the verdict covers once it passed (GpuIdentity each, index order)
        self.gpus_before_attestation: list | None = None
        self.attested_gpus: list = []

    def check_stop(self) -> None:
        """Raise :class:`Cancelled` when the steps in flight must stop (another failed, the
        boot is ending); waits call it between polls."""
        if self.stopping is not None and self.stopping.is_set():
            raise Cancelled(self.stopped_because or "the boot is ending")

    def remaining(self) -> float:
        """Seconds left in the boot budget (may be negative)."""
        return self.deadline - time.monotonic()

    def wait_limit(self, wanted_s: float) -> float:
        """A wait of ``wanted_s`` seconds cut to the budget.

        Raises:
            StepFailed: the budget is already spent (``timed out``).
        """
        left = self.remaining()
        if left <= 0:
            raise StepFailed(f"timed out: the boot budget of {self.config.budget_s:g} s is spent")
        return min(wanted_s, left)

    def wait(self, look, wanted_s: float, poll_s: float):
        """A step's bounded wait (:func:`podvm_gpu.host.wait.until`): ``look()`` until it returns
        something truthy, at most ``wanted_s`` seconds cut to the budget, ended by the boot's stop
        event; returns the :class:`~podvm_gpu.host.wait.Waited` (its ``limit_s`` below
        ``wanted_s`` when the budget cut it). A wait of 0 s looks once, whatever the budget.

        Raises:
            StepFailed: the budget is already spent (``timed out``), for a wait of more than 0 s.
            Cancelled: the steps in flight must stop.
            Whatever ``look`` raises.
        """
        limit = self.wait_limit(wanted_s) if wanted_s > 0 else 0.0
        return until(look, limit, poll_s, check_stop=self.check_stop)

    def harmless_timeout(self, tool: str) -> float:
        """The timeout of a call the boot survives the failure of: the tool's own, at most
        :data:`HARMLESS_CALL_S`."""
        return harmless_timeout(self.runner, tool)

    def warn(self, text: str) -> None:
        """Add a one-line warning to the status (cut as a reason is: model.REASON_MAX)."""
        line = cut_reason(text)
        if line not in self.status.warnings:
            self.status.warnings.append(line)

    def start_daemon(self, argv: list[str], log_host_path: str):
        """Start a daemon for a step (host/daemons.py: its own unit under systemd, else detached),
        its spawn log at ``log_host_path`` under the root; returns the
        :class:`~podvm_gpu.host.daemons.Daemon`.

        Raises:
            OSError: the log's folder cannot be made.
            CommandError: the daemon could not be started.
        """
        from podvm_gpu.host.daemons import start_daemon
        from podvm_gpu.host.fs import ensure_dir

        log_path = self.root.resolve(log_host_path, follow_last=False)
        ensure_dir(os.path.dirname(log_path))
        return start_daemon(self.runner, argv, log_path, warn=self.warn)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)
