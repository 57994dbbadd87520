"""The fault matrix: faults injected into a scenario world's tools, and what must hold after a boot.

A cell is one scenario, one external command the boot runs (an argv prefix) and one fault:

- ``exit``: the command exits 1 with an error line on stderr, doing nothing;
- ``hang``: it never answers (a daemon that never becomes ready);
- ``signal``: it prints half a line and dies of SIGKILL;
- ``garbage``: it does its job (the world's fake runs, effects and exit status included) but
  prints seeded garbage instead of its output: random bytes, NULs, invalid UTF-8, a 10-70 KB
  line, rich markup, logrus-looking lines and near misses of the texts the agent parses;
- ``empty``: it does its job and prints nothing;

or one tool and ``missing`` (removed from the world's ``bin/``) or ``not-executable`` (mode
0644): a tool is found by name, so those two are faults of every call of the tool.

The fault is injected without changing the harness: the world's ``bin/<tool>`` fake is moved to
``bin/.orig/<tool>`` (a folder of its own, so it still sees its own basename) and replaced by a
small ``sh`` script that applies the fault to the calls whose argv starts with the cell's prefix
and execs the fake for every other call. Each faulted call appends ``<pid> <fault>`` to
``faults.log`` in the world, so a cell proves that its fault was hit.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shlex
import shutil
import sys
import zlib
from pathlib import Path

import yaml
from scenarios.expect import judge_cdi, report
from scenarios.world import DATA, OWN_CASES, SHARED, Case, Run, World, load_case

from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.cdi.ready import check_ready_spec
from podvm_gpu.errors import CdiSpecError
from podvm_gpu.host.fs import Root
from podvm_gpu.status import StatusUnreadable, load_status

FAULTS = ("exit", "hang", "signal", "garbage", "empty")
TOOL_FAULTS = ("missing", "not-executable")
TOOL_TIMEOUT_S = 2  # every tool; a fake answers in 10-300 ms here, even on a loaded machine
WAIT_S = 3  # persistenced and fabric waits
BUDGET_S = 15
GRACE_S = 5  # past the budget: the pipeline's alarm grace (2 s) plus start and end
MAX_REASON = 2000  # a reason is one line for a console, a status file and a container's env
MATRIX_CONFIG = {
    "budget_s": BUDGET_S,
    "timeouts": {tool: TOOL_TIMEOUT_S for tool in ("modprobe", "nvidia-ctk", "nvidia-smi",
                                                   "nv-fabricmanager", "nvidia-modprobe")},
    "persistenced": {"ready_timeout_s": WAIT_S, "per_gpu_s": 0},
    "fabricmanager": {"ready_timeout_s": WAIT_S, "per_gpu_s": 0, "poll_s": 0.2},
}
_TEMP_NAME = re.compile(r"^\..+\.\d+\.tmp$")  # host/fs.py atomic_write's temporary names
# What the reason must say about each fault (on top of the step's name).
CAUSE = {
    "exit": re.compile(r"\bexit(ed with status)? 1\b|injected failure"),
    "hang": re.compile(r"timed out"),
    "signal": re.compile(r"SIGKILL"),
    "missing": re.compile(r"not found"),
    "not-executable": re.compile(r"not executable"),
}

DAEMON_TOOLS = ("nvidia-persistenced", "nv-fabricmanager")
OUTPUT_NOT_READ = "boot does not read its output: what it did is checked in the system instead"


@dataclasses.dataclass(frozen=True)
class Command:
    """An external command of the boot sequence.

    Attributes:
        argv: the prefix of the calls it covers (``("nvidia-smi", "conf-compute", "-f")``).
        step: the step that runs it, which a failure must name.
        around: fault -> why boot still ends ``ready`` with it (the faults boot works around).
        daemon: started as a daemon: never killed by the boot, so a hung one stays alive.
        reason_has: for a command that is only a diagnosis of an earlier failure: that
            failure's cause, which the reason must hold whatever the fault (the fault's own
            cause need not be named then).
        reason_lacks: fault -> a conclusion the reason must not draw from that fault.
    """

    argv: tuple[str, ...]
    step: str
    around: dict = dataclasses.field(default_factory=dict)
    daemon: bool = False
    reason_has: str = ""
    reason_lacks: dict = dataclasses.field(default_factory=dict)


def output_not_read(**more: str) -> dict:
    return {"garbage": OUTPUT_NOT_READ, "empty": OUTPUT_NOT_READ, **more}


def every_fault(why: str) -> dict:
    return dict.fromkeys(FAULTS, why)


MODPROBE = (
    Command(("modprobe", "nvidia"), "modules", output_not_read()),
    Command(("modprobe", "nvidia_uvm"), "modules", output_not_read()),
    Command(("modprobe", "nvidia_modeset"), "modules",
            every_fault("an optional module (modules.optional): a failure is a warning, and its "
                        "call gets at most 10 s")),
)
# nvidia-modprobe writes the real /dev only, so boot runs it only when the root is / (never in
# a scenario world, where the GPU nodes are made with mknod): not a command of these boots.
NODES = (
    Command(("nvidia-ctk", "system", "create-device-nodes"), "device-nodes", output_not_read()),
)
PERSISTENCED = Command(("nvidia-persistenced",), "persistenced", output_not_read(), daemon=True)
# A CC mode nvidia-smi cannot tell (a non-zero exit, or no "CC status:" line) is a warning on a
# regular VM (no TDX/SEV-SNP evidence in /proc/cpuinfo, /sys, /dev: host/tee.py; the kernel log
# alone never makes a confidential guest); a hung nvidia-smi is a hung driver and fails. In a
# confidential guest every fault of -f, -d and -e fails closed (S77).
REGULAR_VM = ("a regular VM (no TDX/SEV-SNP evidence in /proc/cpuinfo, /sys or /dev): a CC query "
              "nvidia-smi cannot answer is a warning")
NOT_READ_AS_OFF = dict.fromkeys(("exit", "signal", "garbage", "empty"), REGULAR_VM)
# -f's garbage holds near misses ("CC status: MAYBE"): a mode boot does not know fails closed.
CC_MODE = Command(("nvidia-smi", "conf-compute", "-f"), "confidential-computing",
                  dict.fromkeys(("exit", "signal", "empty"), REGULAR_VM))
# CC on: the multi-GPU mode only adds Protected PCIe to a GPU already confidential.
MGM_ON_CC = Command(("nvidia-smi", "conf-compute", "-mgm"), "confidential-computing",
                    dict.fromkeys(("exit", "signal", "garbage", "empty"),
                                  "CC is on: an unreadable multi-GPU mode is a warning, the GPU "
                                  "is confidential whatever it says"))
SRS = Command(("nvidia-smi", "conf-compute", "-srs"), "confidential-computing",
              dict.fromkeys(("garbage", "empty"), "its output is not read: the ready state is "
                                                  "read back with -grs"))
GENERATE = Command(("nvidia-ctk", "cdi", "generate"), "cdi")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A scenario world the matrix runs: a shared case, changed by ``change``.

    Attributes:
        name: the cell ids' prefix.
        case_file: the case in ../shared/cases (or the copy in tests/data/cases).
        commands: the commands whose calls get the five faults.
        tools: tool -> the step a missing or non-executable tool fails (a tuple: any of them).
        change: edits the loaded case (a copy) before the world is built.
    """

    name: str
    case_file: str
    commands: tuple[Command, ...]
    tools: dict = dataclasses.field(default_factory=dict)
    change: object = None

    def case(self) -> Case:
        path = next(p for p in (SHARED / "cases" / self.case_file, DATA / "cases" / self.case_file,
                                OWN_CASES / self.case_file) if p.exists())
        case = load_case(path)
        config = dict(MATRIX_CONFIG)
        own = yaml.safe_load(case.files.get("etc/podvm-gpu/config.yaml") or "") or {}
        config.update({k: v for k, v in own.items() if k not in config})
        case.files["etc/podvm-gpu/config.yaml"] = yaml.safe_dump(config)
        if self.change:
            self.change(case)
        return case


def _mig_without_instances(case: Case) -> None:
    """nvidia-ctk cdi generate fails on a GPU in MIG mode without instances (field case C11):
    the boot then asks nvidia-smi why, with two queries that are only a diagnosis."""
    for rule in case.tools:
        if rule["argv"] == ["nvidia-ctk", "cdi", "generate"]:
            rule.update(rc=1, effects=[], stderr='level=error msg="failed to generate CDI spec: '
                        'failed to create device CDI specs: Not Found"\n')
    case.tools += [
        {"argv": ["nvidia-smi", "--query-gpu=index,mig.mode.current", "--format=csv,noheader"],
         "rc": 0, "stdout": "0, Enabled\n", "stderr": "", "delay_s": 0, "effects": [],
         "only_before": {}},
        {"argv": ["nvidia-smi", "mig", "-lgi"], "rc": 6, "stdout": "No GPU instances found\n",
         "stderr": "", "delay_s": 0, "effects": [], "only_before": {}},
    ]


GENERATE_FAILED = "nvidia-ctk cdi generate failed (exit 1): failed to generate CDI spec"
TDX_FLAGS = ("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme de pse tsc msr "
             "tdx_guest hypervisor\n\n")


def _attested(case: Case) -> None:
    """C21 in a TDX guest (the CPU flag) with the nvattest stand-in (tests/nvattest_standin.py):
    attestation is required, so every fault of nvattest's attest call fails the boot closed."""
    case.files["proc/cpuinfo"] = TDX_FLAGS
    config = yaml.safe_load(case.files["etc/podvm-gpu/config.yaml"])
    config["confidential_computing"] = {**config.get("confidential_computing", {}),
                                        "attestation_timeout_s": WAIT_S,
                                        "attestation_per_device_s": 0}
    case.files["etc/podvm-gpu/config.yaml"] = yaml.safe_dump(config)
    case.nvattest = {"gpus": [{"driver": "550.54.15"}]}
IMEX_SPEC = "var/run/cdi/nvidia-imex.yaml"


def _earlier_imex_spec(case: Case) -> None:
    """S108 with the IMEX spec of an earlier boot in place: a fault that fails the boot must
    leave none (final_state_problems), and a ready boot replaces it."""
    case.files[IMEX_SPEC] = ('{"cdiVersion":"0.5.0","kind":"nvidia.com/imex-channel","devices":'
                             '[{"name":"all","containerEdits":{"deviceNodes":[{"path":'
                             '"/dev/nvidia-caps-imex-channels/channel0"}]}}]}\n')


SCENARIOS = (
    Scenario("P02", "P02-one-h100-pcie-ready.yaml", (
        *MODPROBE, *NODES, PERSISTENCED,
        Command(("nvidia-smi", "--query-gpu=pci.bus_id,fabric.state,fabric.status"), "fabricmanager",
                every_fault("no NVSwitch in the VM: the fabric query is a probe for a fabric "
                            "managed outside the VM, and no GPU reports one (step skipped)")),
        CC_MODE,
        GENERATE,
        # issue 28: the health gate's reset-status and recovery-action queries; only a value
        # actually read fails the boot (podvm_gpu/steps/cdi/recovery.py)
        Command(("nvidia-smi", "--query-gpu=pci.bus_id,reset_status.reset_required,"
                 "reset_status.drain_and_reset_recommended"), "cdi",
                every_fault("a health query not answered is a warning: only a value read "
                            "fails the boot")),
        Command(("nvidia-smi", "--query-gpu=pci.bus_id,gpu_recovery_action"), "cdi",
                every_fault("a health query not answered is a warning: only a value read "
                            "fails the boot")),
    ), tools={"modprobe": "modules", "nvidia-ctk": "device-nodes",
              "nvidia-persistenced": "persistenced", "nvidia-smi": "confidential-computing"}),
    Scenario("P03", "P03-hgx-h200-8gpu-4nvswitch-ready.yaml", (
        *MODPROBE,
        Command(("nv-fabricmanager", "--version"), "versions"),
        *NODES, PERSISTENCED,
        Command(("nv-fabricmanager", "-c"), "fabricmanager", output_not_read(), daemon=True),
        Command(("nvidia-smi", "--query-gpu=pci.bus_id,fabric.state,fabric.status"),
                "fabricmanager"),
        # issue 33: 580's fabric health summary, after Completed/Success, a query of its own
        Command(("nvidia-smi", "--query-gpu=pci.bus_id,fabric.health.summary"), "fabricmanager",
                every_fault("the fabric health summary is a query of its own: one not answered "
                            "is a warning, only a summary read fails the boot")),
        CC_MODE,
        GENERATE,
    ), tools={"modprobe": "modules", "nv-fabricmanager": "versions",
              "nvidia-ctk": "device-nodes", "nvidia-persistenced": "persistenced",
              # the fabric wait and the CC step run at once and both need nvidia-smi: the
              # earlier in the step order is named, whichever failed first (pipeline.py)
              "nvidia-smi": "fabricmanager"}),
    # CC on, set_ready_state: true: -grs says not-ready, -srs 1 sets it. The kernel log says
    # "Intel TDX", but nothing in /proc/cpuinfo, /sys or /dev does: a regular VM (issue 25), so
    # an unreadable CC query is a warning here; the TDX-guest cells are S77's.
    Scenario("C21", "C21-cc-ready-state-not-ready.yaml", (
        CC_MODE,
        Command(("nvidia-smi", "conf-compute", "-d"), "confidential-computing", NOT_READ_AS_OFF),
        Command(("nvidia-smi", "conf-compute", "-e"), "confidential-computing", NOT_READ_AS_OFF),
        MGM_ON_CC,
        Command(("nvidia-smi", "conf-compute", "-grs"), "confidential-computing"),
        SRS,
    )),
    # C21's world in a TDX guest with the CPU flag (tdx_guest): every fault of the CC mode,
    # dev-tools and environment queries fails closed.
    Scenario("S77", "S77-tdx-guest-cc-on-ready-state-set.yaml", (
        Command(("nvidia-smi", "conf-compute", "-f"), "confidential-computing"),
        Command(("nvidia-smi", "conf-compute", "-d"), "confidential-computing"),
        Command(("nvidia-smi", "conf-compute", "-e"), "confidential-computing"),
        MGM_ON_CC,
        Command(("nvidia-smi", "conf-compute", "-grs"), "confidential-computing"),
        SRS,
    )),
    # The same in a TDX guest: attestation before -srs 1 (issue 26); -srs 1 must never run
    # after a fault of nvattest's attest call.
    Scenario("C21-attest", "C21-cc-ready-state-not-ready.yaml", (
        Command(("nvattest", "attest"), "confidential-computing"),
        Command(("nvattest", "--log-level", "info", "version"), "confidential-computing",
                every_fault("the version is only recorded (null when it cannot be read)")),
    ), tools={"nvattest": "confidential-computing"}, change=_attested),
    Scenario("P02-mig", "P02-one-h100-pcie-ready.yaml", (
        Command(("nvidia-smi", "--query-gpu=index,mig.mode.current"), "cdi",
                reason_has=GENERATE_FAILED),
        # A listing that failed some other way is no evidence that there are no instances.
        Command(("nvidia-smi", "mig", "-lgi"), "cdi", reason_has=GENERATE_FAILED,
                reason_lacks=dict.fromkeys(("exit", "hang", "signal"), "no GPU instances exist")),
    ), change=_mig_without_instances),
    # issue 28: IMEX channels on (S108): every fault of the IMEX spec's generation fails the
    # cdi step closed (no output, or output that is not the IMEX spec, is never installed)
    Scenario("S108-imex", "S108-imex-on-and-ready-two-specs.yaml", (
        Command(("nvidia-ctk", "cdi", "generate", "--mode=imex"), "cdi"),
    ), change=_earlier_imex_spec),
)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One scenario x one command (or tool) x one fault, and what the boot must end in."""

    scenario: Scenario
    target: tuple[str, ...]
    fault: str
    command: Command | None = None  # None for a tool fault

    @property
    def id(self) -> str:
        return f"{self.scenario.name}:{' '.join(self.target)}:{self.fault}"

    @property
    def seed(self) -> int:
        """The garbage's seed: a function of the cell's id, the same on every run."""
        return zlib.crc32(self.id.encode())

    @property
    def tool(self) -> str:
        return self.target[0]

    @property
    def works_around(self) -> str | None:
        """Why boot ends ready with this fault, or None when it must end failed."""
        return self.command.around.get(self.fault) if self.command is not None else None

    @property
    def steps(self) -> tuple[str, ...]:
        """The steps one of which the reason must start with."""
        step = self.command.step if self.command else self.scenario.tools[self.tool]
        return step if isinstance(step, tuple) else (step,)


def cells() -> list[Cell]:
    """Every cell of the matrix, in a stable order."""
    found = []
    for scenario in SCENARIOS:
        for command in scenario.commands:
            found += [Cell(scenario, command.argv, fault, command) for fault in FAULTS]
        for tool in scenario.tools:
            found += [Cell(scenario, (tool,), fault) for fault in TOOL_FAULTS]
    return found


def garbage(seed: int) -> tuple[bytes, bytes]:
    """Seeded garbage for stdout and stderr: what a broken tool, a wrong binary or a terminal
    mess might print, including near misses of the texts boot parses."""
    rng = random.Random(seed)
    pieces = [
        bytes(rng.randrange(256) for _ in range(rng.randrange(64, 2048))),
        b"\x00\xff\xfe\x1b[31m[/bold] [red]closing[/red] [/]\r\n",
        b'level=error msg="[/link] \\"quoted\\" \\n next" extra=\xff\n',
        b"CC status: MAYBE\nConfidential Compute GPUs Ready state: half-ready\n",
        b"Fabric Manager version is : 999.1\n",
        b"GPU 00000000:18:00.0\n    Fabric\n        State : Completed\n        Status : Success\n",
        b"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: '0'}]\n",
        b"0, Enabled\nNo GPU instances found\n",
        b"%s %n %x {} {0} $(reboot) `id` ; rm -rf /\n",
        b"x" * rng.randrange(10_000, 70_000) + b"\n",
        "\u202e\u0000\ud7ff\ufffd \u00e9\u4e2d\n".encode("utf-8", "surrogatepass"),
    ]
    rng.shuffle(pieces)
    cut = rng.randrange(len(pieces) + 1)
    return b"".join(pieces[:cut]), b"".join(pieces[cut:])


def install_fault(world: World, cell: Cell) -> None:
    """Put the cell's fault into the world's ``bin/`` (see the module docstring)."""
    bin_dir = Path(world.layout.bin)
    fake = bin_dir / cell.tool
    if cell.fault == "missing":
        fake.unlink()
        return
    if cell.fault == "not-executable":
        fake.chmod(0o644)
        return
    originals = bin_dir / ".orig"
    originals.mkdir(exist_ok=True)
    original = originals / cell.tool
    fake.rename(original)
    out, err = garbage(cell.seed)
    base = Path(world.layout.dir)
    (base / "garbage.out").write_bytes(out)
    (base / "garbage.err").write_bytes(err)
    q = shlex.quote
    orig, cat = q(str(original)), q(shutil.which("cat") or "/bin/cat")
    actions = {
        "exit": f'echo "{cell.tool}: error: injected failure (fault matrix)" >&2; exit 1',
        "hang": f"exec {q(sys.executable)} -IS -c 'import time; time.sleep(3600)' "
                f"{q(str(base / 'hung'))}",
        "signal": f'printf "{cell.tool}: half a li"; kill -KILL $$',
        "garbage": f'{orig} "$@" >/dev/null 2>&1; rc=$?; {cat} {q(str(base / "garbage.out"))}; '
                   f'{cat} {q(str(base / "garbage.err"))} >&2; exit $rc',
        "empty": f'{orig} "$@" >/dev/null 2>&1; exit $?',
    }
    args = cell.target[1:]
    tests = [f'[ "$#" -ge {len(args)} ]'] + [f'[ "${i}" = {q(a)} ]'
                                             for i, a in enumerate(args, 1)]
    fake.write_text(
        "#!/bin/sh\n"
        f"# fault matrix cell {cell.id}: the fault applies to the calls that start with this\n"
        "# argv; every other call goes to the world's fake (in .orig/, so it sees its name)\n"
        f"if {' && '.join(tests)}; then\n"
        f'    echo "$$ {cell.fault}" >> {q(str(base / "faults.log"))}\n'
        f"    {actions[cell.fault]}\n"
        "fi\n"
        f'exec {orig} "$@"\n')
    fake.chmod(0o755)


def faulted_calls(world: World) -> list[tuple[int, str]]:
    """``(pid, fault)`` of every call the fault hit."""
    log = Path(world.layout.dir, "faults.log")
    if not log.exists():
        return []
    return [(int(pid), fault) for pid, fault in
            (line.split() for line in log.read_text().splitlines() if line.strip())]


def temp_files(root: str) -> list[str]:
    """The atomic writes' temporary files anywhere under the root (``.<name>.<pid>.tmp``)."""
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, _dirs, names in os.walk(root)
                  for name in names if _TEMP_NAME.match(name))


def final_state_problems(world: World, run: Run, budget_s: float) -> list[str]:
    """What must hold after any boot: a final state with its finish time and exit code, an end
    within the budget, the spec that goes with the state (ready and valid, by the official
    schema and the product's own validation, only for ready; the unavailable spec otherwise),
    no temporary file left, no traceback, a one-line bounded reason, a status file that the
    product's own reader takes."""
    problems = []
    if run.rc is None:
        problems.append(f"did not exit within {run.limit_s:.0f} s; the harness killed it")
    if "Traceback" in run.stderr:
        problems.append("a traceback on stderr")
    status = run.status
    if status is None:
        return problems + [run.status_error]
    state, reason = status.get("state"), status.get("reason")
    if state not in ("ready", "no-gpu", "failed"):
        problems.append(f"status.json state {state!r} is not final")
    if not status.get("finished_at"):
        problems.append("status.json has no finished_at")
    want_rc = 0 if state in ("ready", "no-gpu") else 1
    if run.rc is not None and run.rc != want_rc:
        problems.append(f"exit {run.rc} with state {state!r} (expected exit {want_rc})")
    if run.wall_s > budget_s + GRACE_S:
        problems.append(f"took {run.wall_s:.1f} s, past the budget of {budget_s} s + {GRACE_S} s")
    if state != "ready" and not reason:
        problems.append(f"state {state!r} without a reason")
    if reason and ("\n" in reason or len(reason) > MAX_REASON):
        problems.append(f"the reason is not one bounded line ({len(reason)} characters)")
    if reason and "internal error" in reason:
        problems.append(f"an internal error: {reason[:300]}")
    try:
        load_status(Root(world.layout.root))  # what `podvm-gpu status` and check read
    except StatusUnreadable as err:
        problems.append(f"the product's own status reader refuses the file: {err}")
    problems += judge_cdi(world, "ready-spec" if state == "ready" else "unavailable", state,
                          status)
    if state == "ready":
        problems += own_validation(world)
    if state != "ready" and os.path.lexists(world.path("/" + IMEX_SPEC)):
        problems.append(f"/{IMEX_SPEC} left after a boot that ended {state!r}")
    if leftovers := temp_files(world.layout.root):
        problems.append(f"temporary files left: {leftovers}")
    return problems


def own_validation(world: World) -> list[str]:
    """The product's own CDI validation of the installed spec, as boot runs it."""
    text = Path(world.path("/var/run/cdi/nvidia.yaml")).read_bytes()
    try:
        spec = parse_spec(text, source="nvidia.yaml")
    except CdiSpecError as err:
        return [f"the product's validation rejects the ready spec: {err}"]
    minors = list(range(world.case.gpu_count))
    return [f"the product's ready-spec check: {p}"
            for p in check_ready_spec(spec, Root(world.layout.root), minors, "550.54.15")]


def daemon_process(pid: int) -> bool:
    """True when ``pid`` runs a daemon's fake (it may not have logged its call yet when the boot
    ended: boot never waits for a daemon it leaves behind), or has ended by itself since."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # gone: not left running
    return any(os.path.basename(a.decode(errors="replace")) in DAEMON_TOOLS
               for a in argv[:3]) and b"--version" not in argv


def judge_cell(cell: Cell, world: World, run: Run) -> list[str]:
    """Problems of a boot of ``cell``'s world; empty when everything that must hold holds."""
    problems = final_state_problems(world, run, BUDGET_S)
    status = run.status or {}
    state, reason = status.get("state"), status.get("reason") or ""
    hits = faulted_calls(world)
    if cell.command is not None and not hits:
        problems.append("the fault was never hit: no call matched the cell's argv")
    hung = {pid for pid, fault in hits if fault == "hang"}
    # the daemon stand-ins, and a daemon the boot started that is still starting them: boot
    # never waits for or kills a daemon it leaves behind
    daemons = {d["pid"] for d in run.daemons} | {
        c.pid for c in run.calls if c.argv[0] in DAEMON_TOOLS and "--version" not in c.argv}
    if cell.command is not None and cell.command.daemon:
        # a daemon initialising GPUs is never killed, even one that never gets ready
        if dead := hung - run.alive_at_exit:
            problems.append(f"the hung daemon was killed (pids {sorted(dead)})")
        daemons |= hung
    if left := [pid for pid in run.alive_at_exit - daemons if not daemon_process(pid)]:
        problems.append(f"processes left running that are not daemons: {sorted(left)}")
    why = cell.works_around
    if why is not None:
        if state != "ready":
            problems.append(f"state {state!r}, expected ready ({why}): {reason[:300]}")
        elif cell.fault in ("exit", "hang", "signal"):
            said = " ".join(status.get("warnings", []) + [s.get("message", "")
                                                         for s in status.get("steps", [])])
            if cell.tool not in said:
                problems.append(f"a {cell.tool} that failed is worked around silently: no "
                                "warning or step message names it")
        return problems
    if state == "ready":
        problems.append(f"ready although {' '.join(cell.target)} failed ({cell.fault}), which "
                        "the boot cannot do without")
        return problems
    if not reason.startswith(tuple(f"{step}: " for step in cell.steps)):
        problems.append(f"the reason does not start with the step {' or '.join(cell.steps)}: "
                        f"{reason[:300]}")
    command = cell.command or Command(cell.target, cell.steps[0])
    cause = CAUSE.get(cell.fault)
    if cause and not command.reason_has and not cause.search(reason):
        problems.append(f"the reason does not name the cause ({cell.fault}: /{cause.pattern}/): "
                        f"{reason[:300]}")
    if command.reason_has not in reason:
        problems.append(f"the reason lost {command.reason_has!r}: {reason[:300]}")
    wrong = command.reason_lacks.get(cell.fault)
    if wrong and wrong in reason:
        problems.append(f"the reason says {wrong!r}, which a {cell.fault} does not show: "
                        f"{reason[:300]}")
    return problems


def run_cell(cell: Cell) -> tuple[list[str], str, float]:
    """Build the cell's world, inject its fault, boot once: ``(problems, report, wall s)``."""
    with World(cell.scenario.case()) as world:
        install_fault(world, cell)
        run = world.run("boot")
        problems = judge_cell(cell, world, run)
        text = report(world, run, problems) if problems else ""
        return problems, text, run.wall_s


def run_cells(selected: list[Cell], jobs: int) -> dict[str, tuple[list[str], str, float]]:
    """Run cells ``jobs`` at a time (each in its own world: they share nothing); by cell id."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        return dict(zip((c.id for c in selected), pool.map(run_cell, selected)))
