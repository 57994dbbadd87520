"""Step 5, ``device-nodes``: ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``
and ``/dev/nvidia<minor>`` for every GPU, as character devices with the driver's numbers.

The control nodes come from ``nvidia-ctk system create-device-nodes --control-devices``; each
GPU's node from ``nvidia-modprobe -c <minor>`` where present and the root is ``/`` (it writes
the real ``/dev`` only; without a loaded driver it exits 1 silently, 535.161.07), else ``mknod``
with the major from
``/proc/devices`` and the minor from ``/proc/driver/nvidia/gpus/<pci>/information``. Nodes are
mode 0666, as the driver's own nodes are. When every node is already right nothing is run, so a
second boot changes nothing.
"""

from __future__ import annotations

from podvm_gpu import nvidia_ctk, readers
from podvm_gpu.errors import CommandError, StepFailed, exit_text
from podvm_gpu.host.devnode import Node, make_node, node_problem
from podvm_gpu.host.fs import Root, is_char_device
from podvm_gpu.readers import CTL_MINOR, NVIDIA_MAJOR_NAME, UVM_MAJOR_NAME, char_majors, gpu_minors
from podvm_gpu.row import FAIL, PASS, Check
from podvm_gpu.steps.context import BootContext


def required_nodes(root: Root, minors: dict[str, int]) -> list[Node]:
    """Every node contract section 3 step 5 requires, with majors from ``/proc/devices``."""
    majors = char_majors(root)
    nv, uvm = majors.get(NVIDIA_MAJOR_NAME), majors.get(UVM_MAJOR_NAME)
    nodes = [Node("/dev/nvidiactl", nv, CTL_MINOR), Node("/dev/nvidia-uvm", uvm, 0),
             Node("/dev/nvidia-uvm-tools", uvm, 1)]
    nodes += [Node(f"/dev/nvidia{m}", nv, m) for m in sorted(minors.values())]
    return nodes


def run(ctx: BootContext) -> str:
    """Create and verify the nodes.

    Raises:
        StepFailed: a major is missing from /proc/devices, a tool failed, or a node is still
            missing or has other numbers afterwards.
    """
    root = ctx.root
    ctx.minors = gpu_minors(root, ctx.gpus)
    nodes = required_nodes(root, ctx.minors)
    if not any(node_problem(root, n) for n in nodes):
        return f"all {len(nodes)} nodes present"
    control = nodes[:3]
    if any(node_problem(root, n) for n in control):
        try:
            ctx.runner.run(nvidia_ctk.control_nodes_argv(root))
        except CommandError as err:
            if err.timed_out:
                said = f"timed out after {err.timeout_s:g} s"
            elif err.returncode is None:  # not found, not executable
                said = err.tool_message()
            else:
                said = f"{exit_text(err.returncode)}: {err.tool_message()}"
            if nodes[0].major is None:  # /dev/nvidiactl's: no nvidia major in /proc/devices
                raise StepFailed("cannot create /dev/nvidiactl: no 'nvidia' major in /proc/devices "
                                 "(the nvidia module did not register its control device); "
                                 f"nvidia-ctk: {said}") from err
            raise StepFailed(f"nvidia-ctk system create-device-nodes failed: {said}") from err
    # nvidia-modprobe makes its nodes in the real /dev and has no option for another root, so
    # under --root it would write outside the root; there mknod does the job.
    use_modprobe = root.is_host and ctx.runner.which("nvidia-modprobe") is not None
    for node in nodes[3:]:  # each GPU's, by minor
        if node_problem(root, node) is None:
            continue
        if use_modprobe:
            try:
                ctx.runner.run(["nvidia-modprobe", "-c", str(node.minor)])
            except CommandError as err:
                # mknod does the same job; one failure is enough to stop asking (a hung
                # nvidia-modprobe would otherwise cost its timeout once per GPU)
                use_modprobe = False
                ctx.warn(f"device-nodes: nvidia-modprobe -c {node.minor} failed ({err}); "
                         "made the GPU nodes with mknod")
        if is_char_device(root.resolve(node.path, follow_last=False), follow=False) is None \
                and node.major is not None:
            make_node(root, node)
    nodes = required_nodes(root, ctx.minors)
    for node in nodes:
        if node.major is None:
            name = UVM_MAJOR_NAME if "uvm" in node.path else NVIDIA_MAJOR_NAME
            raise StepFailed(f"{node.path}: no '{name}' major in /proc/devices")
        problem = node_problem(root, node)
        if problem:
            raise StepFailed(problem)
    return f"{len(nodes)} nodes ready ({len(ctx.minors)} GPU node(s))"


def plan(ctx: BootContext) -> list[list[str]]:
    """``boot --dry-run``: the control nodes' creation and ``nvidia-modprobe -c`` of each GPU
    node that is not right (mknod, no command, where nvidia-modprobe is not installed)."""
    root = ctx.root
    argvs = []
    required = required_nodes(root, gpu_minors(root, ctx.gpus))
    if any(node_problem(root, n) for n in required[:3]):
        argvs.append(nvidia_ctk.control_nodes_argv(root))
    use_modprobe = root.is_host and ctx.runner.which("nvidia-modprobe") is not None
    for node in required[3:]:
        if use_modprobe and node_problem(root, node):
            argvs.append(["nvidia-modprobe", "-c", str(node.minor)])
    return argvs


# --- podvm-gpu check ----------------------------------------------------------------------

def device_nodes_row(facts) -> Check:
    skip = facts.not_reached("device-nodes") or facts.needs_driver("device-nodes")
    if skip:
        return skip
    majors = readers.char_majors(facts.root)
    for name in (readers.NVIDIA_MAJOR_NAME, readers.UVM_MAJOR_NAME):
        if name not in majors:
            return Check("device-nodes", FAIL, f"no '{name}' major in /proc/devices",
                         "the module did not register its devices: reload it and read "
                         "the kernel log")
    nodes = required_nodes(facts.root, facts.minors)
    problems = [p for p in (node_problem(facts.root, n) for n in nodes) if p]
    if problems:
        return Check("device-nodes", FAIL, "; ".join(problems[:3]),
                     "run podvm-gpu boot (it creates them) or nvidia-ctk system "
                     "create-device-nodes --control-devices")
    return Check("device-nodes", PASS, f"{len(nodes)} character devices with majors "
                 f"{majors[readers.NVIDIA_MAJOR_NAME]}/{majors[readers.UVM_MAJOR_NAME]} "
                 "as in /proc/devices")


VM_ROWS = {"device-nodes": device_nodes_row}
