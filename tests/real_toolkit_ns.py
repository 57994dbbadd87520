"""Run a command in a private mount namespace whose ``/proc/devices`` is a world's (issue 36).

NVIDIA's real ``nvidia-ctk system create-device-nodes`` reads ``/proc/devices`` by that path,
whatever ``--dev-root`` says (../shared/nvidia-ctk-real.md): in a scenario world the product's
run gets the world's file bound over it, in a namespace of its own (nothing outside sees it).
Usage: ``python real_toolkit_ns.py <world root> <repo> <argv...>``; the product's code comes
from ``<repo>`` (PYTHONPATH), as the harness gives it. Linux, root (CAP_SYS_ADMIN).
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def main(argv: list[str]) -> None:
    root, repo, command = argv[0], argv[1], argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    source = os.path.join(root, "proc/devices").encode()
    if libc.mount(source, b"/proc/devices", None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount --bind {source!r} /proc/devices")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
