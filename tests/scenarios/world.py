"""Scenario worlds: a case file turned into a fake root, fake tools and PCI devices, and product runs in it.

A world lives in one short temporary directory (``effects.Layout``): the root the product gets as
``--root``, ``bin/`` with one fake tool per tool name (``fake_tool.py``), the call log, the state
that effects change, the umockdev PCI tree. The product runs as
``umockdev-run -d <tree> -- <python> -m podvm_gpu boot --root <root> --json`` with ``PATH=<bin>``
only (no real modprobe on the test machine is ever run) and the world directory as its cwd.
``PODVM_GPU_CMD`` replaces ``<python> -m podvm_gpu`` (e.g. an installed ``podvm-gpu``).

Case files come from ``tests/data/cases`` (the project's copy), ``../shared/cases`` (wins for the
same file name), every folder in ``PODVM_GPU_CASES`` (``:``-separated) and
``tests/scenarios/cases`` (the project's own scenarios).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import yaml

from podvm_gpu.host.rtmr import RTMR3_PATH

from . import effects as fx
from . import fake_server, testbed, toolkit_ctk
from .effects import kmsg_level, kmsg_priority  # noqa: F401 (the harness unit tests import them here)

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DATA = TESTS / "data"
SHARED = REPO.parent / "shared"
OWN_CASES = Path(__file__).resolve().parent / "cases"
FIXTURES = Path("fixtures") / "nvidia-ctk"
DEFAULT_TOOLS = ("modprobe", "nvidia-ctk", "nvidia-persistenced", "nvidia-smi", "nv-fabricmanager",
                 "nvidia-modprobe", "systemctl", "ldconfig", "modinfo")
STATUS_PATH = "/run/podvm-gpu/status.json"
CDI_PATH = "/var/run/cdi/nvidia.yaml"
DEFAULT_LIMIT_S = 60  # for a run without max_wall_s (check): a hung run is still ended
GRACE_S = 10  # how long past max_wall_s a run may go before the harness ends it

CASE_KEYS = {"id", "title", "source", "bug", "note", "pci", "files", "symlinks", "kernel_log",
             "tools", "expect", "vmbus", "pci_late", "infiniband", "nvattest", "rtmr3", "toolkit"}
HOOK_PATH = "usr/bin/nvidia-cdi-hook"  # where nvidia-ctk's specs name the hook binary
PCI_KEYS = {"address", "vendor", "device", "class", "driver", "subsystem_vendor", "subsystem_device",
            "vmbus", "vpd", "nvml"}
IB_KEYS = {"name", "pci", "cap_mask", "gid0"}
PCI_LATE_KEYS = PCI_KEYS | {"after_s"}
VMBUS_KEYS = {"instance", "class_id", "device_id", "driver"}
RULE_KEYS = {"argv", "rc", "stdout", "stderr", "delay_s", "effects", "only_before",
             "keep_output_s", "kernel_log_during"}
BOOT_EXPECT_KEYS = {"state", "exit", "reason_contains", "max_wall_s", "not_called", "cdi", "gpus",
                    "nvswitches", "cdi_devices", "not_killed", "step_messages",
                    "warnings_contains", "warnings_only", "called", "attestation", "absent",
                    "binding", "nvidia_ctk_version", "attach"}
CHECK_EXPECT_KEYS = {"exit", "fails", "warns", "passes", "skips"}
EXPECT_KEYS = {"boot": BOOT_EXPECT_KEYS, "rerun": BOOT_EXPECT_KEYS, "check": CHECK_EXPECT_KEYS}
CDI_EXPECTATIONS = ("ready-spec", "unavailable", "absent")

# The nvattest stand-in (tests/nvattest_standin.py), on PATH only in a world whose case has an
# ``nvattest`` plan: each call is logged like a fake tool's, then the stand-in answers.
NVATTEST_SCRIPT = '''#!{python} -IS
"""nvattest stand-in of scenario {case_id}: plan {plan} (tests/nvattest_standin.py)."""
import os, signal, sys
sys.path.insert(0, {tests!r})
os.environ["NVATTEST_STANDIN_PLAN"] = {plan!r}
from scenarios.fake_tool import CallLog, _log_signals
import nvattest_standin
import json
log = CallLog({calls!r})
with open({state!r}) as f:
    phase = json.load(f).get("run", "")
log.write("start", pid=os.getpid(), ppid=os.getppid(), run=phase, argv=["nvattest", *sys.argv[1:]])
_log_signals(log)
rc = nvattest_standin.main(sys.argv[1:])
log.write("end", rc=rc, answer="nvattest stand-in", applied=[])
sys.exit(rc)
'''


class CaseError(Exception):
    """A case file that does not follow shared/cases/README.md and EFFECTS.md."""


class UnmatchedCallWarning(UserWarning):
    """The product made calls no rule of the case answers (they got exit 127)."""


class UmockdevCrashWarning(UserWarning):
    """umockdev-run died of SIGSEGV before the product did anything; the run was repeated."""


def _umockdev_crash(rc: int | None, wall: float, out: Path, err: Path, calls: int) -> bool:
    """True for a run that died of SIGSEGV at once, silent and without calling any tool. The
    product is Python: its own failures exit with a status, never SIGSEGV, and it always logs."""
    return (rc == -signal.SIGSEGV and wall < 1.0 and calls == 0
            and out.stat().st_size == 0 and err.stat().st_size == 0)


@dataclasses.dataclass
class Case:
    """A loaded, checked case file (field meanings: shared/cases/README.md, EFFECTS.md)."""

    path: Path
    id: str
    pci: list[dict]
    vmbus: list[dict]
    pci_late: list[dict]
    files: dict
    symlinks: dict
    kernel_log: list[str]
    tools: list[dict]
    expect: dict
    infiniband: list = ()
    nvattest: dict | None = None  # the stand-in's plan (tests/nvattest_standin.py), or None
    # a TDX rtmr3:sha384 served by tests/fake_rtmr's shim: {} or {"fail": "refuse"|"wrong"}
    rtmr3: dict | None = None
    toolkit: dict | None = None  # the case's toolkit versions (toolkit_ctk.versions), or None

    @property
    def shared(self) -> bool:
        """True for a shared case (every folder but the project's own ``tests/scenarios/cases``):
        a call no rule of a shared case answers fails its test (issue 21 item 11), since each
        shared case has a rule for every query a contract-following product makes."""
        return self.path.parent.resolve() != OWN_CASES

    @property
    def gpu_count(self) -> int:
        """NVIDIA GPUs of the VM, the late ones included (a ready boot has waited for them)."""
        return sum(fx.is_nvidia_gpu(dev) for dev in self.pci + self.pci_late)

    @property
    def phases(self) -> list[str]:
        """The product runs of the case, in order: boot, rerun if expected, and check always:
        every world's ``check`` must answer each row (issue 35 item 1: a row that crashed in 8
        shared worlds went unseen while only the cases with ``expect.check`` ran check)."""
        return ["boot"] + (["rerun"] if "rerun" in self.expect else []) + ["check"]

    @property
    def fixture_dirs(self) -> list[str]:
        """Where ``write_spec`` looks: next to the case's folder, then shared, then the project copy."""
        dirs = [self.path.parent.parent / FIXTURES, SHARED / FIXTURES, DATA / FIXTURES]
        return list(dict.fromkeys(str(d) for d in dirs if d.is_dir()))


def json_specs(case: Case) -> dict[str, str]:
    """The ``--format=json`` text of every YAML fixture the case's ``write_spec`` effects name
    (:func:`scenarios.effects.yaml_spec_as_json`), by fixture name."""
    out = {}
    for rule in case.tools:
        for effect in rule.get("effects") or []:
            name = effect.get("write_spec") if isinstance(effect, dict) else None
            if not isinstance(name, str) or not name.endswith(".yaml"):
                continue
            base = name.removeprefix("fixtures/nvidia-ctk/")
            for directory in case.fixture_dirs:
                candidate = Path(directory) / base
                if candidate.is_file():
                    out[base] = fx.yaml_spec_as_json(candidate.read_text())
                    break
    return out


def case_files() -> list[Path]:
    """Every case file to run; a later folder wins for the same file name (see module docstring)."""
    folders = [DATA / "cases", SHARED / "cases"]
    folders += [Path(p) for p in os.environ.get("PODVM_GPU_CASES", "").split(":") if p]
    folders.append(OWN_CASES)
    files: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            files[path.name] = path
    return sorted(files.values(), key=lambda path: path.name)


def case_id(path: Path) -> str:
    """The case's ``id`` for the test name; the file name when the file does not give one."""
    try:
        return str(yaml.safe_load(path.read_text())["id"])
    except (yaml.YAMLError, OSError, TypeError, KeyError):
        return path.stem


def load_case(path: Path) -> Case:
    """Read and check a case file.

    Raises:
        CaseError: unknown keys, malformed rules or effects, unknown expect keys.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CaseError(f"{path}: not YAML: {err}") from err
    if not isinstance(data, dict) or "id" not in data:
        raise CaseError(f"{path}: not a case (a mapping with an id)")
    problems = [f"unknown key {key!r}" for key in set(data) - CASE_KEYS]
    pci, pci_late = data.get("pci") or [], data.get("pci_late") or []
    vmbus = data.get("vmbus") or []
    problems += _device_problems(pci, pci_late, vmbus)
    infiniband = data.get("infiniband") or []
    addresses = {str(dev.get("address")) for dev in pci if isinstance(dev, dict)}
    for ib in infiniband:
        if not isinstance(ib, dict) or set(ib) != IB_KEYS or str(ib["pci"]) not in addresses:
            problems.append(f"infiniband entry {ib!r} needs exactly {sorted(IB_KEYS)}, its pci "
                            "one of the case's pci addresses")
    tools = [_rule(rule, problems) for rule in data.get("tools") or []]
    expect = data.get("expect") or {}
    for phase, block in expect.items():
        if phase not in EXPECT_KEYS:
            problems.append(f"unknown expect block {phase!r}")
            continue
        problems += [f"expect.{phase}: unknown key {key!r}" for key in set(block) - EXPECT_KEYS[phase]]
        if block.get("cdi", "ready-spec") not in CDI_EXPECTATIONS:
            problems.append(f"expect.{phase}.cdi must be one of {CDI_EXPECTATIONS}")
    if data.get("nvattest") is not None and not isinstance(data["nvattest"], dict):
        problems.append("nvattest must be the stand-in's plan, a mapping")
    rtmr3 = data.get("rtmr3")
    if rtmr3 is not None and (not isinstance(rtmr3, dict) or set(rtmr3) - {"fail"} or
                              rtmr3.get("fail") not in (None, "refuse", "wrong")):
        problems.append("rtmr3 must be a mapping, with fail: refuse or wrong at most")
    toolkit = None
    if data.get("toolkit") is not None:
        try:
            toolkit = toolkit_ctk.versions(data["toolkit"])
        except ValueError as err:
            problems.append(str(err))
    if problems:
        raise CaseError(f"{path}: " + "; ".join(problems))
    return Case(nvattest=data.get("nvattest"), rtmr3=rtmr3, toolkit=toolkit, path=path,
                id=str(data["id"]), pci=pci, vmbus=vmbus, pci_late=pci_late,
                files=data.get("files") or {},
                symlinks=data.get("symlinks") or {}, kernel_log=data.get("kernel_log") or [],
                tools=tools, expect=expect, infiniband=infiniband)


def _device_problems(pci: list[dict], pci_late: list[dict], vmbus: list[dict]) -> list[str]:
    """What is wrong with a case's ``pci``, ``pci_late`` and ``vmbus`` entries (EFFECTS.md)."""
    problems = []
    required = {"address", "vendor", "device", "class"}
    for key, entries, allowed in (("pci", pci, PCI_KEYS), ("pci_late", pci_late, PCI_LATE_KEYS)):
        for dev in entries:
            if not isinstance(dev, dict) or not required <= set(dev) or set(dev) - allowed:
                problems.append(f"{key} entry {dev!r} needs address, vendor, device, class only "
                                f"plus {sorted(allowed - required)}")
    instances = [str(ch.get("instance")) for ch in vmbus if isinstance(ch, dict)]
    for ch in vmbus:
        if not isinstance(ch, dict) or not {"instance", "class_id"} <= set(ch) or \
                set(ch) - VMBUS_KEYS:
            problems.append(f"vmbus entry {ch!r} needs instance and class_id only plus "
                            f"{sorted(VMBUS_KEYS - {'instance', 'class_id'})}")
    for dev in [d for d in pci + pci_late if isinstance(d, dict)]:
        if dev.get("vmbus") and str(dev["vmbus"]) not in instances:
            problems.append(f"{dev.get('address')} sits behind VMBus channel {dev['vmbus']!r}, "
                            "which the case's vmbus list lacks")
        if "after_s" in dev and (isinstance(dev["after_s"], bool)
                                 or not isinstance(dev["after_s"], (int, float))):
            problems.append(f"pci_late {dev.get('address')}: after_s must be a number of seconds")
    addresses = [str(d.get("address")) for d in pci + pci_late if isinstance(d, dict)]
    problems += [f"PCI address {a} is listed twice" for a in sorted(set(addresses))
                 if addresses.count(a) > 1]
    return problems


def _rule(rule: dict, problems: list[str]) -> dict:
    """A tool rule with argv items as strings and every key present."""
    if not isinstance(rule, dict) or not rule.get("argv"):
        problems.append(f"tool rule {rule!r} has no argv")
        return {}
    problems += [f"rule {rule['argv']}: unknown key {key!r}" for key in set(rule) - RULE_KEYS]
    for effect in rule.get("effects") or []:
        try:
            fx.validate_effect(effect)
        except fx.EffectError as err:
            problems.append(f"rule {rule['argv']}: {err}")
    for name in rule.get("only_before") or {}:
        if name not in fx.EFFECTS:
            problems.append(f"rule {rule['argv']}: only_before names unknown effect {name!r}")
    during = rule.get("kernel_log_during") or []
    for entry in during:
        if not (isinstance(entry, dict) and set(entry) == {"after_s", "line"}
                and isinstance(entry["line"], str) and fx._LEVEL.match(entry["line"])
                and isinstance(entry["after_s"], (int, float)) and entry["after_s"] >= 0):
            problems.append(f"rule {rule['argv']}: kernel_log_during entry {entry!r} must be "
                            "{after_s: <seconds >= 0>, line: '<0>..<7> message'}")
    return {"argv": [str(arg) for arg in rule["argv"]], "rc": int(rule.get("rc", 0)),
            "stdout": rule.get("stdout") or "", "stderr": rule.get("stderr") or "",
            "delay_s": float(rule.get("delay_s", 0)), "effects": rule.get("effects") or [],
            "only_before": rule.get("only_before") or {},
            "keep_output_s": float(rule.get("keep_output_s", 0)),
            "kernel_log_during": during}


def kmsg_records(messages: list[str]) -> str:
    """The text of ``/dev/kmsg``: one ``<prio>,<seq>,<usec>,-;<message>`` record a line."""
    records = (kmsg_level(line) for line in messages)
    return "".join(f"{level},{seq},{1_000_000 + 1000 * seq},-;{message}\n"
                   for seq, (level, message) in enumerate(records))


def umockdev_tree(pci: list[dict], bindings: dict, vmbus: list[dict] = (),
                  infiniband: list[dict] = ()) -> str:
    """The VMBus channels, then the PCI devices (each bound to its driver in ``bindings``), then
    the InfiniBand devices below their PCI functions, as a umockdev-record text file
    (``testbed.py``)."""
    records = [testbed.vmbus_record(channel) for channel in vmbus]
    records += [testbed.pci_record(dev, bindings.get(dev["address"])) for dev in pci]
    by_address = {dev["address"]: dev for dev in pci}
    records += [testbed.ib_record(ib, by_address[ib["pci"]]) for ib in infiniband
                if ib["pci"] in by_address]
    return "\n".join(records)


def product_command() -> list[str]:
    """The product's argv prefix: ``PODVM_GPU_CMD`` (split like a shell would) or ``<python> -m podvm_gpu``."""
    override = os.environ.get("PODVM_GPU_CMD")
    if not override:
        return [sys.executable, "-m", "podvm_gpu"]
    argv = shlex.split(override)
    argv[0] = shutil.which(argv[0]) or argv[0]
    return argv


@dataclasses.dataclass
class Call:
    """One call of a fake tool, from the call log."""

    id: str
    pid: int
    run: str
    argv: list[str]
    started: float
    ended: float | None = None
    rc: int | None = None  # None: no exit recorded (still running, or killed)
    answer: str = ""  # "rule N", "harness", "unmatched", ...
    ppid: int | None = None  # the process that ran the tool (the product)
    applied: list[str] = dataclasses.field(default_factory=list)
    signals: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Run:
    """One product run in a world and what the harness saw of it."""

    phase: str  # boot, rerun or check
    argv: list[str]
    rc: int | None  # None: the harness ended it after limit_s
    wall_s: float
    limit_s: float
    stdout: str
    stderr: str
    status: dict | None
    status_error: str | None
    calls: list[Call]  # the calls made during this run
    alive_at_exit: set[int]  # pids of the world's processes alive when the product exited
    daemons: list[dict]  # stand-ins started so far: {"tool", "pid"}
    root_changes: list[str]  # check only: files under the root it created, changed or removed
    arrivals: list[dict] = dataclasses.field(default_factory=list)  # pci_late devices added live


class LateArrivals(threading.Thread):
    """Adds the ``pci_late`` devices that have not arrived to the world's live testbeds, each
    ``after_s`` seconds after the product started, until :attr:`stop` is set (the run ended).

    Args:
        world: the world whose testbeds (``layout.tmp``) get the devices.
        started: the product's start, ``time.monotonic()``.
        devices: the ``pci_late`` entries to add.
    """

    def __init__(self, world: World, started: float, devices: list[dict]):
        super().__init__(name=f"late-pci-{world.case.id}", daemon=True)
        self.world, self.started = world, started
        self.devices = sorted(devices, key=lambda dev: float(dev.get("after_s", 0)))
        self.stop = threading.Event()

    def run(self) -> None:
        for dev in self.devices:
            if self.stop.wait(max(0.0, self.started + float(dev.get("after_s", 0))
                                  - time.monotonic())):
                return
            self.world.arrive(dev, time.monotonic() - self.started)


class World:
    """A case's world; a context manager that ends every process the world started and removes it.

    Set ``PODVM_GPU_KEEP_WORLD=1`` to keep the directory for a look after the test.
    """

    def __init__(self, case: Case):
        self.case = case
        # PODVM_GPU_WORLD_DIR: where worlds live (bench/run.py puts them on tmpfs, as /run is)
        self.layout = fx.Layout(tempfile.mkdtemp(
            prefix="pg", dir=os.environ.get("PODVM_GPU_WORLD_DIR") or "/tmp"))
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def path(self, host_path: str) -> str:
        """A path inside the world's root, resolved chroot-style."""
        return fx.chroot_resolve(self.layout.root, host_path)

    def _build(self) -> None:
        layout, case = self.layout, self.case
        for directory in (layout.root, layout.bin, layout.out, layout.tmp):
            os.makedirs(directory)
        # Links first, so a file below a linked folder (var/run -> /run) lands where the link says.
        for link, target in case.symlinks.items():
            path = self._parent_resolved(link)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(target, path)
        for name, value in case.files.items():
            content, mode = (value.get("content", ""), int(str(value.get("mode", "0644")), 8)) \
                if isinstance(value, dict) else (value, 0o644)
            path = self._parent_resolved(name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).write_text(content or "")
            os.chmod(path, mode)
        kmsg = self.path("/dev/kmsg")
        os.makedirs(os.path.dirname(kmsg), exist_ok=True)
        Path(kmsg).write_text(kmsg_records(case.kernel_log))
        self._config = {"case_id": case.id, "rules": case.tools, "pci": case.pci,
                        "infiniband": list(case.infiniband),
                        "pci_late": case.pci_late, "vmbus": case.vmbus,
                        "fixture_dirs": case.fixture_dirs, "python": sys.executable,
                        "json_specs": json_specs(case),
                        "toolkit": case.toolkit or toolkit_ctk.versions(None),
                        "created": time.time()}  # the kernel_log effect's record clock
        Path(layout.config).write_text(json.dumps(self._config, indent=1))
        Path(layout.state).write_text(json.dumps(fx.initial_state(case.pci, case.pci_late),
                                                 indent=1))
        Path(layout.calls).touch()
        tools = dict.fromkeys(DEFAULT_TOOLS)
        tools.update(dict.fromkeys(rule["argv"][0] for rule in case.tools))
        for tool in tools:
            script = os.path.join(layout.bin, tool)
            Path(script).write_text(fake_server.script(tool, layout.config,
                                                       f" of scenario {case.id}"))
            os.chmod(script, 0o755)
        if case.rtmr3 is not None:  # the register's reset value; the shim keeps its rules
            register = self.path(RTMR3_PATH)
            os.makedirs(os.path.dirname(register), exist_ok=True)
            Path(register).write_bytes(bytes(48))
            import fake_rtmr  # tests/fake_rtmr: built once per source, shared by the worlds

            self._rtmr3_shim = str(fake_rtmr.build(Path(tempfile.gettempdir()) /
                                                   "podvm-gpu-fake-rtmr"))
        hook = self.path("/" + HOOK_PATH)
        if case.toolkit is not None and not os.path.lexists(hook):
            # issue 36: the case names its toolkit: the hook binary the spec names answers as
            # that version's (toolkit_ctk.py)
            os.makedirs(os.path.dirname(hook), exist_ok=True)
            Path(hook).write_text(fake_server.script("nvidia-cdi-hook", layout.config,
                                                     f" of scenario {case.id}"))
            os.chmod(hook, 0o755)
        if case.nvattest is not None:
            plan = os.path.join(os.path.dirname(layout.config), "nvattest.plan.json")
            Path(plan).write_text(json.dumps(case.nvattest))
            script = os.path.join(layout.bin, "nvattest")
            Path(script).write_text(NVATTEST_SCRIPT.format(
                python=sys.executable, case_id=case.id, plan=plan, calls=layout.calls,
                state=layout.state, tests=str(TESTS)))
            os.chmod(script, 0o755)

    def _parent_resolved(self, name: str) -> str:
        """Path of a case's file or link: its folder resolved chroot-style, the name itself not."""
        parent, base = os.path.split(name.strip("/"))
        return os.path.join(self.path("/" + parent), base)

    def run(self, phase: str, during=None) -> Run:
        """Run the product once (``boot`` for boot and rerun, ``check`` for check) and collect the result.

        ``during``, when given, is called with the product's ``Popen`` (umockdev-run) as soon as
        it started, and returns when it has done what it does to the run (send it a signal,
        start a second boot, ...); the run is then waited for as usual.

        Raises:
            RuntimeError: umockdev-run is not installed.
        """
        umockdev_run = shutil.which("umockdev-run")
        if umockdev_run is None:
            raise RuntimeError("umockdev-run not found: install the Debian package umockdev")
        with fx.locked_state(self.layout) as state:
            state["run"] = phase
            if phase != "boot":  # rerun and check have every late device from the start
                state["arrived"] = [dev["address"] for dev in self.case.pci_late]
            coming = [dev for dev in self.case.pci_late if dev["address"] not in state["arrived"]]
            arrivals_before = len(state["arrivals"])
        self._write_tree()
        command = "check" if phase == "check" else "boot"
        argv = [umockdev_run, "-d", self.layout.tree, "--", *product_command(), command,
                "--root", self.layout.root, "--json"]
        max_wall = self.case.expect.get(phase, {}).get("max_wall_s")
        limit = max_wall + GRACE_S if max_wall else DEFAULT_LIMIT_S
        before = self._root_snapshot() if phase == "check" else {}
        out = Path(self.layout.out, f"{phase}.stdout")
        err = Path(self.layout.out, f"{phase}.stderr")
        for attempt in (1, 2):
            calls_before = len(self.calls())
            rc, wall = self._run_once(argv, out, err, limit, during, coming)
            if not _umockdev_crash(rc, wall, out, err, len(self.calls()) - calls_before):
                break
            # umockdev-run (its preload) very rarely dies of SIGSEGV before the product starts:
            # seen once in about 2000 runs here. That is the test bed, not the product: run again.
            warnings.warn(UmockdevCrashWarning(f"{self.case.id} {phase}: umockdev-run died of "
                                               f"SIGSEGV after {wall:.2f} s with no output; "
                                               f"attempt {attempt} of 2"), stacklevel=2)
        alive = self._world_pids()
        status, status_error = self._status()
        with fx.locked_state(self.layout) as state:
            daemons = list(state["daemons"])
            arrivals = state["arrivals"][arrivals_before:]
        after = self._root_snapshot() if phase == "check" else {}
        return Run(phase=phase, argv=argv, rc=rc, wall_s=wall, limit_s=limit,
                   stdout=out.read_text(errors="replace"), stderr=err.read_text(errors="replace"),
                   status=status, status_error=status_error,
                   calls=[call for call in self.calls() if call.run == phase],
                   alive_at_exit=alive, daemons=daemons, arrivals=arrivals,
                   root_changes=sorted(path for path in before.keys() | after.keys()
                                       if before.get(path) != after.get(path)))

    def _run_once(self, argv: list[str], out: Path, err: Path, limit: float,
                  during=None, coming: list[dict] = ()) -> tuple[int | None, float]:
        """One product run, output to files; (exit status or None when ended at ``limit``, wall).
        The ``coming`` late devices arrive during it (:class:`LateArrivals`)."""
        # Output goes to files, not pipes: a hung tool that inherited them must not hold the run.
        with out.open("wb") as stdout, err.open("wb") as stderr:
            started = time.monotonic()
            process = self.start_product(argv, stdout, stderr)
            late = LateArrivals(self, started, list(coming))
            late.start()
            try:
                if during is not None:
                    during(process)
                rc = process.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                rc = None
            finally:
                late.stop.set()
                late.join()
            return rc, time.monotonic() - started

    def arrive(self, dev: dict, at_s: float) -> None:
        """A ``pci_late`` device arrives: it is added to every live testbed (bus link last),
        each testbed's open libudev monitors get its ``add`` uevent, the state counts it as
        present from now on (the tree of later runs has it), and a loaded nvidia driver binds
        it. What happened is kept in the state's ``arrivals``."""
        with fx.locked_state(self.layout) as state:
            record = testbed.pci_record(dev, state["bindings"].get(dev["address"]))
            _, properties, _, _ = testbed.parse_record(record)
            beds = testbed.live_testbeds(self.layout.tmp)
            reached, added = 0, 0
            for bed in beds:
                try:
                    devpath = testbed.add_live_device(bed, record)
                except OSError:  # the run ended meanwhile and umockdev removed its testbed
                    continue
                added += 1
                seqnum = 1000 + len(state["arrivals"])
                reached += testbed.send_uevent(bed, testbed.uevent_message(
                    devpath, "add", properties, seqnum))
            state["arrived"].append(dev["address"])
            fx.Effects(self.layout, self._config, state, []).bind_arrival()
            state["arrivals"].append({"address": dev["address"], "at_s": round(at_s, 3),
                                      "testbeds": added, "monitors": reached})

    def _write_tree(self) -> None:
        """umockdev-run builds a fresh testbed from the tree file on every run: write the VMBus
        channels and the devices present now with today's bindings."""
        with fx.locked_state(self.layout) as state:
            bindings = dict(state["bindings"])
            present = fx.present_pci(self._config, state)
        Path(self.layout.tree).write_text(umockdev_tree(present, bindings, self.case.vmbus,
                                                        self.case.infiniband))

    def start_product(self, argv: list[str], stdout, stderr) -> subprocess.Popen:
        """Start one product process (``argv`` as :meth:`run` builds it) in this world."""
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                env=self._env(), cwd=self.layout.dir, start_new_session=True)

    def product_argv(self, command: str = "boot") -> list[str]:
        """The argv :meth:`run` uses for ``command``, with today's PCI tree written."""
        self._write_tree()
        return [shutil.which("umockdev-run") or "umockdev-run", "-d", self.layout.tree, "--",
                *product_command(), command, "--root", self.layout.root, "--json"]

    def _env(self) -> dict[str, str]:
        """The harness's environment with ``PATH`` = the fakes only and the working tree importable."""
        env = {key: value for key, value in os.environ.items()
               if key not in ("PODVM_GPU_ROOT", "PODVM_GPU_CONFIG")}
        env["PATH"] = self.layout.bin
        env["TMPDIR"] = self.layout.tmp  # umockdev-run makes its testbed there (LateArrivals)
        if self.case.rtmr3 is not None:  # umockdev-run puts its own preload before this one
            env["LD_PRELOAD"] = self._rtmr3_shim
            env["FAKE_RTMR_PATH"] = self.path(RTMR3_PATH)
            env["FAKE_RTMR_FAIL"] = self.case.rtmr3.get("fail") or ""
        if not os.environ.get("PODVM_GPU_CMD"):  # an installed product runs its own code
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                              os.environ.get("PYTHONPATH")]))
        return env

    def _status(self) -> tuple[dict | None, str | None]:
        try:
            return json.loads(Path(self.path(STATUS_PATH)).read_text()), None
        except FileNotFoundError:
            return None, f"no status file at {STATUS_PATH}"
        except (OSError, ValueError) as err:
            return None, f"{STATUS_PATH} unreadable: {err}"

    def _root_snapshot(self) -> dict[str, tuple]:
        """Every entry under the root, folders included: relative path -> (mode, size, mtime)."""
        snapshot = {}
        for directory, folders, names in os.walk(self.layout.root):
            for name in folders + names:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                snapshot[os.path.relpath(path, self.layout.root)] = (
                    info.st_mode, info.st_size, info.st_mtime_ns)
        return snapshot

    def calls(self) -> list[Call]:
        """Every fake tool call of this world so far, in start order."""
        calls: dict[str, Call] = {}
        for line in Path(self.layout.calls).read_text().splitlines():
            event = json.loads(line)
            if event["event"] == "start":
                calls[event["call"]] = Call(id=event["call"], pid=event["pid"], run=event["run"],
                                            argv=event["argv"], started=event["t"],
                                            ppid=event.get("ppid"))
                continue
            call = calls[event["call"]]
            if event["event"] == "end":
                call.ended, call.rc, call.answer = event["t"], event["rc"], event["answer"]
                call.applied = event.get("applied", [])
            elif event["event"] == "signal":
                call.signals.append(event["signal"])
            elif event["event"] == "harness-error":
                call.errors.append(event["message"])
        return list(calls.values())

    def _world_pids(self) -> set[int]:
        """Live (non-zombie) processes whose argv names the world directory: fakes, stand-ins, the
        product itself while it runs."""
        marker = self.layout.dir.encode()
        pids = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
                state = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and any(marker + end in cmdline for end in (b"/", b"\0")):
                pids.add(int(entry))
        return pids

    def close(self) -> None:
        """End every process of the world (SIGKILL, until none is left), then remove the directory."""
        for _ in range(100):
            pids = self._world_pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        if os.environ.get("PODVM_GPU_KEEP_WORLD") != "1":
            shutil.rmtree(self.layout.dir, ignore_errors=True)
