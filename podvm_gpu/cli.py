"""The ``podvm-gpu`` command line (contract section 1).

``boot`` runs on every pod VM boot, on the critical path before kata-agent, ``status`` is
what scripts poll and ``metrics`` what a textfile collector may run, so their plain forms
(``boot [--root DIR] [--config FILE] [--json] [--dry-run]``, ``status ... [--json] [--wait]
[--timeout S]``, ``metrics ... [--serve | --listen ADDR:PORT] [--openmetrics] [--textfile]``)
are parsed here by hand with the standard library only. Every other form, ``--help`` and usage
errors (exit 2) go through the argparse parser in :mod:`podvm_gpu.app`, which says what is wrong.
"""

from __future__ import annotations

import os
import sys

ROOT_ENV, CONFIG_ENV = "PODVM_GPU_ROOT", "PODVM_GPU_CONFIG"
_COMMON = {"--root": "root_dir", "--config": "config"}
_FORMS = {
    "boot": ({"--json": "json_out", "--dry-run": "dry_run"}, _COMMON),
    "status": ({"--json": "json_out", "--wait": "wait"}, {**_COMMON, "--timeout": "timeout"}),
    "metrics": ({"--serve": "serve", "--openmetrics": "openmetrics", "--textfile": "textfile"},
                {**_COMMON, "--listen": "listen", "--web-config": "web_config"}),
    "check": ({"--json": "json_out", "--image": "image"}, _COMMON),
}


def fast_args(args: list[str]) -> tuple[str, dict] | None:
    """Parse a plain ``boot`` or ``status`` command line by hand; None for anything else.

    Args:
        args: the arguments after the program name.

    Returns:
        ``(command, keyword arguments)``: ``root_dir`` (``PODVM_GPU_ROOT`` or ``/``), ``config``
        (``PODVM_GPU_CONFIG`` or None), the flags as booleans and, for status, ``timeout`` as
        a string (checked by :func:`main`); None when the line needs the full parser (unknown
        options, a flag given a value, an option without one, help, ...).
    """
    if not args or args[0] not in _FORMS:
        return None
    flags, options = _FORMS[args[0]]
    parsed: dict = {"root_dir": os.environ.get(ROOT_ENV, "/"),
                    "config": os.environ.get(CONFIG_ENV), **dict.fromkeys(flags.values(), False)}
    rest = args[1:]
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if arg in flags:
            parsed[flags[arg]] = True
        elif name in options and eq:
            parsed[options[name]] = value
        elif arg in options and rest and not rest[0].startswith("-"):
            parsed[options[arg]] = rest.pop(0)
        else:
            return None
    return args[0], parsed


def root_problem(path: str, source: str = "--root") -> str | None:
    """Why ``path`` cannot be a root (empty, relative, not a directory), or None.

    A relative or empty root would silently put ``run/`` and ``var/`` in the current directory;
    an empty ``PODVM_GPU_ROOT=`` is a mistake, not a wish for ``/``.
    """
    if not path:
        return f"{source} is empty"
    if not os.path.isabs(path):
        return f"{source} {path!r} is not an absolute path"
    if not os.path.isdir(path):
        return f"{source} {path} is not a directory"
    return None


def config_problem(path: str | None, source: str = "--config") -> str | None:
    """Why ``path`` cannot name a config file (empty), or None; a missing file is boot's to
    report, as a failed boot."""
    if path is not None and not path:
        return f"{source} is empty"
    return None


def parse_timeout(text: str) -> float | None:
    """``--timeout`` of status: a finite number of seconds, at least 0; None when it is not."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and ``python -m podvm_gpu``; returns the exit code.

    Output that cannot be written (stdout a closed pipe, a full disk: ``status | head -0``,
    ``>/dev/full``) ends the command with a one-line error on stderr, never a traceback, and
    exit 3 for ``status`` (no state reported: never 1, which means ``failed``), 1 otherwise.
    Boot has written its files by then; its own stdout report is best effort (boot.py).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = _main(args)
        sys.stdout.flush()  # a buffered report's write error surfaces here, not at exit
        return code
    except OSError as err:
        if not _stdout_broken(err):
            raise
        try:
            # nothing more can reach it; the interpreter's final flush must not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.stderr.write(f"podvm-gpu: error: cannot write the output: {err.strerror or err}\n")
        except OSError:
            pass
        return 3 if args[:1] == ["status"] else 1


def _stdout_broken(err: OSError) -> bool:
    """Whether ``err`` is a failed write of the output: a closed pipe, a full or failing disk.
    The commands that write files of their own (boot, ``config --compile``, ``metrics
    --textfile``) report those errors themselves, so these reach here only from stdout."""
    import errno

    return isinstance(err, BrokenPipeError) or err.errno in (errno.ENOSPC, errno.EIO,
                                                              errno.EDQUOT)


def _main(args: list[str]) -> int:
    fast = fast_args(args)
    code = _run_fast(*fast, args) if fast is not None else None
    if code is not None:
        return code
    from podvm_gpu.app import run_app

    return run_app(args)


def _run_fast(command: str, kwargs: dict, args: list[str]) -> int | None:
    """Run a hand-parsed command; None to leave a bad value to the full parser's message."""
    if command == "status":
        kwargs["timeout"] = parse_timeout(kwargs.get("timeout", "300"))
        if kwargs["timeout"] is None:
            return None
    named = {opt: opt if any(a == opt or a.startswith(opt + "=") for a in args) else env
             for opt, env in (("--root", ROOT_ENV), ("--config", CONFIG_ENV))}
    problem = root_problem(kwargs["root_dir"], named["--root"]) or config_problem(
        kwargs["config"], named["--config"])
    if problem:
        print(f"podvm-gpu: error: {problem}", file=sys.stderr)
        return 2
    if command == "boot":
        from podvm_gpu.boot import run_boot

        return run_boot(**kwargs)
    if command == "metrics":
        return run_metrics(**kwargs)
    if command == "check":
        from podvm_gpu.check import run_check

        return run_check(kwargs["root_dir"], kwargs["config"], kwargs["json_out"], kwargs["image"])
    from podvm_gpu.status import run_status

    del kwargs["config"]
    return run_status(**kwargs)


def run_metrics(root_dir: str, config: str | None, listen: str | None = None,
                serve: bool = False, openmetrics: bool = False, textfile: bool = False,
                web_config: str | None = None) -> int:
    """``podvm-gpu metrics``: the ``metrics:`` settings of the config, then print, serve or
    write the textfile (podvm_gpu.metrics). Exit 0, 1 when it cannot, 2 for a bad config."""
    from podvm_gpu.config import config_location
    from podvm_gpu.errors import ConfigError
    from podvm_gpu.host.fs import Root
    from podvm_gpu.metrics.command import run

    root = Root(root_dir)
    try:
        path, required = config_location(root, config)
        if required:
            from podvm_gpu.config import load_config

            settings = load_config(path, required=True).metrics
    except (ConfigError, OSError) as err:
        print(f"podvm-gpu: error: {err}", file=sys.stderr)
        return 2
    if not required:
        from podvm_gpu.metrics.settings import MetricsSettings

        settings = MetricsSettings()
    return run(root, settings, listen=listen, serving=serve or listen is not None,
               openmetrics=openmetrics, textfile=textfile, web_config=web_config)
