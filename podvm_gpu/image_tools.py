"""The tools an image must hold for boot, found as boot finds them (``check --image``).

Boot's runner (host/proc.py ``Runner.which``) takes a tool from the config's ``tools:`` when it
names one, and then only from there; otherwise from ``PATH``. An image has no ``PATH`` to ask,
so the usual program folders stand in for it.
"""

from __future__ import annotations

import os

from podvm_gpu.host.fs import Root

BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")


def _executable(root: Root, host_path: str) -> bool:
    real = root.resolve(host_path)
    return os.path.isfile(real) and os.access(real, os.X_OK)


def find_tools(root: Root, tools: tuple[str, ...], configured: dict[str, str]) -> tuple[list[str], list[str]]:
    """(found, missing) for ``tools`` in the image: ``found`` as ``name`` or, for a tool the
    config places, ``name at PATH (config)``; ``missing`` as ``name`` or, for a configured path
    with no executable, the reason boot would give (``name: PATH (set in the config) is not an
    executable``).

    Args:
        configured: the config's ``tools:`` (tool name -> absolute path inside the image).
    """
    found, missing = [], []
    for tool in tools:
        path = configured.get(tool)
        if path:
            if _executable(root, path):
                found.append(f"{tool} at {path} (config)")
            else:
                missing.append(f"{tool}: {path} (set in the config) is not an executable")
        elif any(_executable(root, f"{folder}/{tool}") for folder in BIN_DIRS):
            found.append(tool)
        else:
            missing.append(tool)
    return found, missing
