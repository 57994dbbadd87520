"""IMEX channels (``imex.channels``, issue 28): the channel nodes and their CDI spec, part of
step 9, ``cdi``; its failures read ``cdi: imex: ...``.

Multi-node NVLink (GB200/GB300 NVL72) needs, besides the GPUs, an IMEX channel in the container:
without one, CUDA's fabric-memory imports fail at run time (kubernetes-sigs/dra-driver-nvidia-gpu
#1417). A channel is the character device ``/dev/nvidia-caps-imex-channels/channel<id>``, major
``nvidia-caps-imex-channels`` of ``/proc/devices`` (dynamic; the driver registers it), minor the
channel id. The nodes are made as the ``device-nodes`` step makes a GPU's (steps/nodes.py: mknod,
mode 0666, nothing that exists replaced). The spec comes from
``nvidia-ctk cdi generate --mode=imex --class=imex-channel``: nvidia-ctk 1.20.0 without
``--class`` writes kind ``nvidia.com/gpu`` with devices ``0``, ``1``, ``all`` made of channels,
which collide with the GPUs' spec (tests/data/fixtures/nvidia-ctk/generate-imex-*.txt, real
output), so a spec of any other kind, or whose devices are not exactly the channels asked plus
``all``, is refused. It is installed as ``/var/run/cdi/nvidia-imex.yaml`` just before the GPUs'
spec; a no-gpu or failed boot removes it (cdi/unavailable.py), as does a ready boot with
``imex.channels: []``.
"""

from __future__ import annotations

import os

from podvm_gpu import nvidia_ctk
from podvm_gpu.cdi import IMEX_KIND, IMEX_SPEC_PATH, MAX_SPEC_BYTES
from podvm_gpu.cdi.parse import parse_spec
from podvm_gpu.errors import CdiSpecError, CommandError, StepFailed, exit_text
from podvm_gpu.host.devnode import Node, make_node, node_problem
from podvm_gpu.host.fs import Root, atomic_write, ensure_dir, read_bounded, unread
from podvm_gpu.readers import char_majors
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, Check
from podvm_gpu.steps.context import BootContext

IMEX_MAJOR_NAME = "nvidia-caps-imex-channels"  # its /proc/devices name
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
ALL_DEVICE = "all"


def channel_path(channel: int) -> str:
    """``/dev/nvidia-caps-imex-channels/channel<channel>``."""
    return f"{CHANNEL_DIR}/channel{channel}"


def channel_nodes(root: Root, channels) -> list[Node]:
    """The nodes of ``channels`` (ids), with the major of ``/proc/devices`` (None: not there)."""
    major = char_majors(root).get(IMEX_MAJOR_NAME)
    return [Node(channel_path(c), major, c) for c in channels]


def make_channels(ctx: BootContext, channels) -> list[Node]:
    """Make every channel node that is missing (mknod, mode 0666, as steps/nodes.py).

    Raises:
        StepFailed: no IMEX major in /proc/devices (the driver has no IMEX channel support),
            something else at a node's path, mknod failed, or a node has other numbers.
    """
    nodes = channel_nodes(ctx.root, channels)
    if nodes and nodes[0].major is None:
        raise StepFailed(f"imex: no '{IMEX_MAJOR_NAME}' major in /proc/devices: the loaded "
                         "driver has no IMEX channel support, so the channels of imex.channels "
                         "cannot be made")
    for node in nodes:
        path = ctx.root.resolve(node.path, follow_last=False)
        if os.path.lexists(path) and node_problem(ctx.root, node) is None:
            continue
        try:
            make_node(ctx.root, node)
        except StepFailed as err:
            raise StepFailed(f"imex: {err}") from err
        except OSError as err:
            raise StepFailed(f"imex: cannot make {node.path}: {err.strerror or err}") from err
    for node in nodes:
        problem = node_problem(ctx.root, node)
        if problem:
            raise StepFailed(f"imex: {problem}")
    return nodes


def spec_problems(spec, root: Root, channels) -> list[str]:
    """What makes a valid CDI spec unfit as the IMEX spec of ``channels``: its kind, its devices
    (exactly one per channel, named by the id, plus ``all``), each device's nodes (its own
    channel; ``all``: every channel), and each node on the host (a character device with the
    IMEX major and the channel's minor)."""
    if spec.kind != IMEX_KIND:
        return [f"kind {spec.kind}, not {IMEX_KIND}: a spec of {spec.kind} made of IMEX "
                "channels would collide with the GPUs' devices (nvidia-ctk without "
                "--class=imex-channel writes that)"]
    wanted = [str(c) for c in channels] + [ALL_DEVICE]
    names = spec.device_names()
    if sorted(names) != sorted(wanted):
        return [f"devices {', '.join(names) or 'none'}, expected exactly "
                f"{', '.join(wanted)} (imex.channels)"]
    problems = []
    by_path = {node.path: node for node in channel_nodes(root, channels)}
    for device in spec.devices:
        paths = sorted(n.path for n in device.container_edits.device_nodes)
        expected = sorted(by_path) if device.name == ALL_DEVICE else \
            [channel_path(int(device.name))]
        if paths != expected:
            problems.append(f"device {device.name}: nodes {', '.join(paths) or 'none'}, "
                            f"expected {', '.join(expected)}")
            continue
        for node in device.container_edits.device_nodes:
            host = node.host_path or node.path
            if not _host_path_ok(root, host, node.path):
                problems.append(f"device {device.name}: hostPath {host} is not under the root")
                continue
            problem = node_problem(root, by_path[node.path])
            if problem:
                problems.append(f"device {device.name}: {problem}")
    return problems


def _host_path_ok(root: Root, host: str, path: str) -> bool:
    """True when a node's ``hostPath`` is its ``path`` under the root (nvidia-ctk puts its
    ``--dev-root`` in front)."""
    prefix = "" if root.is_host else root.path.rstrip("/")
    return host == prefix + path


class ImexSpec:
    """A generated IMEX spec that passed validation: nvidia-ctk's text and the model."""

    def __init__(self, text: str, spec, channels):
        self.text, self.spec, self.channels = text, spec, tuple(channels)


def generate(ctx: BootContext) -> ImexSpec | None:
    """Make the channel nodes, then generate and validate their spec; None when imex is off.

    Raises:
        StepFailed: ``imex: ...``: the nodes (see :func:`make_channels`), nvidia-ctk failed or
            timed out (its last error), the spec is not valid CDI (section 8) or not the IMEX
            spec of the channels asked (:func:`spec_problems`).
    """
    channels = ctx.config.imex.channels
    if not channels:
        return None
    make_channels(ctx, channels)
    try:
        done = ctx.runner.run(nvidia_ctk.generate_imex_argv(ctx.root))
    except CommandError as err:
        if err.timed_out:
            raise StepFailed(f"imex: nvidia-ctk cdi generate --mode=imex timed out after "
                             f"{err.timeout_s:g} s") from err
        if err.held_open or err.returncode is None:
            raise StepFailed(f"imex: {err if err.held_open else err.tool_message()}") from err
        raise StepFailed(f"imex: nvidia-ctk cdi generate --mode=imex failed "
                         f"({exit_text(err.returncode)}): {err.tool_message()}") from err
    try:
        spec = parse_spec(done.stdout, source="nvidia-ctk cdi generate --mode=imex")
    except CdiSpecError as err:
        raise StepFailed(f"imex: the generated spec is invalid: {err}") from err
    problems = spec_problems(spec, ctx.root, channels)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise StepFailed("imex: the generated spec is refused: " + "; ".join(problems[:3]) + more)
    return ImexSpec(done.stdout, spec, channels)


def install(ctx: BootContext, imex: ImexSpec | None) -> str:
    """Install the IMEX spec atomically at :data:`IMEX_SPEC_PATH`, or remove an earlier one when
    imex is off; returns a message part ("" when there was nothing to do).

    Raises:
        StepFailed: the spec cannot be written, or an earlier one removed.
    """
    target = ctx.root.resolve(IMEX_SPEC_PATH, follow_last=False)
    if imex is None:
        try:
            os.unlink(target)
        except FileNotFoundError:
            return ""
        except OSError as err:
            raise StepFailed(f"imex: cannot remove the earlier {IMEX_SPEC_PATH} (imex is off): "
                             f"{err.strerror or err}") from err
        return f"earlier {IMEX_SPEC_PATH} removed (imex is off)"
    try:
        ensure_dir(os.path.dirname(target))
        atomic_write(target, imex.text)
    except OSError as err:
        raise StepFailed(f"imex: cannot install {IMEX_SPEC_PATH}: {err.strerror or err}") from err
    return f"{IMEX_SPEC_PATH}: {len(imex.channels)} IMEX channel(s) " \
           f"({', '.join(map(str, imex.channels))})"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the IMEX generation when ``imex.channels`` is set."""
    return [nvidia_ctk.generate_imex_argv(ctx.root)] if ctx.config.imex.channels else []


# --- podvm-gpu check ----------------------------------------------------------------------

def _off_or_skip(facts, row: str) -> Check | None:
    if not facts.config.imex.channels:
        return Check(row, SKIP, "imex is off (imex.channels is empty)")
    if not facts.gpus:
        return Check(row, SKIP, NO_GPU)
    skip = facts.not_reached("cdi")
    if skip:
        return Check(row, SKIP, skip.detail)
    return None


def imex_channels_row(facts) -> Check:
    """The channel nodes of ``imex.channels``: character devices with the IMEX major."""
    skip = _off_or_skip(facts, "imex-channels")
    if skip:
        return skip
    nodes = channel_nodes(facts.root, facts.config.imex.channels)
    if nodes[0].major is None:
        return Check("imex-channels", FAIL, f"no '{IMEX_MAJOR_NAME}' major in /proc/devices",
                     "the loaded driver has no IMEX channel support: use a driver that has it, "
                     "or set imex.channels: []")
    problems = [p for p in (node_problem(facts.root, n) for n in nodes) if p]
    if problems:
        return Check("imex-channels", FAIL, "; ".join(problems[:3]),
                     "run podvm-gpu boot: its cdi step makes them")
    return Check("imex-channels", PASS, f"{len(nodes)} channel node(s) with major "
                 f"{nodes[0].major} as in /proc/devices: "
                 f"{', '.join(n.path for n in nodes)}")


def imex_spec_row(facts) -> Check:
    """``/var/run/cdi/nvidia-imex.yaml``: valid CDI and the IMEX spec of ``imex.channels``."""
    skip = _off_or_skip(facts, "imex-spec")
    if skip:
        return skip
    try:
        text = read_bounded(facts.root.resolve(IMEX_SPEC_PATH), MAX_SPEC_BYTES).decode(
            "utf-8", errors="replace")
    except FileNotFoundError:
        return Check("imex-spec", FAIL, f"{IMEX_SPEC_PATH} is missing",
                     "run podvm-gpu boot, or see podvm-gpu status")
    except OSError as err:
        return Check("imex-spec", FAIL, unread(IMEX_SPEC_PATH, err),
                     "run podvm-gpu boot: it replaces the file")
    try:
        spec = parse_spec(text, source=IMEX_SPEC_PATH)
    except CdiSpecError as err:
        return Check("imex-spec", FAIL, str(err), "run podvm-gpu boot to regenerate it")
    problems = spec_problems(spec, facts.root, facts.config.imex.channels)
    if problems:
        return Check("imex-spec", FAIL, f"{IMEX_SPEC_PATH}: " + "; ".join(problems[:3]),
                     "run podvm-gpu boot to regenerate it")
    return Check("imex-spec", PASS, f"{IMEX_SPEC_PATH}: kind {IMEX_KIND}, devices "
                 f"{', '.join(spec.device_names())}, nodes present")


VM_ROWS = {"imex-channels": imex_channels_row, "imex-spec": imex_spec_row}
