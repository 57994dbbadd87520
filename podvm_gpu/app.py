"""The typer app: help, usage errors, ``status``, ``check`` and the full form of ``boot``.

Thin commands: parse, call the core, map the outcome to the contract's exit codes.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from podvm_gpu import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="GPU boot agent for confidential-container pod VMs.")

def _valid_root(value: str) -> str:
    from podvm_gpu.cli import root_problem

    problem = root_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


RootOpt = Annotated[str, typer.Option("--root", envvar="PODVM_GPU_ROOT", metavar="DIR",
                                      callback=_valid_root,
                                      help="Take every host path under DIR (default /).")]
ConfigOpt = Annotated[Optional[str], typer.Option(
    "--config", envvar="PODVM_GPU_CONFIG", metavar="FILE",
    help="Config file (default <root>/etc/podvm-gpu/config.yaml).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


def _version(value: bool) -> None:
    if value:
        print(f"podvm-gpu {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False):
    """GPU boot agent for confidential-container pod VMs."""


@app.command()
def boot(root: RootOpt = "/", config: ConfigOpt = None, json_out: JsonOpt = False,
         dry_run: Annotated[bool, typer.Option("--dry-run", help="Detect and plan, print the "
                                               "commands, change nothing.")] = False) -> None:
    """Load the driver, start its daemons, publish the CDI spec (systemd's ExecStart)."""
    from podvm_gpu.boot import run_boot

    raise typer.Exit(run_boot(root, config, json_out, dry_run))


@app.command()
def status(root: RootOpt = "/", config: ConfigOpt = None, json_out: JsonOpt = False,
           wait: Annotated[bool, typer.Option("--wait", help="Block until the state is final.")] = False,
           timeout: Annotated[float, typer.Option("--timeout", min=0, metavar="S",
                                                  help="Longest wait in seconds.")] = 300.0) -> None:
    """Print the readiness state: exit 0 ready/no-gpu, 1 failed, 3 running or no status yet."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.status import StatusUnreadable, exit_code_for, load_status, wait_for_final

    r = Root(root)
    try:
        doc = wait_for_final(r, timeout) if wait else load_status(r)
    except StatusUnreadable as err:
        if json_out:
            print(json.dumps({"state": None, "error": f"unreadable status file: {err}"}))
        else:
            print(f"unreadable status file: {err}")
        raise typer.Exit(3)
    code = exit_code_for(doc)
    if json_out:
        print(json.dumps(doc if doc is not None else {"state": None}, indent=2))
    elif doc is None:
        print("no status yet: podvm-gpu boot has not run")
    else:
        reason = doc.get("reason")
        print(f"{doc.get('state')}" + (f": {reason}" if reason else ""))
        for warning in doc.get("warnings") or []:
            print(f"warning: {warning}")
    raise typer.Exit(code)


@app.command()
def check(root: RootOpt = "/", config: ConfigOpt = None, json_out: JsonOpt = False,
          image: Annotated[bool, typer.Option("--image", help="Check an image (build time, no "
                                              "GPU needed) instead of a running VM.")] = False) -> None:
    """Read-only diagnosis: exit 0 when no check failed, 1 when one did."""
    from podvm_gpu.check import run_check

    raise typer.Exit(run_check(root, config, json_out, image))


def run_app(args: list[str]) -> int:
    """Run the typer app on ``args``; return the exit code (2 for usage errors)."""
    try:
        app(args=args, prog_name="podvm-gpu")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
