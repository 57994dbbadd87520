"""The ``podvm-gpu`` command line (contract section 1).

``boot`` runs on every pod VM boot, on the critical path before kata-agent, ``status`` is
what scripts poll and ``metrics`` what a textfile collector may run, so their plain forms
(``boot [--root DIR] [--config FILE] [--json] [--dry-run]``, ``status ... [--json] [--wait]
[--timeout S]``, ``metrics ... [--serve | --listen ADDR:PORT] [--openmetrics] [--textfile]``)
are parsed here by hand with the standard library only. Every other form, ``--help`` and usage
errors (exit 2) go through the argparse parser in :mod:`podvm_gpu.app`, which says what is wrong.

Both parsers hand their result to :func:`dispatch`, the one place where the environment fills
``--root`` and ``--config``, their values are checked and the command is run; the parser knows
nothing of the commands, so the two modules import in one direction only (cli -> app).
"""

from __future__ import annotations

import os
import sys

ROOT_ENV, CONFIG_ENV = "PODVM_GPU_ROOT", "PODVM_GPU_CONFIG"
_COMMON = {"--root": "root_dir", "--config": "config"}
_FORMS = {
    "boot": ({"--json": "json_out", "--dry-run": "dry_run"}, _COMMON),
    "status": ({"--json": "json_out", "--wait": "wait"}, {**_COMMON, "--timeout": "timeout"}),
    "metrics": ({"--serve": "serve", "--openmetrics": "openmetrics", "--textfile": "textfile",
                 "--pod-labels": "pod_labels"},
                {**_COMMON, "--listen": "listen", "--web-config": "web_config"}),
    "check": ({"--json": "json_out", "--image": "image", "--attest": "attest"}, _COMMON),
}

# Each command's entry, ``(module, function)``, called with the options by keyword; the module
# is imported only when its command runs (by ``__import__``, whose imports ``-X importtime``
# lists: tests/test_layout.py's CPU fast path).
ENTRIES = {"boot": ("podvm_gpu.boot", "run_boot"), "status": ("podvm_gpu.status", "run_status"),
           "check": ("podvm_gpu.check.command", "run_check"),
           "metrics": ("podvm_gpu.metrics.command", "run_metrics"),
           "watch": ("podvm_gpu.watch.command", "run_watch"),
           "binding": ("podvm_gpu.steps.cc.show", "run_binding"),
           "config": ("podvm_gpu.config.command", "run_config")}


def fast_args(args: list[str]) -> tuple[str, dict] | None:
    """Parse a plain ``boot`` or ``status`` command line by hand; None for anything else.

    Args:
        args: the arguments after the program name.

    Returns:
        ``(command, keyword arguments)``: ``root_dir`` (``PODVM_GPU_ROOT`` or ``/``), ``config``
        (``PODVM_GPU_CONFIG`` or None), the flags as booleans and, for status, ``timeout`` as
        a string (checked by :func:`dispatch`); None when the line needs the full parser (unknown
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


def web_config_problem(options: dict) -> str | None:
    """Why ``metrics``' ``--web-config`` cannot be taken, or None: only a server reads it, so
    without ``--serve``/``--listen`` it would be silently ignored (even a bad file), and an empty
    value would silently mean plain HTTP (the config key's ``""`` says that; the option names a
    file or is left out)."""
    web_config = options.get("web_config")
    if web_config is None:
        return None
    if not web_config:
        return "--web-config is empty"
    if not options.get("serve") and options.get("listen") is None:
        return "--web-config needs --serve or --listen"
    return None


def listen_problem(options: dict) -> str | None:
    """Why ``metrics``' ``--listen`` value is not an address to serve at, or None (``""``: no
    HTTP server, as the config key's ``""``). A value of the wrong shape is a usage error, said
    in the words of :func:`podvm_gpu.config.metrics.parse_listen`; an address that has the
    shape but cannot be bound is the server's to report (exit 1)."""
    listen = options.get("listen")
    if not listen:
        return None
    from podvm_gpu.config.metrics import parse_listen

    try:
        parse_listen(listen, allow_any_port=True)
    except ValueError as err:
        return f"--listen {err}"
    return None


def conflict_problem(command: str, options: dict, args: list[str]) -> str | None:
    """Options of ``command`` that contradict each other, named as given, or None: ``check
    --image`` with ``--attest`` (an image is checked as files; nvattest attests this VM's GPUs),
    ``metrics --pod-labels`` with an option of the exporter (it writes the labels file once and
    exits, so ``--serve``, ``--listen``, ``--web-config``, ``--textfile`` and ``--openmetrics``
    would be ignored), ``status --timeout`` without ``--wait`` (status reads the state once:
    the timeout would be ignored). Each was ignored silently before issue 35 item 13 (the
    last, before its leftovers)."""
    if command == "status" and not options.get("wait") and \
            any(a == "--timeout" or a.startswith("--timeout=") for a in args):
        return "--timeout needs --wait: without --wait status reads the state once and does " \
            "not wait"
    if command == "check" and options.get("image") and options.get("attest"):
        return "--image and --attest cannot be used together: --image checks an image's files, " \
            "--attest runs nvattest on this VM's GPUs"
    if command == "metrics" and options.get("pod_labels"):
        given = [opt for opt in ("--serve", "--listen", "--web-config", "--textfile", "--openmetrics")
                 if any(a == opt or a.startswith(opt + "=") for a in args)]
        if given:
            return f"--pod-labels and {given[0]} cannot be used together: --pod-labels writes " \
                "the pod labels file once and exits"
    return None


def parse_timeout(text: str) -> tuple[float | None, str | None]:
    """``--timeout`` of status: ``(seconds, None)``, or ``(None, why not)`` naming the value.

    Seconds are a plain number in ASCII digits, at least 0: ``300``, ``2.5``, ``.5``. Refused,
    each said in its own words: empty; negative; ``inf`` and ``nan``; an exponent (``1e3``:
    ``float`` takes it, but nobody means a wait in scientific notation, and ``1e400`` is
    infinite); ``_`` and non-ASCII digits (``float`` also takes ``1_0`` and ``٣``); a number
    too large for a float."""
    if text == "":  # --timeout= is a mistake, not a wish for the default
        return None, "--timeout is empty"
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    body = text[1:] if text[:1] in "+-" else text
    whole, _dot, fraction = body.partition(".")
    plain = body.isascii() and (whole + fraction).isdigit() and \
        (whole.isdigit() or not whole) and (fraction.isdigit() or not fraction)
    if plain and text[0] == "-":
        return None, f"--timeout {shown} is negative: give 0 or more seconds"
    if plain and text[0] != "+":
        value = float(body)
        if value == float("inf"):
            return None, f"--timeout {shown} is too large to be a number of seconds"
        return value, None
    lowered = body.lower()
    if lowered in ("inf", "infinity", "nan"):
        return None, f"--timeout {shown} is not a number of seconds: give a plain number, " \
                     "0 or more (300, 2.5)"
    if text.isascii() and "e" in lowered and "_" not in text:
        try:
            float(text)
        except ValueError:
            pass
        else:
            return None, f"--timeout {shown} has an exponent: write the seconds as a plain " \
                         "number (1000, not 1e3)"
    return None, f"--timeout {shown} is not a number of seconds (0 or more, in plain ASCII " \
                 "digits: 300, 2.5)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script and ``python -m podvm_gpu``; returns the exit code.

    A standard stream that was closed when the program started (systemd may start it so, or a
    shell's ``>&-``) is opened on ``/dev/null`` first: the outcome and the exit status are the
    state's whatever the streams are, and no file the agent opens, nor a tool it starts, takes
    the place of fd 0, 1 or 2.

    What a command prints on stdout is kept and written once, in one ``write`` at its end
    (:class:`_Output`): a reader sees the whole document or nothing. A reader that closed the
    pipe after what it wanted (``status --json | head -4``) is not an error: the exit status is
    the command's. Output that cannot be written otherwise (``>/dev/full``, an I/O error) ends
    the command with a one-line error on stderr, never a traceback, and exit 3 for ``status``
    (no state reported: never 1, which means ``failed``), the final state's for ``boot`` (its
    files are written, status.json holds the state, and under systemd an exit 1 marks the unit
    failed: issue 35 item 22), 1 otherwise. Ctrl-C (SIGINT) outside
    a boot (``status --wait``, ``metrics --serve``) is one line and exit 130, as a shell reports
    it; boot turns SIGINT into a failed boot itself. Boot has written its files by then; its
    own stdout report is best effort (boot/run.py).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    _open_closed_streams()
    output = _Output(sys.stdout)
    sys.stdout = output
    try:
        code = _main(args)
    except KeyboardInterrupt:
        if args[:1] == ["boot"]:  # before boot's own handler: nothing written (1.3: exit 1)
            _say("podvm-gpu: error: stopped by SIGINT before this boot began (nothing written)")
            code = 1
        else:
            _say("podvm-gpu: interrupted")
            code = 130
    finally:
        sys.stdout = output.target
    try:
        output.send()
    except OSError as err:
        try:
            # nothing more can reach it; the interpreter's final flush must not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), output.target.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        if isinstance(err, BrokenPipeError):
            return code  # the reader had what it wanted, or went away: not the command's error
        said = "podvm-gpu metrics: cannot write the metrics" if args[:1] == ["metrics"] else \
            "podvm-gpu: error: cannot write the output"
        _say(f"{said}: {err.strerror or err}")
        if args[:1] == ["boot"] and "--dry-run" not in args:
            return code  # the boot's exit follows its final state, which status.json holds
        return 3 if args[:1] == ["status"] else 1
    return code


class _Output:
    """stdout while a command runs: text (``write``) and bytes (``buffer.write``) are kept in
    order and sent in one ``write`` by :meth:`send` (a long-running command that prints nothing,
    ``metrics --serve``, keeps nothing). ``io`` is loaded at start-up already."""

    def __init__(self, target):
        import io

        self.target = target
        self.buffer = io.BytesIO()
        self.encoding = getattr(target, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        self.buffer.write(text.encode(self.encoding, errors="backslashreplace"))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def send(self) -> None:
        """Write what was kept to the real stdout: one ``os.write`` per call until all is out
        (one for any document a pipe can hold).

        Raises:
            OSError: the write failed (``BrokenPipeError``: the reader closed the pipe).
        """
        data = self.buffer.getvalue()
        if not data:
            return
        try:
            fd = self.target.fileno()
        except (AttributeError, ValueError, OSError):
            fd = None  # a stream of a test harness: written as text
        if fd is None:
            self.target.write(data.decode(self.encoding, errors="replace"))
            self.target.flush()
            return
        self.target.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def _open_closed_streams() -> None:
    """fd 0, 1 and 2 on ``/dev/null`` where they are closed, and ``sys.stdin``/``stdout``/
    ``stderr`` on them where Python left None (it does for a stream closed at start)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def _say(line: str) -> None:
    """One line on stderr, where stderr can still take it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _main(args: list[str]) -> int:
    parsed = fast_args(args)
    if parsed is None:
        from podvm_gpu.app import parse

        parsed = parse(args)
        if isinstance(parsed, int):  # help, version or a usage error: already said
            return parsed
    return dispatch(*parsed, args)


def dispatch(command: str, options: dict, args: list[str]) -> int:
    """Check the options of ``command`` and run it; return its exit code (2: a bad value).

    Args:
        command: ``boot``, ``status``, ``check``, ``metrics`` or ``config``.
        options: the parsed options by keyword (``root_dir`` and ``config`` None when not
            given, ``timeout`` as text); the environment fills what the line left out.
        args: the command line as given, to name the source of a bad value (``--root`` or
            ``PODVM_GPU_ROOT``).
    """
    options = dict(options)
    if options.get("root_dir") is None:
        options["root_dir"] = os.environ.get(ROOT_ENV, "/")
    if options.get("config") is None:
        options["config"] = os.environ.get(CONFIG_ENV)
    named = {opt: opt if any(a == opt or a.startswith(opt + "=") for a in args) else env
             for opt, env in (("--root", ROOT_ENV), ("--config", CONFIG_ENV))}
    problem = root_problem(options["root_dir"], named["--root"]) or config_problem(
        options["config"], named["--config"])
    if command == "status" and not problem:
        text = options.get("timeout")
        options["timeout"], problem = parse_timeout(text) if text is not None else (300.0, None)
    problem = problem or conflict_problem(command, options, args)
    if command == "metrics" and not problem:
        problem = listen_problem(options) or web_config_problem(options)
    if problem:
        from podvm_gpu.app import usage_error

        return usage_error(command, problem)
    return _run(command, options)


def _run(command: str, options: dict) -> int:
    """Run ``command`` with its checked ``options`` (keyword arguments of the command's entry);
    its exit code. Each command's module is imported only here, when it runs."""
    if command == "config":
        from podvm_gpu.host.fs import Root
        from podvm_gpu.units import budget_warning

        # the installed unit's start time-out against budget_s (issue 46): units.py sits
        # beside config in the layers, so the command is handed the rule
        options["also"] = lambda settings: budget_warning(Root(options["root_dir"]), settings.budget_s)
    if command in ("binding", "status"):  # they read no config
        del options["config"]
    module, entry = ENTRIES[command]
    return getattr(__import__(module, fromlist=[entry]), entry)(**options)
