"""``podvm-gpu check``: the read-only diagnosis engineers run on a GPU VM (contract section 5), and
``check --image`` for image builds (contract section 6).

Every check reports ``pass``, ``warn``, ``fail`` or ``skip`` with a detail line stating the fact
found and, on ``warn``/``fail``, a hint saying what to do next. It reuses boot's readers and
validators and never loads a module, starts a daemon or writes a file: the runner is read-only
(it refuses to spawn) and the only commands run are queries with timeouts (``nvidia-smi``
queries, ``nv-fabricmanager --version``, ``modinfo -F version|firmware FILE`` and, on the root
``/``, ``modprobe -S <release> --show-depends <module>``, which prints what it would load).
"""

from __future__ import annotations

import json
import os
import sys

from podvm_gpu import cdi_dir, dkms, image_tools, kata, kmod, readers, units
from podvm_gpu.cdi import CdiSpecError, check_ready_spec, parse_spec
from podvm_gpu.config import DEFAULT_PATH as CONFIG_PATH
from podvm_gpu.config import Config, config_location, load_config, timeouts_for
from podvm_gpu.errors import CommandError, ConfigError
from podvm_gpu.host import kmsg
from podvm_gpu.host.fs import Root
from podvm_gpu.host.proc import Runner
from podvm_gpu.host.sysfs import scan_nvidia
from podvm_gpu.host.vmbus import channels_without_pci
from podvm_gpu.record import REQUIRED, Record
from podvm_gpu.model import State
from podvm_gpu.status import CDI_SPEC_PATH, StatusUnreadable, load_status, read_status
from podvm_gpu.steps import modules as modules_step, nodes as nodes_step
from podvm_gpu.unavailable import UNAVAILABLE_DEVICE

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
VM_CHECKS = ("pci", "drivers", "modules", "versions", "device-nodes", "persistenced",
             "fabricmanager", "confidential-computing", "cdi-spec", "cdi-duplicates", "status",
             "cdi-refresh-units", "kata-agent-ordering", "kata-agent-cdi")
IMAGE_CHECKS = ("unit", "kata-agent-ordering", "kata-agent-cdi", "tools", "modules", "versions", "firmware",
                "cdi-refresh-units", "trust", "config-compiled")
NO_GPU = "no NVIDIA GPU found on PCI"
# Boot's steps in order (contract section 3), for checks of steps a failed boot never reached.
_STEP_ORDER = ("drivers", "modules", "versions", "device-nodes", "persistenced", "fabricmanager",
               "confidential-computing")


class Check(Record):
    """One check's outcome: ``name``, ``result`` (pass/warn/fail/skip), ``detail`` (the fact
    found) and ``hint`` (what to do); ``to_dict`` is the ``--json`` row."""

    FIELDS = (("name", REQUIRED), ("result", REQUIRED), ("detail", REQUIRED), ("hint", ""))


class VmChecks:
    """The checks of a running VM (contract section 5), one method each."""

    def __init__(self, root: Root, config: Config, runner: Runner):
        self.root, self.config, self.runner = root, config, runner
        self.scanned, nvidia = scan_nvidia()
        self.coming = _safely(channels_without_pci, [])
        self.gpus, self.nvswitches = [], []
        if nvidia:
            from podvm_gpu.host.sysfs import discover

            self.gpus, self.nvswitches = discover(nvidia)
        self.loaded = _safely(lambda: readers.module_loaded(root, "nvidia"), False)
        self.messages = _safely(lambda: kmsg.read_kernel_log(root), [])
        self.minors = _safely(lambda: nodes_step.gpu_minors(root, self.gpus), {})
        self.failed_at = _safely(lambda: boot_failed_at(root), None)

    def run(self) -> list[Check]:
        """Every check, each on its own: one that raises becomes a ``fail`` row naming the
        error, and the others still run."""
        out = []
        for name in VM_CHECKS:
            method = getattr(self, "check_" + name.replace("-", "_"))
            out.append(isolated(name, lambda: self._not_reached(name) or method()))
        return out

    def _not_reached(self, name: str) -> Check | None:
        """A skip for a check of a step that the last boot never reached, because an earlier step
        failed: its state then follows from that failure, which the status check reports, and
        failing it too would bury the cause. The fabric manager's version is an exception (a
        property of the image, checked in any case)."""
        if name not in _STEP_ORDER or name == "fabricmanager" and self.nvswitches:
            return None
        if self.failed_at and _STEP_ORDER.index(self.failed_at) < _STEP_ORDER.index(name):
            return Check(name, SKIP, f"not reached: the last boot failed at {self.failed_at} "
                         "(see status)")
        return None

    def _needs_driver(self, name: str) -> Check | None:
        if not self.gpus:
            return Check(name, SKIP, NO_GPU)
        if not self.loaded:
            return Check(name, SKIP, "nvidia module not loaded (see modules)")
        return None

    def _not_arrived(self) -> Check | None:
        """A fail when a device the VM announced is not on PCI: a VMBus PCI pass-through channel
        without its PCI device, or fewer GPUs than ``detect.expected_gpus``."""
        if self.coming:
            # a channel without a driver first: its cause is in the image, not the host
            channel = min(self.coming, key=lambda c: c.driver is not None)
            more = f" (and {len(self.coming) - 1} more such channel(s))" if len(self.coming) > 1 \
                else ""
            hint = ("no driver is bound to the channel: load hv_pci (modprobe pci-hyperv; put it "
                    "in the initramfs)" if channel.driver is None else
                    "the host has not delivered the device: see dmesg | grep hv_pci, then "
                    "restart or redeploy the VM")
            return Check("pci", FAIL, f"{channel.describe()} has no PCI device{more}: Hyper-V "
                         "announced a pass-through device (a GPU) that is not on PCI", hint)
        expected = self.config.detect.expected_gpus
        if len(self.gpus) < expected:
            return Check("pci", FAIL, f"{len(self.gpus)} of the {expected} GPU(s) the image "
                         "expects (detect.expected_gpus) are on PCI",
                         "the VM has fewer GPUs than the image serves: check the VM size, or "
                         "lower detect.expected_gpus")
        return None

    def check_pci(self) -> Check:
        missing = self._not_arrived()
        if not self.gpus:
            if missing:
                return missing
            extra = f"; {len(self.nvswitches)} NVSwitch(es)" if self.nvswitches else ""
            return Check("pci", SKIP, f"{NO_GPU} ({self.scanned} devices scanned{extra}): "
                         "a CPU VM, GPU requests get the unavailable spec")
        names = ", ".join(sorted({g.name for g in self.gpus}))
        at_boot = {g.get("pci_address") for g in (read_status(self.root) or {}).get("gpus") or []}
        gone = sorted(at_boot - {g.pci_address for g in self.gpus})
        if gone:
            return Check("pci", FAIL, f"GPU(s) {', '.join(gone)} found at boot are gone from PCI",
                         "the GPU fell off the bus or was hot-removed: replace the VM")
        if missing:
            return missing
        fatal = [f for f in kmsg.findings(kmsg.since_driver_load(self.messages)) if f.fatal]
        if fatal:
            return Check("pci", FAIL, f"{len(self.gpus)} GPU(s) on PCI, but {fatal[0].describe()}",
                         "the GPU needs a reset (nvidia-smi -r) or the VM a new host")
        return Check("pci", PASS, f"{len(self.gpus)} GPU(s) ({names}) at "
                     f"{', '.join(g.pci_address for g in self.gpus)}; "
                     f"{len(self.nvswitches)} NVSwitch(es)")

    def check_drivers(self) -> Check:
        if not self.gpus:
            return Check("drivers", SKIP, NO_GPU)
        other = [g for g in self.gpus if g.driver and g.driver != "nvidia"]
        if other:
            g = other[0]
            mod = g.driver.replace("-", "_")
            return Check("drivers", FAIL, f"GPU {g.pci_address} is bound to {g.driver}, not nvidia",
                         f"blacklist {mod} in the image (modprobe.d: 'blacklist {mod}') and "
                         "rebuild it" if g.driver != "vfio-pci" else
                         "remove the vfio-pci binding (vfio-pci.ids= on the kernel command line)")
        unbound = [g.pci_address for g in self.gpus if not g.driver]
        if unbound:
            return Check("drivers", WARN if self.loaded else SKIP,
                         f"GPU(s) {', '.join(unbound)} bound to no driver",
                         "the nvidia module did not take them: see modules and the kernel log"
                         if self.loaded else "")
        return Check("drivers", PASS, f"all {len(self.gpus)} GPU(s) bound to nvidia")

    def check_modules(self) -> Check:
        if not self.gpus:
            return Check("modules", SKIP, NO_GPU)
        root = self.root
        missing = [m for m in modules_step.REQUIRED if not readers.module_loaded(root, m)]
        if not missing:
            version = readers.kernel_module_version(root) or "unknown version"
            return Check("modules", PASS, f"nvidia {version} and nvidia_uvm loaded")
        release = readers.kernel_release(root)
        detail = f"{', '.join(missing)} not loaded"
        resolved = [kmod.resolve(root, release, m, self.runner) for m in missing] if release else []
        lost = [r for r in resolved if not r.found and not r.blocked]
        if release and lost:
            return Check("modules", FAIL, f"{detail}: "
                         f"{modules_step.not_found_cause(root, release, lost[0].name)}",
                         f"install the nvidia modules for kernel {release} (DKMS or a prebuilt "
                         "package) and the modprobe.d rules of the driver package, or boot the "
                         "kernel the image has modules for")
        overrides = [o for m in missing for o in readers.modprobe_overrides(root, m)]
        if overrides:
            return Check("modules", FAIL, f"{detail}: modprobe.d overrides it: {'; '.join(overrides)}",
                         "remove that line from the image, then reboot")
        evidence = modules_step.refusal_evidence(root, self.messages, "nvidia")
        if evidence:
            return Check("modules", FAIL, f"{detail}: loading refused: {'; '.join(evidence)}",
                         "sign the nvidia modules with a key the kernel trusts (MOK), or boot "
                         "without what refuses them")
        found = kmsg.findings(self.messages)
        for f in reversed(found):
            if f.kind in ("unsupported-pci-id", "open-module-unsupported", "gsp-firmware", "bar",
                          "needs-reset", "fell-off-bus", "bound-elsewhere", "no-device"):
                hint = ("install a driver branch that supports this GPU" if f.kind ==
                        "unsupported-pci-id" else "see the kernel message; fix the VM or image")
                return Check("modules", FAIL, f"{detail}: {f.describe()}", hint)
        return Check("modules", FAIL, detail, "run 'modprobe nvidia' and read the kernel log")

    def check_versions(self) -> Check:
        skip = self._needs_driver("versions")
        if skip:
            return skip
        kernel = readers.kernel_module_version(self.root)
        lib = readers.find_nvml(self.root)
        if lib is None:
            other = readers.find_nvml_elsewhere(self.root)
            where = f"; found in {other.path.rsplit('/', 1)[0]}" if other else ""
            return Check("versions", FAIL, f"{readers.NVML_SONAME} not in the loader's "
                         f"directories{where}", "add its folder to /etc/ld.so.conf.d/ and run "
                         "ldconfig in the image" if other else "install the user-space driver")
        if lib.version != kernel:
            return Check("versions", FAIL, f"kernel module {kernel}, user space {lib.version} "
                         f"({lib.path} -> {lib.target})",
                         f"rebuild the image with matching driver {kernel} user space")
        return Check("versions", PASS, f"kernel module and user space both {kernel}")

    def check_device_nodes(self) -> Check:
        skip = self._needs_driver("device-nodes")
        if skip:
            return skip
        majors = readers.char_majors(self.root)
        for name in (readers.NVIDIA_MAJOR_NAME, readers.UVM_MAJOR_NAME):
            if name not in majors:
                return Check("device-nodes", FAIL, f"no '{name}' major in /proc/devices",
                             "the module did not register its devices: reload it and read "
                             "the kernel log")
        nodes = nodes_step.required_nodes(self.root, self.minors)
        problems = [p for p in (nodes_step.node_problem(self.root, n) for n in nodes) if p]
        if problems:
            return Check("device-nodes", FAIL, "; ".join(problems[:3]),
                         "run podvm-gpu boot (it creates them) or nvidia-ctk system "
                         "create-device-nodes --control-devices")
        return Check("device-nodes", PASS, f"{len(nodes)} character devices with majors "
                     f"{majors[readers.NVIDIA_MAJOR_NAME]}/{majors[readers.UVM_MAJOR_NAME]} "
                     "as in /proc/devices")

    def check_persistenced(self) -> Check:
        skip = self._needs_driver("persistenced")
        if skip:
            return skip
        pid = readers.daemon_pid(self.root, readers.PERSISTENCED_PID, readers.PERSISTENCED_COMM)
        if pid is None:
            return Check("persistenced", FAIL, "nvidia-persistenced is not running",
                         "boot starts it; see the persistenced step in podvm-gpu status")
        if not self.root.exists(readers.PERSISTENCED_SOCKET):
            return Check("persistenced", WARN, f"running (pid {pid}) but its socket "
                         f"{readers.PERSISTENCED_SOCKET} is missing: still initialising?",
                         "wait, then check again; see the kernel log if it stays so")
        return Check("persistenced", PASS, f"running (pid {pid}), socket present")

    def check_fabricmanager(self) -> Check:
        skip = self._needs_driver("fabricmanager")
        if skip:
            return skip
        driver = readers.kernel_module_version(self.root)
        if not self.nvswitches:
            note = ""
            if units.enabled_by(self.root, "nvidia-fabricmanager.service"):
                note = ("; the image's nvidia-fabricmanager.service is enabled and fails with "
                        "NV_WARN_NOTHING_TO_DO here, which is harmless")
            # shared-NVSwitch virtualization: the fabric is managed outside the VM, and the
            # GPUs still report it; one that never completed is as unusable as with NVSwitches
            done = self.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"], check=False)
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
        done = self.runner.run(["nv-fabricmanager", "--version"], check=False)
        fm = readers.version_in(done.output)
        if fm and driver and fm != driver:
            return Check("fabricmanager", FAIL, f"fabric manager {fm}, driver {driver}",
                         f"install the fabric manager package of driver {driver}")
        if self.failed_at and _STEP_ORDER.index(self.failed_at) < _STEP_ORDER.index("fabricmanager"):
            return Check("fabricmanager", SKIP, f"fabric manager {fm or '(version unknown)'}; not "
                         f"started: the last boot failed at {self.failed_at} (see status)")
        pid = readers.daemon_pid(self.root, readers.FABRICMANAGER_PID, readers.FABRICMANAGER_COMM)
        if pid is None:
            return Check("fabricmanager", FAIL, f"{len(self.nvswitches)} NVSwitch(es) but "
                         "nv-fabricmanager is not running", "see the fabricmanager step in "
                         "podvm-gpu status and /var/log/fabricmanager.log")
        states = readers.parse_fabric(self.runner.run(["nvidia-smi", "-q", "-d", "FABRIC"]).stdout)
        bad = [s for s in states if not s.success]
        if bad or not states:
            what = ", ".join(f"{s.gpu}: State {s.state}, Status {s.status}" for s in bad[:3])
            return Check("fabricmanager", FAIL, f"fabric not ready: {what or 'no state'}",
                         "read /var/log/fabricmanager.log")
        return Check("fabricmanager", PASS, f"running (pid {pid}); fabric Completed/Success on "
                     f"{len(states)} GPU(s)")

    def check_confidential_computing(self) -> Check:
        skip = self._needs_driver("confidential-computing")
        if skip:
            return skip
        done = self.runner.run(["nvidia-smi", "conf-compute", "-f"], check=False)
        no_driver = readers.nvsmi_no_driver(done.returncode, done.output)
        if no_driver:
            return Check("confidential-computing", FAIL, no_driver,
                         "see the modules and device-nodes checks and the kernel log")
        if "no cc capable" in done.output.lower():
            return Check("confidential-computing", SKIP, "the GPUs do not support CC")
        mode = readers.parse_cc_mode(done.output)
        if mode == "off":
            return Check("confidential-computing", SKIP, "CC mode is off")
        if mode != "on":
            return Check("confidential-computing", FAIL, f"CC mode unknown ({mode or 'no answer'}, "
                         f"exit {done.returncode})", "run nvidia-smi conf-compute -f by hand")
        grs = self.runner.run(["nvidia-smi", "conf-compute", "-grs"], check=False)
        state = readers.parse_ready_state(grs.output)
        if state == "ready":
            return Check("confidential-computing", PASS, "CC on, ready state ready")
        if state == "not-ready":
            return Check("confidential-computing", WARN, "CC on, ready state not-ready",
                         "the attestation flow sets it, or set confidential_computing."
                         "set_ready_state: true in the config")
        return Check("confidential-computing", FAIL, f"CC on, ready state unknown ({state})",
                     "run nvidia-smi conf-compute -grs by hand")

    def check_cdi_spec(self) -> Check:
        path = self.root.resolve(CDI_SPEC_PATH)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            if not self.gpus:
                return Check("cdi-spec", SKIP, f"{NO_GPU}; no {CDI_SPEC_PATH}",
                             "" if not self.config.unavailable_spec else
                             "boot writes the unavailable spec: has it run?")
            return Check("cdi-spec", FAIL, f"{CDI_SPEC_PATH} is missing",
                         "run podvm-gpu boot, or see podvm-gpu status")
        try:
            spec = parse_spec(text, source=CDI_SPEC_PATH)
        except CdiSpecError as err:
            return Check("cdi-spec", FAIL, str(err), "run podvm-gpu boot to regenerate it")
        names = spec.device_names()
        if names == [UNAVAILABLE_DEVICE]:
            if not self.gpus:
                return Check("cdi-spec", SKIP, f"{NO_GPU}; {CDI_SPEC_PATH} is the unavailable "
                             "spec, so GPU requests fail at once")
            return Check("cdi-spec", FAIL, f"{CDI_SPEC_PATH} is the unavailable spec: GPU setup "
                         "failed", "see the status check and podvm-gpu status")
        problems = check_ready_spec(spec, self.root, self.minors,
                                    readers.kernel_module_version(self.root))
        if problems:
            return Check("cdi-spec", FAIL, "; ".join(problems[:3]),
                         "run podvm-gpu boot to regenerate it")
        return Check("cdi-spec", PASS, f"{CDI_SPEC_PATH}: cdiVersion {spec.cdi_version}, "
                     f"{len(names)} devices, nodes and hooks present")

    def check_cdi_duplicates(self) -> Check:
        found = [(self.root.host_path(p), problem)
                 for folder in (cdi_dir.RUN_DIR, cdi_dir.ETC_DIR)
                 for p, problem in cdi_dir.other_specs(self.root, folder)]
        if found:
            what = ", ".join(f"{p} (could not be read: {problem})" if problem else p
                             for p, problem in found)
            return Check("cdi-duplicates", FAIL, f"also defining nvidia.com/gpu: {what}",
                         f"remove {found[0][0]}: it defines the same devices, and kata-agent "
                         "drops every device two specs define")
        return Check("cdi-duplicates", PASS, "no other spec defines nvidia.com/gpu")

    def check_status(self) -> Check:
        try:
            doc = load_status(self.root)
        except StatusUnreadable as err:
            return Check("status", FAIL, f"unreadable: {err}", "run podvm-gpu boot again")
        if doc is None:
            return Check("status", FAIL, "no /run/podvm-gpu/status.json: boot has not run",
                         "systemctl status podvm-gpu.service")
        state, reason = doc.get("state"), doc.get("reason")
        if state == State.FAILED:
            return Check("status", FAIL, f"boot failed: {reason}", "fix the cause, then rerun "
                         "podvm-gpu boot (or reboot)")
        if state == State.RUNNING:
            from podvm_gpu.status import ORPHANED, orphaned

            if orphaned(self.root, doc):
                return Check("status", FAIL, f"running, but {ORPHANED}",
                             "journalctl -u podvm-gpu -b; then systemctl restart podvm-gpu")
            return Check("status", WARN, "boot is still running", "podvm-gpu status --wait")
        warnings = doc.get("warnings") or []
        if warnings:
            return Check("status", WARN, f"{state} with {len(warnings)} warning(s): {warnings[0]}",
                         "podvm-gpu status lists them")
        return Check("status", PASS, f"{state}" + (f": {reason}" if reason else ""))

    def check_cdi_refresh_units(self) -> Check:
        return refresh_units_check(self.root)

    def check_kata_agent_ordering(self) -> Check:
        return kata_ordering_check(self.root)

    def check_kata_agent_cdi(self) -> Check:
        argv = units.exec_start(self.root, units.KATA_UNIT)
        said = None
        if self.root.is_host and argv and os.path.isabs(argv[0]):
            said = kata_agent_version(argv[0])
        return kata_cdi_check(self.root, argv, self.root.read_text("/proc/cmdline") or "", said)


def _safely(fact, default):
    """A fact for several checks, or ``default`` when reading it fails (each check that needs
    it then reports what it finds)."""
    try:
        return fact()
    except (OSError, ValueError, RecursionError):
        return default


def isolated(name: str, check) -> Check:
    """Run one check; a query that failed or any error becomes a ``fail`` row naming it."""
    try:
        return check()
    except CommandError as err:
        return Check(name, FAIL, f"query failed: {err}",
                     "run the command by hand to see why it fails or hangs")
    except Exception as err:  # one broken check must not hide the others
        return broken(name, err)


def broken(name: str, err: BaseException) -> Check:
    """The ``fail`` row of a check that raised instead of answering."""
    return Check(name, FAIL, f"the check itself failed: {type(err).__name__}: {err}",
                 "report this with the output of podvm-gpu check --json")


def boot_failed_at(root: Root) -> str | None:
    """The boot step (contract section 3) at which the last boot failed, or None."""
    doc = read_status(root) or {}
    if doc.get("state") != State.FAILED:
        return None
    failed = [s.get("name") for s in doc.get("steps") or [] if s.get("result") == "failed"]
    return failed[0] if failed and failed[0] in _STEP_ORDER else None


def refresh_units_check(root: Root) -> Check:
    """The toolkit's nvidia-cdi-refresh units must not be enabled beside the agent: they rewrite
    /var/run/cdi/nvidia.yaml with nvidia-ctk's output, unvalidated, whenever the driver changes."""
    enabled = [u for u in units.REFRESH_UNITS
               if units.enabled_by(root, u) and not units.masked(root, u)]
    if enabled:
        return Check("cdi-refresh-units", FAIL, f"enabled: {', '.join(enabled)}",
                     "mask them in the image: systemctl mask " + " ".join(units.REFRESH_UNITS))
    masked = [u for u in units.REFRESH_UNITS if units.masked(root, u)]
    return Check("cdi-refresh-units", PASS,
                 f"masked: {', '.join(masked)}" if masked else "not enabled")


def kata_ordering_check(root: Root) -> Check:
    """kata-agent.service must start after podvm-gpu.service (ordering, not just a target)."""
    if units.unit_file(root, units.KATA_UNIT) is None:
        return Check("kata-agent-ordering", SKIP, f"no {units.KATA_UNIT} installed")
    ok, how = units.ordered_before_kata(root)
    if not ok:
        return Check("kata-agent-ordering", FAIL, how, f"install the drop-in {units.KATA_UNIT}.d/"
                     f"10-podvm-gpu.conf (After= and Wants={units.AGENT_UNIT})")
    return Check("kata-agent-ordering", PASS, how)


def kata_agent_version(path: str) -> str | None:
    """``kata-agent --version`` of the VM's kata-agent (it prints and exits before reading any
    setting, main.rs), or None when it cannot say within the harmless-call limit."""
    from podvm_gpu.context import HARMLESS_CALL_S

    runner = Runner({"kata-agent": path}, {"kata-agent": HARMLESS_CALL_S}, read_only=True,
                    trust_tool_paths=True)
    try:
        return runner.run(["kata-agent", "--version"]).stdout
    except CommandError:
        return None


def kata_cdi_check(root: Root, argv: list[str] | None, cmdline: str | None,
                   version_text: str | None) -> Check:
    """What a GPU request meets on a CPU or failed VM, whose spec is the unavailable one
    (kata.py): kata-agent's ``cdi_timeout`` read from where that kata-agent reads it, and
    whether its version fails at once.

    Args:
        root: the VM's or image's root.
        argv: kata-agent's ``ExecStart`` argv (None: none found).
        cmdline: the VM's kernel command line; None for an image (it has none).
        version_text: what ``kata-agent --version`` printed, or None when not run.
    """
    name = "kata-agent-cdi"
    if units.unit_file(root, units.KATA_UNIT) is None:
        return Check(name, SKIP, f"no {units.KATA_UNIT} installed")
    wait = kata.cdi_wait(root, argv, cmdline)
    if wait.error:
        hint = ("write it as cdi_timeout = { secs = 100, nanos = 0 }" if "Duration" in wait.error
                else f"fix {wait.source}")
        return Check(name, FAIL, f"kata-agent will not start: {wait.error}", hint)
    timeout = (f"cdi_timeout {wait.seconds:g} s ({wait.source})" if wait.seconds is not None
               else f"cdi_timeout from {wait.source}")
    found = kata.version(version_text or "")
    if found is None:
        return Check(name, PASS, f"{timeout}; kata-agent's version not known here: 3.32.0 and "
                     "later fail a GPU request on a CPU or failed VM at once, older ones after "
                     "cdi_timeout")
    shown = ".".join(map(str, found))
    if found >= kata.FAILS_AT_ONCE_FROM:
        return Check(name, PASS, f"kata-agent {shown} fails a GPU request on a CPU or failed VM "
                     f"at once (the spec's kind lacks the device); {timeout}")
    return Check(name, WARN, f"kata-agent {shown} waits {timeout} before it fails a GPU request "
                 "on a CPU or failed VM, and its error lacks podvm-gpu's reason",
                 "kata-agent 3.32.0 and later fail at once; podvm-gpu status on the VM says why")


# --- check --image ----------------------------------------------------------------------------

IMAGE_TOOLS = ("nvidia-ctk", "nvidia-persistenced", "modprobe")


def image_kernels(root: Root) -> list[str]:
    """The image's kernels: releases of ``/boot/vmlinuz-*``, else the folders of /lib/modules."""
    boot = root.resolve("/boot")
    try:
        found = sorted(n[len("vmlinuz-"):] for n in os.listdir(boot) if n.startswith("vmlinuz-"))
    except OSError:
        found = []
    if found:
        return found
    try:
        return sorted(os.listdir(root.resolve("/lib/modules")))
    except OSError:
        return []


def module_file_version(runner: Runner, path: str) -> str | None:
    """A module file's version: ``modinfo -F version FILE``, else the ``version=`` string of its
    ``.modinfo`` section read from the file itself (plain, .xz or .gz; kmod.modinfo_fields)."""
    values = _modinfo(runner, path, "version")
    return readers.version_in(values[0]) if values else None


UNREADABLE_MODULE_HINT = ("run the check where modinfo is installed (in the image with "
                          "systemd-nspawn, as the Packer build does), or check that the file is a "
                          "kernel module")


def _modinfo(runner: Runner, path: str, field: str) -> list[str]:
    """``modinfo -F FIELD FILE`` (one value a line), else the file's own ``.modinfo`` strings."""
    try:
        done = runner.run(["modinfo", "-F", field, path], check=False)
        values = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if done.returncode == 0 and values:
            return values
    except CommandError:
        pass
    return kmod.modinfo_fields(path, field)


# The firmware loader's search path (drivers/base/firmware_loader/main.c) and the compressed
# forms kernel 6.1 reads (CONFIG_FW_LOADER_COMPRESS: .xz, .zst).
_FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                  "/lib/firmware")
_FIRMWARE_SUFFIXES = ("", ".xz", ".zst")


def firmware_present(root: Root, release: str, name: str) -> str | None:
    """The host path of firmware file ``name`` (as a module names it) where the kernel finds it,
    or None."""
    for folder in _FIRMWARE_DIRS:
        for suffix in _FIRMWARE_SUFFIXES:
            path = f"{folder.format(release=release)}/{name}{suffix}"
            if os.path.isfile(root.resolve(path)):
                return path
    return None


def _modules_check(root: Root, kernels: list[str], found: dict[str, dict[str, kmod.Resolution]]) -> Check:
    if not kernels:
        return Check("modules", FAIL, "no kernel in the image (/boot/vmlinuz-*, /lib/modules)",
                     "install a kernel")
    for release in kernels:
        for name, res in found[release].items():
            if res.blocked:
                return Check("modules", FAIL, f"kernel {release}: modprobe {name} loads nothing: "
                             f"{res.blocked}", "remove that line from the image")
    for release in kernels:
        for name, res in found[release].items():
            gone = kmod.absent_file(root, res)
            if gone:
                return Check("modules", FAIL, f"kernel {release}: modprobe {name} reaches {gone}",
                             f"run depmod {release} in the image after removing or rebuilding "
                             "modules, or install the module again (dkms install, or the "
                             "driver package)")
    lacking = [(k, name) for k in kernels for name, res in found[k].items() if not res.found]
    if lacking:
        release, name = lacking[0]
        why = kmod.unreached(root, release, name)
        if why:
            return Check("modules", FAIL, f"kernel {release}: modprobe {name} finds no module: {why}",
                         f"run depmod {release} in the image" if "depmod" in why else
                         "install the driver package's modprobe.d rules (Debian: "
                         "/etc/modprobe.d/nvidia.conf, set up with libcuda1) or add "
                         f"'install {name} modprobe -i <file name> $CMDLINE_OPTS'")
        kernels_lacking = sorted({k for k, _ in lacking})
        reason, hint = dkms.why_not_built(root, kernels_lacking) or (
            "", "build the nvidia modules (DKMS) for every kernel in the image")
        return Check("modules", FAIL, f"no {name} module for kernel(s) {', '.join(kernels_lacking)} "
                     f"(/lib/modules/{release})" + (f": {reason}" if reason else ""), hint)

    def shown(res: kmod.Resolution) -> str:
        via = f" via {res.rules[0].split(': ', 1)[-1]}" if res.rules else ""
        return f"{res.file}{via}" if res.file else "built in"

    return Check("modules", PASS, "; ".join(
        f"{k}: nvidia -> {shown(found[k]['nvidia'])}" for k in kernels) +
        f" ({next(iter(found[kernels[0]].values())).source})")


def present_modules(root: Root, found: dict[str, dict[str, kmod.Resolution]]) -> dict[str, str]:
    """Kernel -> host path of the nvidia module file ``modprobe nvidia`` reaches, where there is
    one in the image (the modules row says why others have none)."""
    return {k: r["nvidia"].file for k, r in found.items()
            if r["nvidia"].file and not kmod.absent_file(root, r["nvidia"])}


def no_module_to_read(name: str, what: str) -> Check:
    """The row of a check that reads the nvidia module when the image has none to read: not
    passed (nothing was compared), not failed twice for one cause (the modules row fails)."""
    return Check(name, SKIP, f"no nvidia module in the image to read {what} from (see modules)",
                 "fix the modules row first")


def _firmware_check(root: Root, runner: Runner, found: dict[str, dict[str, kmod.Resolution]]) -> Check:
    """The firmware files the nvidia module asks for (``modinfo -F firmware``, the GSP images of
    535) must be where the kernel's loader finds them, or the driver fails on GSP GPUs."""
    asked: list[tuple[str, str, str]] = []
    unreadable: list[str] = []
    if not present_modules(root, found):
        return no_module_to_read("firmware", "the firmware it asks for")
    for release, resolved in found.items():
        res = resolved.get("nvidia")
        if res and res.file and not kmod.absent_file(root, res):
            names = _modinfo(runner, root.resolve(res.file), "firmware")
            if not names and not any(_modinfo(runner, root.resolve(res.file), key)
                                     for key in ("vermagic", "version")):
                unreadable.append(res.file)  # no .modinfo at all: not "asks for none"
            asked += [(release, res.file, name) for name in names]
    missing = [(k, f, n) for k, f, n in asked if firmware_present(root, k, n) is None]
    if missing:
        release, module, name = missing[0]
        return Check("firmware", FAIL, f"{module} asks for firmware {name}, not under /lib/firmware"
                     + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                     "install the driver's GSP firmware package (Debian: firmware-nvidia-gsp)")
    if unreadable:
        return Check("firmware", FAIL, f"cannot read the .modinfo of {unreadable[0]}"
                     + (f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else "")
                     + ": the firmware it asks for is unknown", UNREADABLE_MODULE_HINT)
    if not asked:
        return Check("firmware", PASS, "the nvidia module asks for no firmware files")
    names = sorted({n for _, _, n in asked})
    return Check("firmware", PASS, f"{', '.join(names)} present under /lib/firmware")


def image_checks(root: Root, config: Config, runner: Runner) -> list[Check]:
    """Contract section 6: what an image needs before it ships."""
    out: list[Check] = []
    unit = units.unit_file(root, units.AGENT_UNIT)
    wants = units.enabled_by(root, units.AGENT_UNIT)
    if unit is None:
        out.append(Check("unit", FAIL, f"{units.AGENT_UNIT} is not installed",
                         "install systemd/podvm-gpu.service into the image"))
    elif not wants:
        out.append(Check("unit", FAIL, f"{unit} installed but not enabled",
                         f"systemctl enable {units.AGENT_UNIT} in the image"))
    else:
        out.append(Check("unit", PASS, f"{unit}, enabled by {', '.join(wants)}"))
    if units.unit_file(root, units.KATA_UNIT) is None:
        ok, how = units.ordered_before_kata(root)
        out.append(Check("kata-agent-ordering", PASS if ok else FAIL,
                         f"{units.KATA_UNIT} not in the image yet; {how}",
                         "" if ok else f"add Before={units.KATA_UNIT} or the kata-agent drop-in"))
    else:
        out.append(kata_ordering_check(root))
    out.append(kata_cdi_check(root, units.exec_start(root, units.KATA_UNIT), None, None))
    present, missing = image_tools.find_tools(root, IMAGE_TOOLS, config.tools)
    out.append(Check("tools", FAIL, f"missing: {', '.join(missing)}",
                     "install nvidia-container-toolkit, the driver's persistenced and kmod, or fix "
                     "the config's tools: paths")
               if missing else Check("tools", PASS, f"{', '.join(present)} present"))
    kernels = image_kernels(root)
    # what `modprobe nvidia` and `modprobe nvidia_uvm` load for each kernel (kmod.py)
    found = {k: {m: kmod.resolve(root, k, m, runner) for m in modules_step.REQUIRED} for k in kernels}
    out.append(_modules_check(root, kernels, found))
    lib = readers.find_nvml(root)
    files = present_modules(root, found)
    module_versions = {k: module_file_version(runner, root.resolve(f)) for k, f in files.items()}
    if lib is None:
        out.append(Check("versions", FAIL, f"{readers.NVML_SONAME} not in the loader's directories",
                         "install the user-space driver (libnvidia-ml) in the image"))
    elif not files:
        out.append(no_module_to_read("versions", "a version"))
    else:
        wrong = {k: v for k, v in module_versions.items() if v != lib.version}
        if wrong:
            k, v = next(iter(wrong.items()))
            if v:
                out.append(Check("versions", FAIL, f"module {files[k]} is {v}, "
                                 f"user space {lib.path} is {lib.version}",
                                 f"rebuild the image with matching driver {lib.version} modules"))
            else:
                out.append(Check("versions", FAIL, f"cannot read the version of module {files[k]} "
                                 f"(user space {lib.path} is {lib.version})",
                                 UNREADABLE_MODULE_HINT))
        else:
            out.append(Check("versions", PASS, f"modules and user space all {lib.version}"))
    out.append(_firmware_check(root, runner, found))
    out.append(refresh_units_check(root))
    out.append(trust_check(root, config))
    out.append(compiled_config_check(root))
    return out


def compiled_config_check(root: Root) -> Check:
    """A config in the image should have its current compiled form: without it every CPU pod VM
    parses the YAML at boot (about 20 ms, PyYAML's import); a stale one is ignored (config.py)."""
    from podvm_gpu.config import compiled_state

    try:
        path, present = config_location(root, None)
    except ConfigError as err:
        return Check("config-compiled", FAIL, str(err), "fix the links in the image")
    if not present:
        return Check("config-compiled", SKIP, f"no {CONFIG_PATH} in the image")
    if not os.path.exists(path):
        return Check("config-compiled", FAIL, f"{CONFIG_PATH} is a link to nothing "
                     f"({path if root.is_host else path.replace(root.path, '', 1)}): boot ends "
                     "failed on it", "fix the link, or remove it for the defaults")
    why = compiled_state(path)
    if why:
        shown = why if root.is_host else why.replace(root.path, "", 1)
        return Check("config-compiled", WARN, f"{shown}: boot parses the YAML itself (PyYAML, "
                     "about 20 ms on every CPU pod VM)", "run podvm-gpu config --compile in the "
                     "image after changing the config (the installer does it)")
    return Check("config-compiled", PASS, f"{CONFIG_PATH}.compiled.json is current")


def trust_check(root: Root, config: Config) -> Check:
    """The config file and the tool paths it names must be changeable by root alone: boot
    refuses them otherwise (it runs those tools as root). A file that group or others may
    write fails; one owned by another user only warns, since an image built by an unprivileged
    builder has the builder's files until it is packed (they must be root's in the image)."""
    from podvm_gpu.config import trust_problems

    paths = [CONFIG_PATH] + sorted(config.tools.values())
    owners = frozenset({0})
    mode, owner = [], []
    for host_path in paths:
        try:
            real = root.resolve(host_path)
        except OSError:
            continue
        if not os.path.lexists(real):
            continue
        for kind, text in trust_problems(real, owners=owners, stop_at=root.path):
            if not root.is_host:  # name the image's folders as the image has them
                text = text.replace(root.path + "/", "/").replace(root.path, "/")
            (mode if kind == "mode" else owner).append(f"{host_path}: {text}")
    if mode:
        return Check("trust", FAIL, "; ".join(mode[:3]), "chmod go-w them: boot refuses a config "
                     "or tool that someone other than root could change")
    if owner:
        return Check("trust", WARN, "; ".join(owner[:3]), "make them root's in the image (an "
                     "unprivileged build owns its files until they are packed): boot refuses "
                     "them otherwise")
    return Check("trust", PASS, "the config and the tools it names are root's alone")


# --- entry point -----------------------------------------------------------------------------

def run_check(root_dir: str, config_path: str | None, json_out: bool, image: bool) -> int:
    """Run the checks, print them, return 0 when none failed, else 1 (contract section 1)."""
    root = Root(root_dir)
    config_note = None
    try:
        # on a VM, a config boot refuses (others could write it) is a bad config here too; in
        # an image the builder may still own it, and the trust row judges that
        path, required = config_location(root, config_path)
        config = load_config(path, required=required, trusted=not image)
    except ConfigError as err:
        config, config_note = Config(), Check("config", FAIL, str(err), "fix the config file")
    # check runs as root too: as boot does, it runs no tool that another user could replace
    runner = Runner(config.tools, timeouts_for(config), read_only=True, trust_tool_paths=True)
    if image:
        checks = image_checks(root, config, runner)
    else:
        try:
            checks = VmChecks(root, config, runner).run()
        except Exception as err:  # discovery itself failed: say so, as a row
            checks = [broken("pci", err)]
    if config_note:
        checks.insert(0, config_note)
    code = 1 if any(c.result == FAIL for c in checks) else 0
    summary = {r: sum(1 for c in checks if c.result == r) for r in (PASS, WARN, FAIL, SKIP)}
    if json_out:
        print(json.dumps({"checks": [c.to_dict() for c in checks],
                          "summary": {**summary, "mode": "image" if image else "vm",
                                      "exit": code}}, indent=2))
    else:
        print_table(checks, summary)
    return code


def print_table(checks: list[Check], summary: dict[str, int]) -> None:
    """An aligned table (result, check, detail, hint) and a summary line, as plain text: no
    markup language, so a detail quoting a tool or the kernel (``[/...]``) prints as it is."""
    from podvm_gpu.status import shown

    rows = [("result", "check", "detail", "hint")]
    rows += [(c.result, c.name, shown(" ".join(c.detail.split())), shown(" ".join(c.hint.split())))
             for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
        out.append("  ".join(cells).rstrip())
    verdict = "FAILED" if summary[FAIL] else "OK"
    out.append(f"{verdict}: {summary[PASS]} pass, {summary[WARN]} warn, {summary[FAIL]} fail, "
               f"{summary[SKIP]} skip")
    sys.stdout.write("\n".join(out) + "\n")
