"""Character device nodes made under the root as the driver's own are: ``mknod`` with mode 0666
(what the NVIDIA driver gives its nodes), never replacing an entry that exists. The
``device-nodes`` step (podvm_gpu/steps/nodes.py) makes the GPUs' with it, the ``cdi`` step the
IMEX channels' (podvm_gpu/steps/cdi/imex.py)."""

from __future__ import annotations

import os
import stat

from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root, ensure_dir, is_char_device
from podvm_gpu.record import REQUIRED, Record

NODE_MODE = 0o666  # the driver's own nodes


class Node(Record):
    """A device node the GPUs need: host path and expected numbers (None: unknown major)."""

    FIELDS = (("path", REQUIRED), ("major", REQUIRED), ("minor", REQUIRED))


def node_problem(root: Root, node: Node) -> str | None:
    """Why ``node`` is not right under the root (missing, not a char device, wrong numbers)."""
    path = root.resolve(node.path, follow_last=False)
    if os.path.islink(path):  # a container gets what the link names, not a checked node
        return f"{node.path} is a symlink, not a character device"
    numbers = is_char_device(path, follow=False)
    if numbers is None:
        return f"{node.path} is missing or not a character device"
    if node.major is not None and numbers != (node.major, node.minor):
        return f"{node.path} is {numbers[0]}:{numbers[1]}, expected {node.major}:{node.minor}"
    return None


def make_node(root: Root, node: Node) -> None:
    """``mknod`` a character device (mode 0666) under the root; replaces nothing that exists.

    Raises:
        StepFailed: something that is not the node is already at its path.
        OSError: mknod failed (no CAP_MKNOD, a read-only /dev).
    """
    path = root.resolve(node.path, follow_last=False)
    if os.path.lexists(path):
        kind = "a symlink" if os.path.islink(path) else "not a character device"
        raise StepFailed(f"{node.path} exists but is {kind}; remove it so the node can be made")
    ensure_dir(os.path.dirname(path))
    os.mknod(path, stat.S_IFCHR | NODE_MODE, os.makedev(node.major, node.minor))
    os.chmod(path, NODE_MODE)  # mknod's mode is cut by the umask
