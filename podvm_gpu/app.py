"""The full command line: help, usage errors (exit 2), ``check`` and every form of ``boot`` and
``status`` that :mod:`podvm_gpu.cli` does not parse by hand.

argparse (standard library) rather than typer: ``podvm-gpu --help`` and ``check`` on a CPU VM
have start-up goals of 5x and 8x ``python -c pass`` (bench/run.py), and importing typer alone
costs about 4-5x here. Thin commands: parse, call the core, return the contract's exit code.
"""

from __future__ import annotations

import argparse
import os
import sys

from podvm_gpu import __version__
from podvm_gpu.cli import (CONFIG_ENV, ROOT_ENV, config_problem, parse_timeout, root_problem)

COMMANDS = {
    "boot": "Load the driver, start its daemons, publish the CDI spec (systemd's ExecStart). "
            "Exit 0 ready/no-gpu, 1 failed.",
    "status": "Print the readiness state: exit 0 ready/no-gpu, 1 failed, 3 running or no "
              "status yet (or --wait timed out).",
    "check": "Read-only diagnosis of a running VM (or, with --image, of an image root): exit 0 "
             "when no check failed, 1 when one did.",
    "metrics": "Boot and GPU metrics in the Prometheus text format, once, over HTTP (--serve, "
               "--listen) or as a node-exporter textfile (--textfile).",
    "config": "Validate the config file and print the settings in force; with --compile also "
              "write its compiled form (image builds: boot then skips PyYAML). Exit 0 valid, 1 not.",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit 2, with the program named once
        self.print_usage(sys.stderr)
        self.exit(2, f"podvm-gpu: error: {message}\n")


def _root(value: str) -> str:
    problem = root_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _config(value: str) -> str:
    problem = config_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _seconds(value: str) -> float:
    seconds = parse_timeout(value)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds (0 or more)")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; ``--root`` and ``--config`` default to the environment."""
    parser = _Parser(prog="podvm-gpu", description="GPU boot agent for confidential-container "
                     "pod VMs.")
    parser.add_argument("--version", action="version", version=f"podvm-gpu {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_Parser)
    sub = {}
    for name, text in COMMANDS.items():
        sub[name] = commands.add_parser(name, help=text, description=text)
        sub[name].add_argument("--root", metavar="DIR", type=_root, default=None,
                               help=f"take every host path under DIR (env {ROOT_ENV}; default /)")
        sub[name].add_argument("--config", metavar="FILE", type=_config, default=None,
                               help=f"config file (env {CONFIG_ENV}; default "
                                    "<root>/etc/podvm-gpu/config.yaml)")
        if name != "metrics":  # metrics prints its own machine format
            sub[name].add_argument("--json", dest="json_out", action="store_true",
                                   help="one JSON document on stdout")
    sub["boot"].add_argument("--dry-run", action="store_true",
                             help="detect and plan, print the commands, change nothing")
    sub["status"].add_argument("--wait", action="store_true",
                               help="block until the state is final")
    sub["status"].add_argument("--timeout", metavar="S", type=_seconds, default=300.0,
                               help="longest wait in seconds (default 300)")
    sub["check"].add_argument("--image", action="store_true",
                              help="check an image (build time, no GPU needed) instead of a "
                                   "running VM")
    sub["config"].add_argument("--compile", action="store_true",
                               help="write <config>.compiled.json, which boot reads instead of "
                                    "parsing the YAML while the YAML is unchanged")
    sub["metrics"].add_argument("--serve", action="store_true",
                                help="serve over HTTP at the config's metrics.listen")
    sub["metrics"].add_argument("--listen", metavar="ADDR:PORT",
                                help="serve over HTTP at ADDR:PORT (an IP address)")
    sub["metrics"].add_argument("--web-config", metavar="FILE",
                                help="TLS and basic auth from this exporter-toolkit web config")
    sub["metrics"].add_argument("--openmetrics", action="store_true",
                                help="print the OpenMetrics format")
    sub["metrics"].add_argument("--textfile", action="store_true",
                                help="write the textfile (with --serve: every interval)")
    return parser


def _from_environment(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Fill ``--root`` and ``--config`` from the environment, with the same checks."""
    if ns.root is None:
        ns.root = os.environ.get(ROOT_ENV, "/")
        problem = root_problem(ns.root, ROOT_ENV)
        if problem:
            parser.error(problem)
    if ns.config is None and CONFIG_ENV in os.environ:
        ns.config = os.environ[CONFIG_ENV]
        problem = config_problem(ns.config, CONFIG_ENV)
        if problem:
            parser.error(problem)


def run_app(args: list[str]) -> int:
    """Parse ``args`` and run the command; return the exit code (2 for usage errors)."""
    parser = build_parser()
    try:
        ns = parser.parse_args(args)
        _from_environment(parser, ns)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    if ns.command == "boot":
        from podvm_gpu.boot import run_boot

        return run_boot(ns.root, ns.config, ns.json_out, ns.dry_run)
    if ns.command == "status":
        from podvm_gpu.status import run_status

        return run_status(ns.root, ns.json_out, ns.wait, ns.timeout)
    if ns.command == "config":
        return run_config(ns.root, ns.config, ns.json_out, ns.compile)
    if ns.command == "metrics":
        from podvm_gpu.cli import run_metrics

        return run_metrics(ns.root, ns.config, ns.listen, ns.serve, ns.openmetrics, ns.textfile,
                           ns.web_config)
    from podvm_gpu.check import run_check

    return run_check(ns.root, ns.config, ns.json_out, ns.image)


def run_config(root_dir: str, config: str | None, json_out: bool, compile_: bool) -> int:
    """``podvm-gpu config``: validate, print the settings in force, optionally compile."""
    from podvm_gpu.config import DEFAULT_PATH, compile_config, config_location, load_config
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.jsontext import dumps

    root = Root(root_dir)
    path = config or f"{root.path.rstrip('/')}{DEFAULT_PATH}"
    try:
        path, required = config_location(root, config)
        settings, compiled = (compile_config(path) if compile_ else
                              (load_config(path, required=required), None))
    except (ConfigError, OSError) as err:
        if json_out:
            print(dumps({"config": path, "valid": False, "error": str(err)}))
        else:
            print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 1
    if json_out:
        print(dumps({"config": path, "valid": True, "compiled": compiled,
                     "settings": settings.to_dict()}))
    else:
        print(f"{path}: valid" + (f"; compiled to {compiled}" if compiled else ""))
        print(dumps(settings.to_dict()))
    return 0
