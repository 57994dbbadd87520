"""A scenario world's layout and state, and the effects fake tools apply to it.

The vocabulary is ``shared/cases/EFFECTS.md``; what this module does for each effect, and where it
adds to that file, is written down in ``EFFECTS-harness.md`` next to it. Keep the two in step.

Standard library only: every fake tool call imports this module (start-up time counts, and the
product may pass the fakes a reduced environment).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time

from . import testbed

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # top 16 bits of the 24-bit class: VGA and 3D controller
NVSWITCH_CLASS = 0x0680

# `fabric` states -> (State, Status, CliqueId, ClusterUUID) as nvidia-smi labels them.
FABRIC_STATES = {
    "completed": ("Completed", "Success", "1", "5a1c0b7e-6f2d-4c3b-9e8a-7d6c5b4a3f21"),
    "in-progress": ("In Progress", "N/A", "N/A", "N/A"),
    "not-started": ("Not Started", "N/A", "N/A", "N/A"),
    "insufficient-resources": (
        "Completed", "Insufficient Resources", "0", "00000000-0000-0000-0000-000000000000"),
}
FABRIC_NOT_SUPPORTED = ("N/A", "N/A", "N/A", "N/A")

# effect name -> (allowed values or None for any string, extra parameters it takes)
EFFECTS = {
    "load_module": (None, {"version", "major", "flavour"}),
    "create_nodes": ({"control", "gpus", "infiniband"}, set()),
    "write_spec": (None, set()),
    "write_spec_text": (None, set()),
    "daemon_ready": ({"persistenced", "nvlsm"}, set()),
    "fabric": (set(FABRIC_STATES), set()),
    "cc_ready_state": ({"ready", "not-ready"}, set()),
    # the harness's own (issue 28): a character major the driver registers in /proc/devices
    "register_char_device": ({"nvidia-caps-imex-channels"}, {"major"}),
    # issue 46 (harness only): one kernel-log record appended after the effects before it
    "kernel_log": (None, set()),
}
FLAVOURS = ("open", "proprietary")

# Character devices a module registers in /proc/devices: module -> (name there, default major).
CHAR_DEVICES = {"nvidia": ("nvidia", 195), "nvidia_uvm": ("nvidia-uvm", 510)}
# create_nodes control: node -> (/proc/devices name, minor), as nvidia-ctk creates them.
CONTROL_NODES = {
    "nvidiactl": ("nvidia", 255),
    "nvidia-modeset": ("nvidia", 254),
    "nvidia-uvm": ("nvidia-uvm", 0),
    "nvidia-uvm-tools": ("nvidia-uvm", 1),
}
NVRM_VERSION = {
    "open": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024\n",
    "proprietary": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Tue Mar  5 22:15:33 UTC 2024\n",
}
GCC_VERSION = "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
STAND_IN_CODE = "import time; time.sleep(3600)"
# The IMEX channels' major is dynamic (the driver asks for one); 509 is a free one in the worlds,
# beside nvidia-uvm's 510, as the kernel hands dynamic majors out downward from 511.
IMEX_MAJOR = 509
IB_UMAD_MAJOR = 231  # IB_UMAD_MAJOR, drivers/infiniband/core/user_mad.c
NVLSM_SOCKET = "/run/nvidia-fabricmanager/fm_sm_ipc.socket"
NVLSM_PID = "/run/podvm-gpu/nvlsm.pid"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes including the terminating NUL
_HOST_PATH = re.compile(r'(hostPath"?\s*:\s*"?)(/[^"\s,}\]]*)')


class Layout:
    """The paths of one world directory (keep it short: a unix socket lives under ``root``).

    Args:
        directory: the world directory, e.g. ``/tmp/pgk2j4x1c8``.
    """

    def __init__(self, directory: str):
        self.dir = directory
        self.root = os.path.join(directory, "root")  # the product's --root
        self.bin = os.path.join(directory, "bin")  # the fake tools; the product's only PATH entry
        self.config = os.path.join(directory, "world.json")  # case id, rules, PCI devices, fixtures
        self.state = os.path.join(directory, "state.json")  # what effects changed (see initial_state)
        self.lock = os.path.join(directory, "state.lock")
        self.calls = os.path.join(directory, "calls.jsonl")  # one JSON event per line
        self.tree = os.path.join(directory, "pci.umockdev")  # rewritten before every product run
        self.out = os.path.join(directory, "out")  # the product's stdout and stderr per run
        self.tmp = os.path.join(directory, "tmp")  # TMPDIR of umockdev-run: its live testbeds


class EffectError(Exception):
    """An effect could not be applied: a case error, or a write the harness refuses."""


def pci_class(dev: dict) -> int:
    """The 24-bit class code of a case's ``pci`` entry (``"0x030200"`` -> 0x030200)."""
    return int(str(dev["class"]), 16)


def is_nvidia_gpu(dev: dict) -> bool:
    """An NVIDIA VGA or 3D controller (contract section 3, step 1)."""
    return int(str(dev["vendor"]), 16) == NVIDIA_VENDOR and pci_class(dev) >> 8 in GPU_CLASSES


def is_nvswitch(dev: dict) -> bool:
    """An NVIDIA bridge of class 0x0680xx."""
    return int(str(dev["vendor"]), 16) == NVIDIA_VENDOR and pci_class(dev) >> 8 == NVSWITCH_CLASS


def chroot_resolve(root: str, path: str) -> str:
    """Map an absolute path inside the root to a real path, following symlinks as a chroot would.

    An absolute link target (``var/run -> /run``) is taken under ``root`` and ``..`` stops at it,
    so the result never leaves the root. Missing components are appended as they are.

    Raises:
        OSError: more than 40 links in one lookup (a loop).
    """
    todo = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(root, *done, part)
        if os.path.islink(candidate):
            links += 1
            if links > 40:
                raise OSError(f"too many levels of symbolic links under {root}: {path}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            continue
        done.append(part)
    return os.path.join(root, *done)


def option_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name=V`` or ``--name V`` in argv; None when the option is absent."""
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if arg.startswith(name + "="):
            return arg[len(name) + 1:]
    return None


def yaml_spec_as_json(text: str) -> str:
    """A captured YAML spec as nvidia-ctk 1.20 prints it with ``--format=json``: the same object
    in compact JSON on one line, keys in the YAML's order, no trailing newline
    (fixtures/nvidia-ctk: ``spec-1gpu.json`` is exactly this of ``spec-1gpu.yaml``). The world
    renders them when it is made (``json_specs`` of world.json): the fakes run without PyYAML."""
    import yaml

    return json.dumps(yaml.safe_load(text), separators=(",", ":"))


def spec_output_path(argv: list[str]) -> str | None:
    """Where ``nvidia-ctk cdi generate`` with this argv writes its spec; None means stdout.

    nvidia-ctk 1.20 appends ``.yaml`` to an ``--output`` without a ``.yaml``/``.json`` extension,
    and an empty or absent ``--output`` prints the spec (fixtures/nvidia-ctk/README.md).
    """
    output = option_value(argv, "--output")
    if not output:
        return None
    return output if output.endswith((".yaml", ".json")) else output + ".yaml"


def prefix_host_paths(text: str, dev_root: str | None, driver_root: str | None) -> str:
    """Put the roots nvidia-ctk got in front of every ``hostPath`` of a YAML or JSON spec.

    Device nodes (``/dev/...``) get the dev root, everything else the driver root; the dev root
    defaults to the driver root, as in nvidia-ctk. A root of ``/`` (or none) changes nothing.
    """
    dev_root = dev_root or driver_root

    def prefixed(match: re.Match) -> str:
        path = match.group(2)
        root = dev_root if path == "/dev" or path.startswith("/dev/") else driver_root
        if not root or root == "/":
            return match.group(0)
        return match.group(1) + root.rstrip("/") + path

    return _HOST_PATH.sub(prefixed, text)


def effect_name(effect: dict) -> str:
    """The vocabulary key of an effect mapping (``{load_module: nvidia, version: V}`` -> load_module)."""
    names = [key for key in effect if key in EFFECTS]
    if len(names) != 1:
        raise EffectError(f"effect {effect!r} must name exactly one of {sorted(EFFECTS)}")
    return names[0]


def effect_mark(effect: dict) -> str:
    """The ``name=value`` mark an applied effect leaves in the state; ``only_before`` looks for it."""
    name = effect_name(effect)
    return f"{name}={effect[name]}"


def validate_effect(effect: object) -> None:
    """Check an effect against the vocabulary before any tool runs.

    Raises:
        EffectError: unknown effect, value or parameter.
    """
    if not isinstance(effect, dict):
        raise EffectError(f"effect {effect!r} is not a mapping")
    name = effect_name(effect)
    values, params = EFFECTS[name]
    value = effect[name]
    if not isinstance(value, str) or (values is not None and value not in values):
        raise EffectError(f"{name}: {value!r} is not one of {sorted(values) if values else 'strings'}")
    unknown = set(effect) - {name} - params
    if unknown:
        raise EffectError(f"{name}: unknown parameter(s) {sorted(unknown)}")
    if effect.get("flavour", "open") not in FLAVOURS:
        raise EffectError(f"load_module: flavour must be one of {FLAVOURS}")
    if not isinstance(effect.get("version", ""), str) or not isinstance(effect.get("major", 0), int):
        raise EffectError("load_module: version must be a string (quote it), major an integer")


_ERROR_WORDS = re.compile(r"\b(errors?|fail(s|ed|ure)?|cannot|unable|timeout|timed out)\b", re.I)
_LEVEL = re.compile(r"<([0-7])>")


def kmsg_level(line: str) -> tuple[int, str]:
    """A ``kernel_log`` line's level and message: a leading ``<0>``..``<7>`` gives the level
    (EFFECTS.md, "Files and symlinks"); without one, :func:`kmsg_priority` guesses it."""
    m = _LEVEL.match(line)
    if m:
        return int(m.group(1)), line[m.end():]
    return kmsg_priority(line), line


def kmsg_priority(message: str) -> int:
    """Syslog level of a kernel-log line: 3 (err) for Xid and error words, 4 (warning) for taint
    notices, 6 (info) otherwise. Taint comes first: 'module verification failed ... tainting
    kernel' is a notice in the kernel, not an error."""
    if "NVRM: Xid" in message:
        return 3
    if "taint" in message.lower():
        return 4
    return 3 if _ERROR_WORDS.search(message) else 6


def initial_state(pci: list[dict], pci_late: list[dict] = ()) -> dict:
    """The state of a new world: bindings as the case's ``pci`` and ``pci_late`` give them,
    nothing applied yet, no late device arrived."""
    return {
        "run": None,  # the product run in progress: boot, rerun or check
        "bindings": {dev["address"]: dev.get("driver") for dev in [*pci, *pci_late]},
        "arrived": [],  # addresses of pci_late devices in the testbed (all of them after boot)
        "arrivals": [],  # [{"address", "at_s", "testbeds", "monitors"}] each live arrival
        "applied": [],  # effect marks, see effect_mark
        "marked_at": {},  # mark -> time.time() its first application began
        "fabric": None,  # a FABRIC_STATES key once a fabric effect applied
        "cc_ready_state": None,
        "daemons": [],  # [{"tool": ..., "pid": ...}] stand-ins started by daemon_ready / fabric
    }


def present_pci(world: dict, state: dict) -> list[dict]:
    """The PCI devices the VM has now: the case's ``pci`` plus the ``pci_late`` ones arrived."""
    return world["pci"] + [dev for dev in world.get("pci_late", [])
                           if dev["address"] in state["arrived"]]


@contextlib.contextmanager
def locked_state(layout: Layout):
    """Yield the world's state (a dict) under an exclusive lock; changes are saved on exit.

    Two fakes may run at once; the lock also covers the files their effects write under the root.
    """
    with open(layout.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(layout.state) as f:
            state = json.load(f)
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            tmp = layout.state + ".tmp"
            with open(tmp, "w") as f:
                json.dump(state, f, indent=1)
            os.replace(tmp, layout.state)


_KMSG_HEAD = re.compile(r"(\d+),(\d+),(\d+),")
_KMSG_LEVEL = re.compile(r"<([0-7])>")


def kernel_clock(layout: Layout) -> tuple[int, int]:
    """The world's ``/dev/kmsg`` as it ends now: ``(last seq, last usec)`` (``(-1, 1000000)``
    for an empty log), for records a fake appends (:func:`append_kernel_log`)."""
    path = chroot_resolve(layout.root, "/dev/kmsg")
    seq, usec = -1, 1_000_000
    with open(path) as f:
        for line in f:
            m = _KMSG_HEAD.match(line)
            if m:
                seq, usec = int(m.group(2)), int(m.group(3))
    return seq, usec


def append_kernel_log(layout: Layout, line: str, usec: int) -> None:
    """Append one record to the world's ``/dev/kmsg`` (rule key ``kernel_log_during``): the
    next seq, the time stamp ``usec``, the level of the line's ``<n>`` prefix (required: the
    harness's guess from the words lives in world.py, which a fake does not import).

    Raises:
        EffectError: the line has no ``<0>``..``<7>`` prefix.
    """
    m = _KMSG_LEVEL.match(line)
    if m is None:
        raise EffectError(f"kernel_log_during line {line!r} must begin with its level, <0>..<7>")
    seq, _usec = kernel_clock(layout)
    path = chroot_resolve(layout.root, "/dev/kmsg")
    with open(path, "a") as f:
        f.write(f"{m.group(1)},{seq + 1},{usec},-;{line[m.end():]}\n")


def char_majors(root: str) -> dict[str, int]:
    """The character part of the root's ``/proc/devices``: name -> major."""
    majors: dict[str, int] = {}
    try:
        with open(chroot_resolve(root, "/proc/devices")) as f:
            text = f.read()
    except FileNotFoundError:
        return majors
    in_char = False
    for line in text.splitlines():
        if line.strip() == "Character devices:":
            in_char = True
        elif not line.strip():
            in_char = False
        elif in_char and len(line.split()) == 2 and line.split()[0].isdigit():
            majors[line.split()[1]] = int(line.split()[0])
    return majors


class Effects:
    """Applies the effects of one matched rule for one call of a fake tool.

    Use inside :func:`locked_state`; ``stdout`` collects what the effects print (a spec sent to
    stdout).

    Args:
        layout: the world's paths.
        world: the world configuration (``world.json``): ``pci``, ``fixture_dirs``, ``python``.
        state: the locked state dict, changed in place.
        argv: the call's argv as the tool received it (argv[0] the path it was run by).
    """

    def __init__(self, layout: Layout, world: dict, state: dict, argv: list[str]):
        self.layout = layout
        self.world = world
        self.state = state
        self.argv = argv
        self.stdout = ""

    def path(self, host_path: str) -> str:
        """A path inside the root, resolved chroot-style."""
        return chroot_resolve(self.layout.root, host_path)

    def apply(self, effect: dict) -> str:
        """Apply one effect and return its mark.

        Raises:
            EffectError: the effect cannot be applied (missing fixture, unsafe path, ...).
        """
        name = effect_name(effect)
        method = "_register_char_device_effect" if name == "register_char_device" else "_" + name
        began = time.time()
        getattr(self, method)(effect[name], effect)
        mark = effect_mark(effect)
        if mark not in self.state["applied"]:
            self.state["applied"].append(mark)
            # issue 46: when the effect began (the call log's clock); the ordering check reads
            # persistenced's readiness from here (tests/scenarios/order.py)
            self.state.setdefault("marked_at", {})[mark] = began
        return mark

    # -- modules ------------------------------------------------------------------------------

    def _load_module(self, name: str, effect: dict) -> None:
        modules = self.path("/proc/modules")
        text = _read(modules)
        if not any(line.split()[:1] == [name] for line in text.splitlines()):
            if text and not text.endswith("\n"):
                text += "\n"
            _write(modules, text + f"{name} 16384 0 - Live 0x0000000000000000\n")
        module_dir = self.path(f"/sys/module/{name}")
        os.makedirs(module_dir, exist_ok=True)
        if "version" in effect:
            _write(os.path.join(module_dir, "version"), f"{effect['version']}\n")
        if name in CHAR_DEVICES:
            device, major = CHAR_DEVICES[name]
            self._register_char_device(device, int(effect.get("major", major)))
        if name == "nvidia":
            if "version" in effect:
                banner = NVRM_VERSION[effect.get("flavour", "open")].format(v=effect["version"])
                _write(self.path("/proc/driver/nvidia/version"), banner + GCC_VERSION)
            self._bind_gpus()

    def _register_char_device_effect(self, name: str, effect: dict) -> None:
        """``register_char_device: nvidia-caps-imex-channels`` (``major``, default
        :data:`IMEX_MAJOR`): the line the driver adds to ``/proc/devices`` for its IMEX channels."""
        self._register_char_device(name, int(effect.get("major", IMEX_MAJOR)))

    def _register_char_device(self, name: str, major: int) -> None:
        path = self.path("/proc/devices")
        text = _read(path) or "Character devices:\n\nBlock devices:\n"
        lines = text.splitlines()
        if "Character devices:" not in lines:
            lines[:0] = ["Character devices:", ""]
        start = lines.index("Character devices:") + 1
        end = start
        while end < len(lines) and lines[end].strip():
            end += 1
        entries = lines[start:end]
        if any(entry.split()[1:] == [name] for entry in entries):
            return
        entries.append(f"{major:3d} {name}")
        entries.sort(key=lambda entry: int(entry.split()[0]))
        lines[start:end] = entries
        _write(path, "\n".join(lines) + "\n")

    def _bind_gpus(self) -> None:
        """Bind every NVIDIA GPU on PCI that no other driver holds to ``nvidia``.

        Minors: a GPU that has its ``information`` file keeps its minor; the others get the next
        free ones in PCI-address order (from 0 at the first load). A late GPU that arrives after
        the module loaded is bound with the next free minor too (:meth:`bind_arrival`).
        """
        bindings = self.state["bindings"]
        gpus = sorted(
            (dev for dev in present_pci(self.world, self.state)
             if is_nvidia_gpu(dev) and bindings.get(dev["address"]) in (None, "nvidia")),
            key=lambda dev: dev["address"])
        information = self.path("/proc/driver/nvidia/gpus/{}/information")
        taken = {_device_minor(information.format(dev["address"])) for dev in gpus} - {None}
        free = (minor for minor in range(len(gpus) + len(taken)) if minor not in taken)
        for dev in gpus:
            address = dev["address"]
            if _device_minor(information.format(address)) is None:
                _write(information.format(address), _gpu_information(dev, next(free)))
            if bindings.get(address) != "nvidia":
                bindings[address] = "nvidia"
                _bind_live(self.layout, dev, "nvidia")

    def bind_arrival(self) -> None:
        """A late device arrived: once ``load_module: nvidia`` applied, the driver binds a new
        GPU as the kernel probes a new device."""
        if "load_module=nvidia" in self.state["applied"]:
            self._bind_gpus()

    # -- device nodes ----------------------------------------------------------------------------

    def _create_nodes(self, which: str, effect: dict) -> None:
        majors = char_majors(self.layout.root)
        if which == "infiniband":  # ib_umad's nodes: umad<N> 231:N, issm<N> 231:64+N
            names = [ib["name"] for ib in self.world.get("infiniband", [])]
            nodes = [(f"infiniband/umad{i}", IB_UMAD_MAJOR, i) for i in range(len(names))]
            nodes += [(f"infiniband/issm{i}", IB_UMAD_MAJOR, 64 + i) for i in range(len(names))]
        elif which == "control":
            nodes = [(node, majors.get(device), minor)
                     for node, (device, minor) in CONTROL_NODES.items()]
        else:
            gpus_dir = self.path("/proc/driver/nvidia/gpus")
            minors = [_device_minor(os.path.join(gpus_dir, address, "information"))
                      for address in sorted(os.listdir(gpus_dir))] if os.path.isdir(gpus_dir) else []
            nodes = [(f"nvidia{minor}", majors.get("nvidia"), minor)
                     for minor in minors if minor is not None]
        for node, major, minor in nodes:
            target = self.path(f"/dev/{node}")
            if major is None or os.path.lexists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(major, minor))
            os.chmod(target, 0o666)

    # -- CDI specs ---------------------------------------------------------------------------

    def _write_spec(self, name: str, effect: dict) -> None:
        base = name.removeprefix("fixtures/nvidia-ctk/")
        for directory in self.world["fixture_dirs"]:
            candidate = os.path.join(directory, base)
            if os.path.isfile(candidate):
                text = _read(candidate)
                if option_value(self.argv, "--format") == "json":  # rendered by the world
                    text = self.world.get("json_specs", {}).get(base, text)
                self._emit_spec(text)
                return
        raise EffectError(f"write_spec: no fixture {base!r} in {self.world['fixture_dirs']}")

    def _write_spec_text(self, text: str, effect: dict) -> None:
        self._emit_spec(text)

    def _emit_spec(self, text: str) -> None:
        text = prefix_host_paths(text, option_value(self.argv, "--dev-root"),
                                 option_value(self.argv, "--driver-root"))
        output = spec_output_path(self.argv)
        if output is None:
            self.stdout += text
            return
        target = os.path.realpath(output)
        if not target.startswith(os.path.realpath(self.layout.dir) + os.sep):
            raise EffectError(f"write_spec: refusing to write {output!r}, outside the world "
                              f"{self.layout.dir} (was --driver-root/--dev-root forgotten?)")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write(target, text)

    # -- daemons -----------------------------------------------------------------------------

    def _daemon_ready(self, which: str, effect: dict) -> None:
        import socket

        if which == "nvlsm":  # podvm_gpu/steps/fabric/nvl5.py: the FM-SM socket served, the pid file
            socket_path = self.path(NVLSM_SOCKET)
            pid_file = option_value(self.argv, "--pid_file") or self.path(NVLSM_PID)
            run_dir, tool, comm = os.path.dirname(socket_path), "nvlsm", "nvlsm"
        else:
            run_dir = self.path("/var/run/nvidia-persistenced")
            socket_path = os.path.join(run_dir, "socket")
            pid_file = os.path.join(run_dir, "nvidia-persistenced.pid")
            tool, comm = "nvidia-persistenced", "nvidia-persiste"
        os.makedirs(run_dir, exist_ok=True)
        if len(socket_path.encode()) > SOCKET_PATH_MAX:
            raise EffectError(f"daemon_ready: socket path longer than {SOCKET_PATH_MAX} bytes: "
                              f"{socket_path}")
        if os.path.lexists(socket_path):
            os.unlink(socket_path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(socket_path)
            listener.listen()
            # The stand-in inherits the listening socket, so connect() works while it lives.
            pid = self._start_stand_in(tool, listener.fileno())
        if not os.path.realpath(pid_file).startswith(os.path.realpath(self.layout.dir) + os.sep):
            raise EffectError(f"daemon_ready: pid file {pid_file} outside the world")
        os.makedirs(os.path.dirname(pid_file), exist_ok=True)
        self._describe_daemon(pid, pid_file, comm)

    def _fabric(self, value: str, effect: dict) -> None:
        self.state["fabric"] = value
        run_dir = self.path("/var/run/nvidia-fabricmanager")
        os.makedirs(run_dir, exist_ok=True)
        pid = self._start_stand_in("nv-fabricmanager")
        self._describe_daemon(pid, os.path.join(run_dir, "nv-fabricmanager.pid"), "nv-fabricmanage")

    def _start_stand_in(self, tool: str, *keep_fds: int) -> int:
        """Start a long-lived process standing in for a daemon, in its own session.

        Its argv carries the world directory, so the harness finds and ends it with the world.
        """
        import subprocess

        process = subprocess.Popen(
            [self.world["python"], "-IS", "-c", STAND_IN_CODE, self.layout.dir, tool],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=keep_fds, start_new_session=True, cwd="/", env={})
        self.state["daemons"].append({"tool": tool, "pid": process.pid})
        return process.pid

    def _describe_daemon(self, pid: int, pid_file: str, comm: str) -> None:
        """Pid file plus the root's ``/proc/<pid>/{comm,cmdline}``: what the product reads."""
        _write(pid_file, f"{pid}\n")
        _write(self.path(f"/proc/{pid}/comm"), comm + "\n")
        _write(self.path(f"/proc/{pid}/cmdline"), "".join(arg + "\0" for arg in self.argv))

    # -- confidential computing --------------------------------------------------------------

    def _cc_ready_state(self, value: str, effect: dict) -> None:
        self.state["cc_ready_state"] = value

    def _kernel_log(self, line: str, effect: dict) -> None:
        """Append one record to ``dev/kmsg`` (issue 46): the level as a case's ``kernel_log``
        line gets it, the next sequence number, and the time since the world was made
        (``world.json`` ``created``) on the record clock of ``kernel_log`` (which starts at
        1 s), never before the last record."""
        level, message = kmsg_level(line)
        kmsg = self.path("/dev/kmsg")
        lines = _read(kmsg).splitlines()
        last = lines[-1].split(";", 1)[0].split(",") if lines else None
        seq = int(last[1]) + 1 if last else 0
        usec = 1_000_000 + int((time.time() - float(self.world.get("created", time.time()))) * 1e6)
        usec = max(usec, int(last[2]) + 1 if last else 0)
        with open(kmsg, "a") as f:
            f.write(f"{level},{seq},{usec},-;{message}\n")


def _gpu_information(dev: dict, minor: int) -> str:
    """``/proc/driver/nvidia/gpus/<pci>/information`` as the driver prints it (placeholder model)."""
    uuid = f"GPU-{int(str(dev['device']), 16):08x}-0000-4000-8000-{minor:012x}"
    return (f"Model: \t\t NVIDIA Graphics Device\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {dev['address']}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def _device_minor(information: str) -> int | None:
    for line in _read(information).splitlines():
        label, _, value = line.partition(":")
        if label.strip() == "Device Minor" and value.strip().isdigit():
            return int(value.strip())
    return None


def _bind_live(layout: Layout, dev: dict, driver: str) -> None:
    """Bind a device in the world's running umockdev testbeds too (``umockdev-run`` makes them
    under ``layout.tmp``), so the product sees the binding in the same run; the next run gets a
    fresh testbed from the rewritten tree file anyway. Every live testbed is the same VM (a
    second boot started beside the first has its own), so each gets the binding."""
    devpath = testbed.pci_devpath(dev)
    for bed in testbed.live_testbeds(layout.tmp):
        device = os.path.join(bed, "sys" + devpath)
        if not os.path.isdir(device) or os.path.lexists(os.path.join(device, "driver")):
            continue
        try:
            os.symlink(f"{testbed.up_to_sys(devpath)}bus/pci/drivers/{driver}",
                       os.path.join(device, "driver"))
            with open(os.path.join(device, "uevent"), "a") as f:
                f.write(f"DRIVER={driver}\n")
        except OSError:
            # the run ended meanwhile (the kill loop killed the product while this modprobe
            # ran) and umockdev removed its testbed. Failing here left the module loaded with
            # the GPUs unbound in the state: the kernel binds them in the same init_module call
            continue


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _write(path: str, text: str) -> None:
    """Write a file (mode 0644), creating its directories."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
