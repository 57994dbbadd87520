"""The ``podvm-gpu`` command line (contract section 1).

``boot`` runs on every pod VM boot, on the critical path before kata-agent, so its plain forms
(``boot [--root DIR] [--config FILE] [--json] [--dry-run]``) are parsed here by hand and never
import typer, pydantic or pyudev on a CPU VM. Every other form, ``--help`` and usage errors
(exit 2) go through the typer app.
"""

from __future__ import annotations

import os
import sys

_BOOT_FLAGS = {"--json": "json_out", "--dry-run": "dry_run"}
_BOOT_OPTIONS = {"--root": "root_dir", "--config": "config"}


def fast_boot_args(args: list[str]) -> dict | None:
    """Parse a plain ``boot`` command line without typer; None for anything else.

    Args:
        args: the arguments after the program name.

    Returns:
        Keyword arguments for :func:`podvm_gpu.boot.run_boot`, with ``PODVM_GPU_ROOT`` and
        ``PODVM_GPU_CONFIG`` as defaults, or None when the line needs the full parser.
    """
    if not args or args[0] != "boot":
        return None
    parsed: dict = {"root_dir": os.environ.get("PODVM_GPU_ROOT") or "/",
                    "config": os.environ.get("PODVM_GPU_CONFIG") or None,
                    "json_out": False, "dry_run": False}
    rest = args[1:]
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if arg in _BOOT_FLAGS:
            parsed[_BOOT_FLAGS[arg]] = True
        elif name in _BOOT_OPTIONS and eq:
            parsed[_BOOT_OPTIONS[name]] = value
        elif arg in _BOOT_OPTIONS and rest and not rest[0].startswith("-"):
            parsed[_BOOT_OPTIONS[arg]] = rest.pop(0)
        else:
            return None
    return parsed


def root_problem(path: str) -> str | None:
    """Why ``path`` cannot be a root (empty, relative, not a directory), or None.

    A relative or empty root would silently put ``run/`` and ``var/`` in the current directory.
    """
    if not path:
        return "--root is empty"
    if not os.path.isabs(path):
        return f"--root {path!r} is not an absolute path"
    if not os.path.isdir(path):
        return f"--root {path} is not a directory"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and ``python -m podvm_gpu``; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    fast = fast_boot_args(args)
    if fast is not None:
        problem = root_problem(fast["root_dir"])
        if problem:
            print(f"podvm-gpu: error: {problem}", file=sys.stderr)
            return 2
        from podvm_gpu.boot import run_boot

        return run_boot(**fast)
    from podvm_gpu.app import run_app

    return run_app(args)
