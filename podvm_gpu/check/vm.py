"""The checks of a running VM (contract section 5): the facts every row reads, once, and the rows
in the step order (each step's ``VM_ROWS``), then the rows of no step (status, units)."""

from __future__ import annotations

import os

from podvm_gpu import readers, steps, units
from podvm_gpu.cdi import SPEC_PATH
from podvm_gpu.check import FAIL, NO_GPU, PASS, SKIP, WARN, Check, broken, isolated, safely
from podvm_gpu.check.units import (
    kata_agent_version,
    kata_cdi_check,
    kata_ordering_check,
    refresh_units_check,
    watch_unit_check,
)
from podvm_gpu.config.model import Config
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root, untrusted_dirs
from podvm_gpu.host.proc import Runner, side_by_side
from podvm_gpu.host.sysfs import channels_without_pci, scan_nvidia
from podvm_gpu.model import State
from podvm_gpu.status import ORPHANED, STATUS_PATH, StatusUnreadable, load_status, orphaned, read_status
from podvm_gpu.steps.fabric import fabric_kind


class Facts:
    """What the rows of a running VM read, each read once (a fact that cannot be read is its
    default, and each row that needs it reports what it finds).

    Attributes:
        root, config, runner: the VM's root, the config in force, the read-only runner.
        scanned: PCI functions scanned; gpus, nvswitches: what discovery finds now.
        coming: Hyper-V pass-through channels without their PCI device.
        loaded: whether the nvidia module is loaded; messages: the kernel log's records.
        minors: PCI address -> minor of ``/dev/nvidia<minor>``; failed_at: the GPU step the
            last boot failed at, or None.
        fabric: the fabric kind PCI shows now (:func:`podvm_gpu.steps.fabric.fabric_kind.detect`, the boot's
            reader), None without a GPU or when it cannot be read; boot_fabric: status.json's
            ``fabric`` object of the last boot, or None.
        confidential: whether the guest is a TEE (host/tee.py's evidence); None: not read.
    """

    def __init__(self, root: Root, config: Config, runner: Runner):
        self.root, self.config, self.runner = root, config, runner
        self.scanned, nvidia = scan_nvidia()
        self.coming = safely(channels_without_pci, [])
        self.gpus, self.nvswitches = [], []
        if nvidia:
            from podvm_gpu.host.sysfs import discover

            self.gpus, self.nvswitches = discover(nvidia)
        self.loaded = safely(lambda: readers.module_loaded(root, "nvidia"), False)
        self.messages = safely(lambda: kmsg.read_kernel_log(root), [])
        self.minors = safely(lambda: readers.gpu_minors(root, self.gpus), {})
        self.failed_at = safely(lambda: boot_failed_at(root), None)
        self.fabric = safely(lambda: fabric_kind.detect([s.pci_address for s in self.nvswitches],
                                                        gpus=self.gpus),
                             None) if self.gpus else None
        # a TEE's evidence (host/tee.py): the reset advice is "replace the VM" there; None
        # when it cannot be read (then both are said)
        self.confidential = safely(lambda: _confidential(root), None)
        booted = safely(lambda: (read_status(root) or {}).get("fabric"), None)
        self.boot_fabric = booted if isinstance(booted, dict) else None

    def failed_before(self, step: str) -> bool:
        """Whether the last boot failed at a GPU step before ``step`` (so never reached it)."""
        order = steps.GPU_STEPS
        return bool(self.failed_at) and order.index(self.failed_at) < order.index(step)

    def not_reached(self, step: str) -> Check | None:
        """A skip for the row of a step that the last boot never reached, because an earlier
        step failed: its state then follows from that failure, which the status row reports,
        and failing it too would bury the cause."""
        if self.failed_before(step):
            return Check(step, SKIP, f"not reached: the last boot failed at {self.failed_at} "
                         "(see status)")
        return None

    def needs_driver(self, name: str) -> Check | None:
        """A skip for row ``name`` when there is no GPU or the driver is not loaded."""
        if not self.gpus:
            return Check(name, SKIP, NO_GPU)
        if not self.loaded:
            return Check(name, SKIP, "nvidia module not loaded (see modules)")
        return None


def _confidential(root: Root) -> bool:
    from podvm_gpu.host import tee

    return tee.detect(root).kind is not None


def boot_failed_at(root: Root) -> str | None:
    """The GPU step (contract section 3) at which the last boot failed, or None."""
    doc = read_status(root) or {}
    if doc.get("state") != State.FAILED:
        return None
    failed = [s.get("name") for s in doc.get("steps") or [] if s.get("result") == "failed"]
    return failed[0] if failed and failed[0] in steps.GPU_STEPS else None


def status_row(facts: "Facts") -> Check:
    try:
        doc = load_status(facts.root)
    except StatusUnreadable as err:
        return Check("status", FAIL, f"unreadable: {err}", "run podvm-gpu boot again")
    if doc is None:
        refused = safely(lambda: untrusted_dirs(facts.root, (os.path.dirname(STATUS_PATH),
                                                             os.path.dirname(SPEC_PATH))),
                         "its folders cannot be checked")
        if refused:  # boot wrote nothing, not even a failed status: its journal alone says why
            return Check("status", FAIL, f"no /run/podvm-gpu/status.json: boot refuses to "
                         f"write under {facts.root.path}: {refused}",
                         "make the root and the folders on the way root's, mode go-w "
                         "(chmod go-w), then run podvm-gpu boot; journalctl -u podvm-gpu -b")
        return Check("status", FAIL, "no /run/podvm-gpu/status.json: boot has not run",
                     "systemctl status podvm-gpu.service")
    state, reason = doc.get("state"), doc.get("reason")
    if state == State.FAILED and (reason or "").startswith("watch: "):
        # the watcher's finding (issue 34): a boot run again fails on it; it is no boot's fault
        from podvm_gpu.watchfile import standing_finding

        if not standing_finding(facts.root):  # watch --clear took it back (issue 47 item 8)
            return Check("status", FAIL, f"the watcher's finding was cleared: {reason}",
                         "run the boot again (systemctl restart podvm-gpu podvm-gpu-watch) to install "
                         "a spec")
        return Check("status", FAIL, f"a GPU failed after boot: {reason}", "replace the VM "
                     "(the watcher took the GPUs out of the spec; see the watch row)")
    if state == State.FAILED:
        return Check("status", FAIL, f"boot failed: {reason}", "fix the cause, then rerun "
                     "podvm-gpu boot (or reboot)")
    if state == State.RUNNING:
        if orphaned(facts.root, doc):
            return Check("status", FAIL, f"running, but {ORPHANED}",
                         "journalctl -u podvm-gpu -b; then systemctl restart podvm-gpu")
        return Check("status", WARN, "boot is still running", "podvm-gpu status --wait")
    warnings = doc.get("warnings") or []
    if warnings:
        return Check("status", WARN, f"{state} with {len(warnings)} warning(s): {warnings[0]}",
                     "podvm-gpu status lists them")
    return Check("status", PASS, f"{state}" + (f": {reason}" if reason else ""))


def kata_cdi_row(facts: Facts) -> Check:
    argv = units.exec_start(facts.root, units.KATA_UNIT)
    said = None
    if facts.root.is_host and argv and os.path.isabs(argv[0]):
        said = kata_agent_version(argv[0])
    return kata_cdi_check(facts.root, argv, facts.root.read_text("/proc/cmdline") or "", said)


# The rows that belong to no step, after the steps' rows.
OTHER_ROWS = {
    "status": status_row,
    "cdi-refresh-units": lambda facts: refresh_units_check(facts.root),
    "kata-agent-ordering": lambda facts: kata_ordering_check(facts.root),
    "kata-agent-cdi": kata_cdi_row,
    "watch": lambda facts: watch_unit_check(facts.root, vm=True),
}


def rows() -> dict:
    """Every row of a running VM in its order: the steps' ``VM_ROWS``, then :data:`OTHER_ROWS`."""
    found: dict = {}
    for step in steps.step_modules():
        found.update(getattr(step, "VM_ROWS", {}))
    return {**found, **OTHER_ROWS}


def vm_checks(root: Root, config: Config, runner: Runner, attest: bool = False) -> list[Check]:
    """Every row of a running VM, each on its own: one that raises becomes a ``fail`` row
    naming the error, and the others still run. ``attest``: ``check --attest``."""
    facts = Facts(root, config, runner)
    facts.attest = attest
    # side by side on a GPU VM (issue 38): most rows wait on a tool (nvidia-smi, nvidia-ctk),
    # and a real H200 answers 4 nvidia-smi calls at once in the time of about one; on a CPU VM
    # no row runs a tool, and 25 threads would only cost (6 ms of a 31 ms check). The table
    # keeps the rows' order, and isolated() turns what a row raised into its own fail row
    named = list(rows().items())
    calls = [lambda name=name, row=row: isolated(name, lambda: row(facts))
             for name, row in named]
    done = side_by_side(calls) if facts.gpus else [(call(), None) for call in calls]
    return [check if err is None else broken(name, err)
            for (name, _row), (check, err) in zip(named, done)]
