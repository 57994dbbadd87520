"""The full command line: help, usage errors (exit 2) and every form that :mod:`podvm_gpu.cli`
does not parse by hand. It parses and nothing more: :func:`parse` hands the command and its
options back to :func:`podvm_gpu.cli.dispatch`, which checks the values and runs the command,
so this module imports nothing of the package but its version.

argparse (standard library) rather than typer: ``podvm-gpu --help`` and ``check`` on a CPU VM
have start-up goals of 5x and 8x ``python -c pass`` (bench/run.py), and importing typer alone
costs about 4-5x here. Thin commands: parse, call the core, return the contract's exit code.
"""

from __future__ import annotations

import argparse
import sys

from podvm_gpu import __version__

COMMANDS = {
    "boot": "Load the driver, start its daemons, publish the CDI spec (systemd's ExecStart). "
            "Exit 0 ready/no-gpu, 1 failed.",
    "status": "Print the readiness state: exit 0 ready/no-gpu, 1 failed, 3 running or no "
              "status yet (or --wait timed out).",
    "check": "Read-only diagnosis of a running VM (or, with --image, of an image root): exit 0 "
             "when no check failed, 1 when one did.",
    "metrics": "Boot and GPU metrics in the Prometheus text format, once, over HTTP (--serve, "
               "--listen) or as a node-exporter textfile (--textfile). Exit 0 printed, written "
               "or served until stopped; 1 the server cannot serve (address, web config) or "
               "nothing to serve; 2 a bad config or usage; 130 Ctrl-C.",
    "watch": "After a boot that ended ready with GPUs: watch them (kernel log, recovery action, "
             "memory health, fabric, daemons) and take a GPU that fails out of the CDI spec "
             "(podvm-gpu-watch.service). Exit 0: nothing to watch, a finding applied, stopped "
             "(SIGTERM, Ctrl-C); 1 an error (systemd restarts it); 2 a bad config (not "
             "restarted).",
    "binding": "The RTMR event log's podvm-gpu records and their replay against RTMR3; with "
               "--repair, cut off records a killed run never extended (AA's drop-in). Exit 0 "
               "the logs replay to RTMR3 (or no register), 1 they do not.",
    "config": "Validate the config file and print the settings in force; with --compile also "
              "write its compiled form (image builds: boot then skips PyYAML). Exit 0 valid, 1 not.",
}

# Each command's own options beyond --root, --config and --json: (command, option, argparse
# keywords), in the order its help lists them.
OPTIONS = (
    ("boot", "--dry-run", {"help": "detect and plan, print the commands, change nothing"}),
    ("status", "--wait", {"help": "block until the state is final"}),
    ("status", "--timeout", {"metavar": "S", "help": "with --wait: the longest wait, in seconds as "
                             "a plain number (default 300)"}),
    ("check", "--attest", {"help": "run a fresh GPU attestation (nvattest; needs the network) for "
                                   "the attestation row; writes nothing"}),
    ("check", "--image", {"help": "check an image (build time, no GPU needed) instead of a running VM"}),
    ("config", "--compile", {"dest": "compile_", "help": "write <config>.compiled.json, which boot "
                             "reads instead of parsing the YAML while the YAML is unchanged"}),
    ("watch", "--clear", {"help": "remove a standing finding (/run/podvm-gpu/watch.json); then run "
                                  "the boot again"}),
    ("binding", "--repair", {"help": "cut off the log's trailing podvm-gpu records RTMR3 never saw "
                                     "(never while the attestation-agent runs)"}),
    ("metrics", "--serve", {"help": "serve over HTTP at the config's metrics.listen"}),
    ("metrics", "--listen", {"metavar": "ADDR:PORT", "help": "serve over HTTP at ADDR:PORT (an IP address)"}),
    ("metrics", "--openmetrics", {"help": "print the OpenMetrics format"}),
    ("metrics", "--web-config", {"metavar": "FILE", "help": "TLS and basic auth from this "
                                 "exporter-toolkit web config, a path on this machine (needs --serve "
                                 "or --listen)"}),
    ("metrics", "--pod-labels", {"help": "write the pod's name and namespace from "
                                 "/run/peerpod/apf.json to /run/podvm-gpu/pod-labels.json once, and exit"}),
    ("metrics", "--textfile", {"help": "write the textfile (with --serve: every interval)"}),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit 2, with the program named once
        self.print_usage(sys.stderr)
        self.exit(2, f"podvm-gpu: error: {message}\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser of every command and each command's own (for its usage line); ``--root``,
    ``--config`` and ``--timeout`` stay text (None when not given) for the dispatch to check."""
    parser = _Parser(prog="podvm-gpu", description="GPU boot agent for confidential-container "
                     "pod VMs.")
    parser.add_argument("--version", action="version", version=f"podvm-gpu {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_Parser)
    sub = {}
    for name, text in COMMANDS.items():
        sub[name] = commands.add_parser(name, help=text, description=text)
        sub[name].add_argument("--root", metavar="DIR", default=None,
                               help="take every host path under DIR (env PODVM_GPU_ROOT; default /)")
        sub[name].add_argument("--config", metavar="FILE", default=None,
                               help="config file, a path on this machine, never taken under "
                                    "--root (env PODVM_GPU_CONFIG; default "
                                    "<root>/etc/podvm-gpu/config.yaml)")
        if name != "metrics":  # metrics prints its own machine format
            sub[name].add_argument("--json", dest="json_out", action="store_true",
                                   help="one JSON document on stdout")
    for name, option, keywords in OPTIONS:  # a flag unless it takes a value (metavar)
        flag = {} if "metavar" in keywords else {"action": "store_true"}
        sub[name].add_argument(option, **flag, **keywords)
    return parser, sub


def parse(args: list[str]) -> tuple[str, dict] | int:
    """Parse ``args``: ``(command, options)`` as :func:`podvm_gpu.cli.dispatch` takes them, or
    the exit code when the parser has already answered (0 after ``--help``/``--version``, 2
    after a usage error, which names the command's own usage line: an argument the command does
    not take is its error, not the program's)."""
    parser, sub = build_parser()
    try:
        ns, extra = parser.parse_known_args(args)
        if extra:
            sub[ns.command].error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    options = vars(ns)
    command = options.pop("command")
    options["root_dir"] = options.pop("root")
    return command, options


def usage_error(command: str, problem: str) -> int:
    """Say ``problem`` (a bad option value of ``command``) under the command's usage line; 2."""
    _parser, sub = build_parser()
    sub[command].print_usage(sys.stderr)
    print(f"podvm-gpu: error: {problem}", file=sys.stderr)
    return 2
