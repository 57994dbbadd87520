"""What every fake tool in a scenario world's ``bin/`` answers.

Each fake is a tiny script (``world.py`` writes it) whose interpreter is the fake-tool client
(``fake_server.py``): the test process's fake-tool server answers the call with :func:`answer`
and the world's ``world.json``. A call:

1. logs its start (argv with argv[0] as the basename, pid, run) to the world's call log;
2. finds the first rule of the case whose ``argv`` is a prefix of the call's argv (``"*"`` matches
   any one argument), skipping a rule whose ``only_before`` effect was already applied;
3. sleeps the rule's ``delay_s`` (a SIGTERM or SIGINT meanwhile is logged, then kills the fake
   the normal way, so the product sees what a real tool would do and no effect is applied);
4. on rc 0 applies the rule's effects (``effects.py``), prints stdout and stderr, logs its end
   and exits with the rule's rc.

Harness-owned output: the world, not the case, knows the NVLink fabric state and, once a
``cc_ready_state`` effect ran, the CC ready state. For those queries (``nvidia-smi -q`` with no
``-d``, ``--query-gpu=`` lists naming ``fabric.state``/``fabric.status``, and
``conf-compute -grs`` after a ``cc_ready_state`` effect) the matching rule still decides delay,
rc, stderr and effects (a stalled or failing nvidia-smi stays stalled or failing), but when it
answers rc 0 the harness writes stdout: a full ``-q`` keeps the rule's text and gets a ``Fabric``
block in every GPU section that lacks one; the other queries are answered whole. With no
matching rule the harness answers alone: rc 0, or rc 9 when the nvidia module is not loaded.
Every answer is what NVIDIA's real nvidia-smi prints for the same state (tests/
test_real_nvidia_smi.py holds them together): fabric values with their labels (``state
Completed``, ``status Success``), ``remapped_rows.*`` as ``0``, the ``-grs`` text between blank
lines; and its refusals, whatever the case's rules say: ``-q -d FABRIC`` (no such display type:
``Failed to parse --display/-d flags``, exit 2) and ``--query-gpu`` fields no real build has
(``fabric.clique_id``, ``fabric.cluster_uuid``, ``remapped_rows.*``, ``gpu_recovery_action``:
``Field "X" is not a valid field to query.``, exit 2), except a ``gpu_recovery_action`` query a
rule answers: that rule stands for an nvidia-smi 565+ (issue 28).

The GPUs' identities (``--query-gpu=`` lists naming ``uuid``, issue 45): with no matching rule
the harness answers for every bound GPU, its UUID made from its address (:func:`gpu_uuid`); a
matching rule answers alone, stdout included (a case whose GPU changes its UUID).

Health queries (``--query-remapped-rows=`` and ``--query-gpu=`` lists naming ``ecc.errors.*`` or
``retired_pages.*``): the world's GPUs are healthy unless the case says otherwise, so with no
matching rule the harness answers for every bound GPU (no remapped rows, none pending, no
failure, ECC counters 0, ``[N/A]`` retired pages, as an H100 has none); a matching rule answers
alone, stdout included (the case's GPU is not healthy). ``reset_status.*`` fields are health
fields (healthy: ``No``).

A rule's ``keep_output_s`` (the harness's own key): after answering, the fake leaves a child
that holds its stdout and stderr open that many seconds, as a tool whose helper outlives it.

nvidia-ctk's version and the hook binary (issue 36): the world's toolkit version (1.20.0 unless
the case's ``toolkit`` says otherwise) answers ``nvidia-ctk --version``, ``nvidia-cdi-hook``
calls and the refusals of a toolkit before 1.18.0, and decides which hooks a generated spec
holds (toolkit_ctk.py).

``nvidia-ctk cdi generate --mode=imex`` (issue 28): only a rule whose argv names ``--mode=imex``
answers it; else the harness does (imex_ctk.py), as the real nvidia-ctk 1.20.0 would for the
channel nodes under the dev root, from its captures.

A call no rule matches (and the harness does not own) exits 127 with a stderr line naming the
case and the argv; the test output lists such calls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from . import effects as fx
from . import imex_ctk, toolkit_ctk

UNMATCHED_RC = 127
NO_DRIVER_RC = 9
NO_DEVICE_RC = 6
# On stdout, with an empty line after it, as the real 535.261.03 prints it (tests/data/nvidia-*)
NVSMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                   "Make sure that the latest NVIDIA driver is installed and running.\n\n")
SMI_LABEL_WIDTH = 42  # nvidia-smi -q pads every label so the colons line up in this column
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
# What a healthy GPU answers (nvidia-smi --help-query-remapped-rows, --help-query-gpu)
HEALTHY = {"remapped_rows.correctable": "0", "remapped_rows.uncorrectable": "0",
           "remapped_rows.pending": "0", "remapped_rows.failure": "0",
           "retired_pages.pending": "[N/A]", "retired_pages.single_bit_ecc.count": "[N/A]",
           "retired_pages.double_bit.count": "[N/A]",
           # issue 28: no reset required or recommended (the Yes/No form of retired_pages.pending;
           # no binary we could run printed these fields with a value)
           "reset_status.reset_required": "No", "reset_status.drain_and_reset_recommended": "No"}
_QUERY_FIELDS = {"fabric.state": 0, "fabric.status": 1}
# --query-gpu fields no real build (535 to 555) accepts: nvidia-smi-real.md
NOT_QUERY_FIELDS = ("fabric.clique_id", "fabric.cluster_uuid", "remapped_rows.correctable",
                    "remapped_rows.uncorrectable", "remapped_rows.pending",
                    "remapped_rows.failure", "gpu_recovery_action",
                    # issue 33: 580's fabric health fields (tests/data/real/h200-580/README.md)
                    "fabric.health.summary", "fabric.health.bandwidth",
                    "fabric.health.route_recovery_in_progress", "fabric.health.route_unhealthy",
                    "fabric.health.access_timeout_recovery", "fabric.health.incorrect_configuration",
                    "fabric.health.partition_assigned")
# the fields of nvidia-smi 565 or later: a case rule answering one stands for such a build
NEWER_FIELDS = ("gpu_recovery_action", "fabric.health.summary",
                # issue 44: 580's detail of the summary, a query of its own
                "fabric.health.bandwidth", "fabric.health.route_unhealthy")
USAGE_RC = 2
BAD_DISPLAY = "Failed to parse --display/-d flags\n"
# The -d types of nvidia-smi -q (535 to 555 --help); FABRIC is none of them.
DISPLAY_TYPES = ("MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE",
                 "PIDS", "PERFORMANCE", "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING",
                 "ENCODER_STATS", "SUPPORTED_GPU_TARGET_TEMP", "VOLTAGE", "FBC_STATS",
                 "ROW_REMAPPER", "RESET_STATUS", "GSP_FIRMWARE_VERSION")


def refusal(argv: list[str]) -> tuple[int, str] | None:
    """The real program's usage refusal of ``argv`` (rc, stdout), or None: an unknown ``-d``
    type, a ``--query-gpu`` field no build has (only the first is named, then a blank line)."""
    if argv[0] != "nvidia-smi":
        return None
    display = fx.option_value(argv, "-d") or fx.option_value(argv, "--display")
    if display is not None and ("-q" in argv or "--query" in argv) and any(
            item.strip().upper() not in DISPLAY_TYPES for item in display.split(",")):
        return USAGE_RC, BAD_DISPLAY
    fields = fx.option_value(argv, "--query-gpu") or ""
    for field in fields.split(","):
        if field.strip() in NOT_QUERY_FIELDS:
            return USAGE_RC, f'Field "{field.strip()}" is not a valid field to query.\n\n'
    return None


def newer_build(argv: list[str], rules: list[dict], applied: list[str]) -> bool:
    """True when ``argv`` asks for ``gpu_recovery_action`` (or 580's ``fabric.health.summary``,
    issue 33, or its detail, issue 44) and a case rule answers it: such a rule stands for an nvidia-smi 565 or later,
    which knows the field (issue 28; no Debian build does, so without a rule the harness
    refuses it as they do)."""
    fields = [f.strip() for f in (fx.option_value(argv, "--query-gpu") or "").split(",")]
    return any(f in fields for f in NEWER_FIELDS) and find_rule(rules, argv, applied) is not None


def argv_matches(pattern: list[str], argv: list[str]) -> bool:
    """A rule's argv matches when it is a prefix of the call's argv; ``"*"`` matches any one arg."""
    return len(argv) >= len(pattern) and all(
        want == "*" or want == got for want, got in zip(pattern, argv))


def find_rule(rules: list[dict], argv: list[str], applied: list[str]) -> int | None:
    """Index of the first rule that answers argv; None when none does.

    Args:
        rules: the case's ``tools`` list (argv items as strings).
        argv: the call, argv[0] the tool's basename.
        applied: effect marks already applied in this world (``effects.effect_mark``).
    """
    for index, rule in enumerate(rules):
        if not argv_matches(rule["argv"], argv):
            continue
        before = rule.get("only_before") or {}
        if any(f"{name}={value}" in applied for name, value in before.items()):
            continue
        return index
    return None


def owned_query(argv: list[str], state: dict) -> str | None:
    """Which harness-owned nvidia-smi query argv is: ``full``, ``fabric``, ``csv``, ``cc`` or None."""
    if argv[0] != "nvidia-smi":
        return None
    if fx.option_value(argv, "--query-remapped-rows"):
        return "health"
    fields = fx.option_value(argv, "--query-gpu")
    if fields and any(f.strip().startswith(("ecc.errors.", "retired_pages.", "reset_status."))
                      for f in fields.split(",")):
        return "health"
    if fields and any(field.strip() in _QUERY_FIELDS for field in fields.split(",")):
        return "csv"
    if fields and "uuid" in [field.strip() for field in fields.split(",")]:
        return "identity"  # issue 45: the GPU set the CC step reads around nvattest
    if "-q" in argv or "--query" in argv:
        display = fx.option_value(argv, "-d") or fx.option_value(argv, "--display")
        if display is None:
            return "full"
    if argv[1:3] == ["conf-compute", "-grs"] and state["cc_ready_state"]:
        return "cc"
    return None


def smi_bus_id(address: str) -> str:
    """nvidia-smi's form of a PCI address: ``0000:18:00.0`` -> ``00000000:18:00.0``."""
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def gpu_uuid(address: str) -> str:
    """The UUID the world's GPU at ``address`` has (the same in every call): ``GPU-`` and a
    UUID made from the address (``0000:18:00.0`` -> ``GPU-00000000-0000-4000-8000-000000180000``),
    as nvidia-smi prints a UUID (nvidia-smi-real.md)."""
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    tail = f"{int(domain, 16):04x}{int(bus, 16):02x}{int(slot, 16):02x}{int(function):02x}00"
    return f"GPU-00000000-0000-4000-8000-{tail[-12:]}"


def fabric_labels(world: dict, state: dict) -> tuple[str, str, str, str]:
    """(State, Status, CliqueId, ClusterUUID) every GPU reports now.

    Before any ``fabric`` effect: Not Started on a VM with NVSwitches, N/A (not supported) without.
    """
    if state["fabric"]:
        return fx.FABRIC_STATES[state["fabric"]]
    if any(fx.is_nvswitch(dev) for dev in fx.present_pci(world, state)):
        return fx.FABRIC_STATES["not-started"]
    return fx.FABRIC_NOT_SUPPORTED


def smi_line(indent: int, label: str, value: str) -> str:
    """One ``label : value`` line of ``nvidia-smi -q``."""
    return f"{' ' * indent}{label:<{SMI_LABEL_WIDTH - indent}}: {value}"


def fabric_block(labels: tuple[str, str, str, str]) -> list[str]:
    """The ``Fabric`` section of one GPU in ``nvidia-smi -q``."""
    names = ("State", "Status", "CliqueId", "ClusterUUID")
    return ["    Fabric"] + [smi_line(8, name, value) for name, value in zip(names, labels)]


def merge_fabric(text: str, block: list[str]) -> str:
    """Add ``block`` at the end of every ``GPU <bus id>`` section of ``text`` that has no Fabric."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if _GPU_HEADER.match(line)]
    for start, end in reversed(list(zip(starts, starts[1:] + [len(lines)]))):
        if any(line.strip() == "Fabric" for line in lines[start:end]):
            continue
        at = end
        while at > start + 1 and not lines[at - 1].strip():
            at -= 1
        lines[at:at] = block
    return "\n".join(lines)


class World:
    """What a fake reads about its world: configuration, state, root."""

    def __init__(self, config_path: str):
        self.layout = fx.Layout(os.path.dirname(config_path))
        with open(config_path) as f:
            self.config = json.load(f)

    def state(self) -> dict:
        with fx.locked_state(self.layout) as state:
            return state

    def driver_version(self) -> str | None:
        """The loaded nvidia module's version; None when the module is not loaded."""
        module = fx.chroot_resolve(self.layout.root, "/sys/module/nvidia")
        if not os.path.isdir(module):
            return None
        try:
            with open(os.path.join(module, "version")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return "N/A"

    def nvidia_gpus(self, state: dict) -> list[str]:
        """Addresses of the GPUs bound to nvidia, in index (PCI-address) order."""
        return sorted(dev["address"] for dev in fx.present_pci(self.config, state)
                      if fx.is_nvidia_gpu(dev) and state["bindings"].get(dev["address"]) == "nvidia"
                      and dev.get("nvml", True) is not False)  # nvml: false: NVML misses it


def smi_answer(kind: str, argv: list[str], rule_stdout: str | None, world: World) -> tuple[int, str]:
    """rc and stdout of a harness-owned nvidia-smi query (see the module docstring); a health
    query only when no rule matched.

    Args:
        kind: what :func:`owned_query` returned.
        rule_stdout: the stdout of the rule that answered rc 0, or None when no rule matched.
    """
    state = world.state()
    if kind == "cc":
        return 0, cc_ready_text(state["cc_ready_state"])
    labels = fabric_labels(world.config, state)
    if kind == "full" and rule_stdout is not None:
        return 0, merge_fabric(rule_stdout, fabric_block(labels))
    driver = world.driver_version()
    if driver is None and rule_stdout is None:
        return NO_DRIVER_RC, NVSMI_NO_DRIVER
    gpus = world.nvidia_gpus(state)
    selected = _select_gpus(gpus, fx.option_value(argv, "-i") or fx.option_value(argv, "--id"))
    if not selected and rule_stdout is None:
        return NO_DEVICE_RC, "No devices were found\n"
    if kind == "csv":
        return 0, _query_csv(argv, gpus, selected, labels)
    if kind in ("health", "identity"):
        return 0, _query_csv(argv, gpus, selected, labels,
                             fx.option_value(argv, "--query-remapped-rows"))
    lines = ["", "==============NVSMI LOG==============", "",
             smi_line(0, "Timestamp", "Mon Nov 30 06:00:00 2026"),
             smi_line(0, "Driver Version", driver or "N/A"),
             smi_line(0, "CUDA Version", "N/A"), "",
             smi_line(0, "Attached GPUs", str(len(gpus)))]
    for address in selected:
        lines.append(f"GPU {smi_bus_id(address)}")
        if kind == "full":
            lines += [smi_line(4, "Product Name", "NVIDIA Graphics Device"),
                      smi_line(4, "Minor Number", str(gpus.index(address))),
                      smi_line(4, "Bus Id", smi_bus_id(address))]
        lines += fabric_block(labels) + [""]
    return 0, "\n".join(lines) + "\n"


def cc_ready_text(state: str) -> str:
    """``conf-compute -grs``'s answer as the real program prints it: between blank lines."""
    return f"\nConfidential Compute GPUs Ready state: {state}\n\n"


def fabric_value(field: str, labels: tuple[str, str, str, str]) -> str:
    """``fabric.state``/``fabric.status`` as the real program prints them: labelled
    (``state  Completed``, two spaces; ``status Success``), the status only once the state is
    Completed (else ``status N/A``); ``[N/A]`` unlabelled without a fabric."""
    state, status = labels[0], labels[1]
    if state == "N/A":
        return "[N/A]"
    if field == "fabric.state":
        return f"state  {state}"
    return f"status {status if state == 'Completed' else 'N/A'}"


def _select_gpus(gpus: list[str], ids: str | None) -> list[str]:
    """The GPUs ``-i`` names (indexes or PCI bus ids, comma-separated); all without ``-i``."""
    if not ids:
        return gpus
    wanted = [item.strip().lower() for item in ids.split(",")]
    return [address for index, address in enumerate(gpus)
            if str(index) in wanted or address.lower() in wanted
            or smi_bus_id(address).lower() in wanted]


def _query_csv(argv: list[str], gpus: list[str], selected: list[str],
               labels: tuple[str, str, str, str], listed: str | None = None) -> str:
    """``--query-gpu=<fields> --format=csv[,noheader]`` (or the ``listed`` fields of another
    ``--query-*=``); fields the harness does not model: [N/A]."""
    listed = listed or fx.option_value(argv, "--query-gpu") or ""
    fields = [field.strip() for field in listed.split(",")]
    formats = (fx.option_value(argv, "--format") or "csv").split(",")
    rows = [] if "noheader" in formats else [", ".join(fields)]
    for address in selected:
        values = []
        for field in fields:
            if field in _QUERY_FIELDS:
                values.append(fabric_value(field, labels))
            elif field == "index":
                values.append(str(gpus.index(address)))
            elif field in ("pci.bus_id", "gpu_bus_id"):
                values.append(smi_bus_id(address))
            elif field in ("uuid", "gpu_uuid"):
                values.append(gpu_uuid(address))
            elif field in HEALTHY or field.startswith("ecc.errors."):
                values.append(HEALTHY.get(field, "0"))
            else:
                values.append("[N/A]")
        rows.append(", ".join(values))
    return "".join(row + "\n" for row in rows)


class CallLog:
    """Appends this call's events to the world's JSON-lines call log.

    One ``os.write`` per line on an ``O_APPEND`` descriptor: lines of concurrent fakes do not mix,
    and a signal handler may log without taking a lock.

    Args:
        path: the world's ``calls.jsonl``.
        pid: the calling process (the fake tool's client); this process when None.
    """

    def __init__(self, path: str, pid: int | None = None):
        self.path = path
        self.call = f"{pid or os.getpid()}-{os.urandom(3).hex()}"

    def write(self, event: str, **fields) -> None:
        record = {"event": event, "call": self.call, "t": time.time(), **fields}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def _log_signals(log: CallLog) -> None:
    """Log SIGTERM/SIGINT, then die of the signal as a tool without handlers would (for a
    stand-in that is a process of its own, as the nvattest one)."""

    def handler(signum, frame):
        log.write("signal", signal=signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def sleep_logging(caller, world: World, delay_s: float, during: list[dict]) -> None:
    """The rule's ``delay_s`` with its ``kernel_log_during`` records appended to the world's
    ``/dev/kmsg`` as it passes: each ``after_s`` seconds after the call's start (at most
    ``delay_s``), time-stamped with the real time elapsed since the log's last record when the
    call began (issue 46: Blackwell's attach marks while persistenced starts)."""
    started = time.monotonic()
    with fx.locked_state(world.layout):
        _seq, base_usec = fx.kernel_clock(world.layout)
    for entry in sorted(during, key=lambda e: float(e["after_s"])):
        at = min(float(entry["after_s"]), delay_s)
        caller.sleep(max(at - (time.monotonic() - started), 0.0))
        with fx.locked_state(world.layout):
            usec = base_usec + int((time.monotonic() - started) * 1_000_000)
            fx.append_kernel_log(world.layout, entry["line"], usec)
    caller.sleep(max(delay_s - (time.monotonic() - started), 0.0))


def answer(config_path: str, raw_argv: list[str], caller) -> tuple[int, float]:
    """Answer one fake tool call in the world of ``config_path``, writing to stdout and stderr.

    Args:
        raw_argv: the call's argv, ``raw_argv[0]`` the fake's path (its basename is the tool).
        caller: the calling process, as the fake-tool server knows it (``fake_server.Caller``):
            ``pid`` and ``ppid`` (logged), ``sleep(seconds)`` (the rule's delay; a signal
            the caller gets meanwhile, or its death, ends the call there, with no effect
            applied) and ``log``, which this sets to the call's :class:`CallLog`.

    Returns:
        ``(rc, keep_output_s)``: the exit status, and how long a child of the caller must hold
        its stdout and stderr open after it exits (the rule's ``keep_output_s``, else 0).
    """
    world = World(config_path)
    argv = [os.path.basename(raw_argv[0])] + raw_argv[1:]
    log = caller.log = CallLog(world.layout.calls, caller.pid)
    start_state = world.state()
    log.write("start", pid=caller.pid, ppid=caller.ppid, run=start_state["run"], argv=argv)

    refused = refusal(argv)
    if refused is not None and newer_build(argv, world.config["rules"], start_state["applied"]):
        refused = None  # issue 28: a rule naming gpu_recovery_action stands for nvidia-smi 565+
    if refused is not None:  # the real program refuses before it loads NVML, whatever a rule says
        sys.stdout.write(refused[1])
        sys.stdout.flush()
        log.write("end", rc=refused[0], answer="harness refusal", applied=[])
        return refused[0], 0.0

    rules = world.config["rules"]
    toolkit = world.config.get("toolkit") or toolkit_ctk.versions(None)
    # issue 36: the toolkit's own answers (toolkit_ctk.py): its refusals whatever a rule says,
    # --version and the hook binary's answers unless a rule names them
    own = None
    if argv[0] == "nvidia-ctk":
        own = toolkit_ctk.ctk_answer(argv, toolkit["nvidia-ctk"])
        if own is not None and own[0] == 0 and "--output=" not in argv and any(
                len(r["argv"]) > 1 and argv_matches(r["argv"], argv) for r in rules):
            own = None  # a rule of the case that names the call answers it (not where the
            # version's parser took the word after an empty --output= as its value: issue 42)
    elif argv[0] == "nvidia-cdi-hook" and find_rule(rules, argv, start_state["applied"]) is None:
        own = toolkit_ctk.hook_answer(argv, toolkit["nvidia-cdi-hook"])
    if own is not None:
        sys.stdout.write(own[1])
        sys.stderr.write(own[2])
        sys.stdout.flush()
        sys.stderr.flush()
        log.write("end", rc=own[0], answer=f"harness ({argv[0]} {toolkit[argv[0]]})", applied=[])
        return own[0], 0.0
    imex = imex_ctk.is_imex_generate(argv)
    # issue 28: only a rule that names --mode=imex answers the IMEX generation; a case's plain
    # `nvidia-ctk cdi generate` rule stands for the GPUs' spec
    index = find_rule([r if not imex or "--mode=imex" in r["argv"] else {**r, "argv": ["\0"]}
                       for r in rules], argv, start_state["applied"])
    rule = rules[index] if index is not None else None
    if imex and rule is None:
        try:
            rc, out, err = imex_ctk.answer(argv, world.layout.dir, world.layout.root,
                                           world.config["fixture_dirs"])
        except (fx.EffectError, OSError) as error:
            rc, out, err = 1, "", f"scenario harness: {error}\n"
            log.write("harness-error", message=str(error))
        sys.stdout.write(out)
        sys.stderr.write(err)
        sys.stdout.flush()
        sys.stderr.flush()
        log.write("end", rc=rc, answer="harness (nvidia-ctk --mode=imex)", applied=[])
        return rc, 0.0
    owned = owned_query(argv, start_state)
    if rule is None and owned is None:
        sys.stderr.write(f"scenario {world.config['case_id']}: no rule answers {argv!r}\n")
        log.write("end", rc=UNMATCHED_RC, answer="unmatched")
        return UNMATCHED_RC, 0.0

    if rule and rule.get("kernel_log_during"):
        sleep_logging(caller, world, float(rule["delay_s"]), rule["kernel_log_during"])
    else:
        caller.sleep(float(rule["delay_s"]) if rule else 0)
    rc = int(rule["rc"]) if rule else 0
    stdout = rule["stdout"] if rule else ""
    stderr = rule["stderr"] if rule else ""
    applied: list[str] = []
    if rc == 0 and rule and rule["effects"]:
        try:
            with fx.locked_state(world.layout) as state:
                effects = fx.Effects(world.layout, world.config, state, raw_argv)
                applied = [effects.apply(effect) for effect in rule["effects"]]
                stdout = effects.stdout + stdout
        except (fx.EffectError, OSError) as err:
            rc, stderr = 1, stderr + f"scenario harness: {err}\n"
            log.write("harness-error", message=str(err))
    if rc == 0 and argv[:3] == ["nvidia-ctk", "cdi", "generate"] and not imex:
        stdout = toolkit_ctk.filter_spec(stdout, argv, toolkit["nvidia-ctk"])
    if owned and rc == 0 and not (owned in ("health", "identity") and rule):
        rc, stdout = smi_answer(owned, argv, stdout if rule else None, world)
    harness_out = owned and rule and owned not in ("health", "identity")
    how = (f"rule {index + 1}" if rule else "harness") + (", harness stdout" if harness_out else "")
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    log.write("end", rc=rc, answer=how, applied=applied)
    return rc, float(rule.get("keep_output_s") or 0) if rule else 0.0
