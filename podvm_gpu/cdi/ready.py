"""What a valid CDI spec must hold to serve a ``ready`` boot (contract section 8): one device
per GPU plus ``all``, the nodes present on the host with the numbers the spec gives, every hook
executable under the root, and the driver's libraries of the loaded version."""

from __future__ import annotations

import os
import stat

from podvm_gpu.cdi import KIND
from podvm_gpu.cdi.model import DeviceNode, Spec
from podvm_gpu.cdi.rules import q
from podvm_gpu.errors import one_line
from podvm_gpu.host.fs import Root, is_char_device

# The control nodes every GPU container needs (contract sections 3 step 5 and 8).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# The driver libraries a CUDA container cannot do without; nvidia-ctk mounts them as
# <name>.<driver version>. A spec cut short (a truncated stdout with exit 0 still parses)
# lacks them.
DRIVER_LIBRARIES = ("libnvidia-ml.so", "libcuda.so")


def check_ready_spec(spec: Spec, root: Root, gpu_minors: dict[str, int] | list[int],
                     driver_version: str | None = None) -> list[str]:
    """What keeps a valid spec from serving a ``ready`` boot (contract section 8, ready boot).

    Rules, in the order the problems are listed:
      1. ``kind`` is ``nvidia.com/gpu`` (boot owns that kind, contract section 3 step 9).
      2. A device per GPU index ``"0"`` .. ``"N-1"``, then ``"all"`` (peer pods ask for
         ``nvidia.com/gpu=all``).
      3. The spec's device nodes (matched on ``path``) include ``/dev/nvidiactl``,
         ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and ``/dev/nvidia<minor>`` per GPU
         (nvidia-ctk leaves the uvm nodes out with exit 0 when it cannot find them).
      4. Every node of the spec is a character device: its ``hostPath`` as written (nvidia-ctk
         already put its ``--dev-root``, i.e. the root, in front of it, so it is a real path on
         this machine), or, without ``hostPath``, its ``path`` under the root. When the spec gives
         ``major`` or ``minor``, both must match the node; an absent one reads as 0, as nvidia-ctk
         omits zero values (Go ``omitempty``). With neither, the runtime takes the node's own.
      5. Every hook ``path``, taken under the root, is an executable file (nvidia-ctk writes
         ``/usr/bin/nvidia-cdi-hook`` even when it cannot find it, with exit 0).
      6. With ``driver_version``: the spec mounts the driver's NVML and CUDA libraries of that
         version (a ``containerPath`` ending in ``libnvidia-ml.so.<version>`` and
         ``libcuda.so.<version>``), as nvidia-ctk generates them; a spec cut short lacks them.
    A node or hook that several devices share is checked, and reported, once.

    Args:
        spec: a spec from :func:`parse_spec`.
        root: the root the boot runs under (``--root``).
        gpu_minors: the GPUs found, as ``{pci_address: minor}`` (e.g.
            ``{"0000:00:04.0": 0}``) or a list of minors; N is its length.
        driver_version: the loaded driver's version (``550.54.15``), or None to skip rule 6.

    Returns:
        The problems, one line each and naming the rule, e.g. ``'missing device "all"'``,
        ``"device node /dev/nvidia-uvm missing from the spec"``,
        ``"device node /dev/nvidia0: spec says 195:0, node is 195:3"``,
        ``"hook /usr/bin/nvidia-cdi-hook does not exist under the root"``.
        Empty when the spec is good. Nothing is raised for a missing file.
    """
    problems: list[str] = []
    if spec.kind != KIND:
        problems.append(f"kind is {q(spec.kind)}, not {q(KIND)}")
    if isinstance(gpu_minors, dict):
        gpus = [(minor, f" (GPU {pci})") for pci, minor in gpu_minors.items()]
    else:
        gpus = [(minor, "") for minor in gpu_minors]
    problems += _device_problems(spec, root, gpus)
    problems += _hook_problems(spec, root)
    if driver_version:
        problems += _library_problems(spec, driver_version)
    return problems


def _device_problems(spec: Spec, root: Root, gpus: list[tuple[int, str]]) -> list[str]:
    """Rules 2 to 4 of :func:`check_ready_spec`: the devices per GPU and ``all``, the control and
    GPU nodes in the spec, and each distinct node a character device with the spec's numbers.
    ``gpus``: ``(minor, " (GPU <pci>)" or "")`` per GPU."""
    problems = []
    names = set(spec.device_names())
    for wanted in [str(i) for i in range(len(gpus))] + ["all"]:
        if wanted not in names:
            problems.append(f"missing device {q(wanted)}")

    nodes = spec.device_nodes()
    paths = {n.path for n in nodes}
    wanted_nodes = [(p, "") for p in CONTROL_NODES] + [(f"/dev/nvidia{m}", gpu) for m, gpu in gpus]
    for path, gpu in wanted_nodes:
        if path not in paths:
            problems.append(f"device node {path} missing from the spec{gpu}")

    checked: set[tuple] = set()
    for node in nodes:
        key = (node.path, node.host_path, node.major, node.minor)
        if key in checked:
            continue
        checked.add(key)
        problem = _node_problem(node, root)
        if problem:
            problems.append(problem)
    return problems


def _hook_problems(spec: Spec, root: Root) -> list[str]:
    """Rule 5 of :func:`check_ready_spec`: each distinct hook path, under the root, an
    executable file."""
    problems = []
    for hook_path in dict.fromkeys(h.path for h in spec.hooks()):
        real = root.resolve(hook_path)
        if not os.path.exists(real):
            problems.append(f"hook {hook_path} does not exist under the root")
        elif not os.path.isfile(real) or not os.access(real, os.X_OK):
            problems.append(f"hook {hook_path} is not executable ({_file_kind(real)})")
    return problems


def _library_problems(spec: Spec, driver_version: str) -> list[str]:
    """Rule 6 of :func:`check_ready_spec`: the driver's libraries of ``driver_version`` mounted."""
    problems = []
    mounted = {os.path.basename(m.container_path) for e in spec._all_edits() for m in e.mounts}
    for library in DRIVER_LIBRARIES:
        if f"{library}.{driver_version}" not in mounted:
            problems.append(f"the spec mounts no {library}.{driver_version} (the driver's "
                            "library of the loaded version): cut short, or generated for "
                            "another driver")
    return problems


def _node_problem(node: DeviceNode, root: Root) -> str | None:
    if node.host_path:
        real = node.host_path
        missing = f"hostPath {node.host_path} is not a character device"
    else:
        real = root.resolve(node.path)
        missing = "not a character device under the root"
    numbers = is_char_device(real)
    if numbers is None:
        return f"device node {node.path}: {missing} ({_file_kind(real)})"
    if node.major is None and node.minor is None:
        return None
    declared = (node.major or 0, node.minor or 0)
    if declared != numbers:
        return (f"device node {node.path}: spec says {declared[0]}:{declared[1]}, "
                f"node is {numbers[0]}:{numbers[1]}")
    return None


def _file_kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return one_line(err.strerror or err, None)
    if stat.S_ISREG(mode):
        return f"a regular file, mode {stat.S_IMODE(mode):04o}"
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "an unknown file type"
