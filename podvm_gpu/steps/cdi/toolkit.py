"""nvidia-ctk's version and the hooks of its spec, part of step 9, ``cdi`` (issue 36).

Images carry nvidia-ctk 1.17 to 1.20, and the versions differ where the agent depends on them
(../shared/nvidia-ctk-real.md, both real builds run): 1.17.8 has no IMEX mode (``cdi generate
--mode=imex``: ``invalid discovery mode: imex``) and no ``--disable-hook`` (``flag provided but
not defined: -disable-hook``, exit 1); both arrived in 1.18.0. So the version is read once
(``nvidia-ctk --version``: ``NVIDIA Container Toolkit CLI version 1.20.0``, a harmless call,
bounded) before the generation, recorded in status.json (``nvidia_ctk_version``), and a feature
the config asks for that the version lacks fails the step before nvidia-ctk runs, naming the
feature and the version needed. An unreadable version is a warning and the features are tried.

A spec names hooks that the node's hook binary must run at every container creation, and a
spec from a newer toolkit than the hook binary names hooks it lacks. Before 1.18.0 the binary
refuses such a hook and every container fails (``nvidia-cdi-hook
disable-device-node-modification`` on 1.17.8: exit 3, ``No help topic for
'disable-device-node-modification'``; kata/runc: ``error running createContainer hook #5: exit
status 3``, kubernetes-sigs/dra-driver-nvidia-gpu#568); from 1.18.0 it only warns
(``level=warning msg="Unsupported CDI hook: <name>"``, exit 0, with or without ``--help``) and
containers start without the hook's effect (issue 42, the real builds of 1.17.8, 1.18.2, 1.19.1
and 1.20.0: ../shared/nvidia-ctk/README.md). So after the generation each hook binary the spec
names (the one at the hook's path under the root: the spec's paths are the root's, section 8) is
asked for its own list, ``<path> --help`` (``<path> hook --help`` when the hook runs as
``nvidia-ctk hook``), whose COMMANDS section names every hook it has, and a hook not in the list
fails the step naming the hook, the binary and its version (the ``VERSION`` of its help, or its
``--version``). A binary before 1.18.0, or of a version that cannot be read, is also asked
``<path> [hook] <name> --help`` for each name, as before issue 42: a refusal fails the step with
the binary's own words. All bounded (the harmless-call time).
"""

from __future__ import annotations

import os
import re

from podvm_gpu.errors import CommandError, StepFailed, exit_text, one_line
from podvm_gpu.steps.context import BootContext

VERSION_ARGV = ["nvidia-ctk", "--version"]
# urfave/cli's version line: "<app name> version <v>" (nvidia-ctk: "NVIDIA Container Toolkit
# CLI", nvidia-cdi-hook: its own name); a build without the version injected says "unknown".
_VERSION = re.compile(r"\bversion\s+v?(\d+)\.(\d+)\.(\d+)(\S*)")
# What arrived in 1.18.0 (the real 1.17.8 refuses both, 1.18.2 has both:
# ../shared/nvidia-ctk/README.md): the feature's words for a reason, by config key.
SINCE_1_18 = (1, 18, 0)
FEATURES = {"imex.channels": "IMEX channels (cdi generate --mode=imex)",
            "cdi.disable_hooks": "cdi.disable_hooks (cdi generate --disable-hook)"}
# Which hooks each version's hook binary has, by the version each arrived in: its ``--help``
# COMMANDS list (the real builds: 1.17.8 the first four, 1.18.2 and 1.19.1 add
# disable-device-node-modification, 1.20.0 adds update-application-profile;
# ../shared/nvidia-ctk/README.md). (1, 17, 0) stands for "1.17 or before", the oldest toolkit
# the agent supports. nvidia-ctk writes each of them into its spec but chmod (the real 1.20.0
# spec: tests/data/real/h200-580/nvidia-ctk-1.20.0-cdi-generate.json).
HOOK_SINCE = {"update-ldcache": (1, 17, 0), "create-symlinks": (1, 17, 0), "chmod": (1, 17, 0),
              "enable-cuda-compat": (1, 17, 0), "disable-device-node-modification": (1, 18, 0),
              "update-application-profile": (1, 20, 0)}
NOT_WRITTEN = ("chmod",)
# Where the hook binary usually is: its list is asked while the generation runs
# (:func:`start_hook_asks`).
LIKELY_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
# The binaries whose hooks the agent knows how to ask: args[0] of a hook, its name after them.
HOOK_BINARIES = {"nvidia-cdi-hook": 1, "nvidia-ctk": 2}  # nvidia-ctk: ["nvidia-ctk", "hook", name]


class Version:
    """A toolkit version as ``--version`` printed it: ``text`` (``1.20.0``, a suffix kept) and
    ``number`` (``(1, 20, 0)``)."""

    def __init__(self, text: str, number: tuple[int, int, int]):
        self.text, self.number = text, number

    def __str__(self) -> str:
        return self.text


def parse_version(output: str) -> Version | None:
    """The version in ``--version`` output (its first ``version X.Y.Z``), None when none."""
    m = _VERSION.search(output)
    if m is None:
        return None
    number = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return Version(".".join(map(str, number)) + m.group(4), number)


class _Early:
    """A tool call made on a thread of its own; :meth:`result` waits for it (bounded by the
    call's own timeout, :meth:`Runner.run`)."""

    def __init__(self, ctx: BootContext, argv: list[str], timeout: float):
        import threading

        self._said: dict[str, object] = {}
        self._thread = threading.Thread(target=self._call, args=(ctx, argv, timeout),
                                        name="early-" + os.path.basename(argv[0]), daemon=True)
        self._thread.start()

    def _call(self, ctx: BootContext, argv: list[str], timeout: float) -> None:
        try:
            self._said["done"] = ctx.runner.run(argv, timeout=timeout)
        except BaseException as err:  # raised again where the result is read
            self._said["error"] = err

    def result(self):
        """The :class:`~podvm_gpu.host.proc.Completed` call, or what the call raised."""
        self._thread.join()
        if "error" in self._said:
            raise self._said["error"]
        return self._said["done"]


def start_version_read(ctx: BootContext) -> None:
    """Start ``nvidia-ctk --version`` now, on a thread of its own, for :func:`read_version`
    to take later. The version needs neither the GPUs nor persistenced, so the boot asks it
    once the versions step passed (boot/pipeline.py ``_STARTED_AFTER``), while device-nodes and
    persistenced run, instead of first thing in the cdi step, the boot's longest lane (issue
    38: 5-12 ms a boot there). The call is the same one, with the
    same timeout; what it means (a warning, the version recorded) is decided where it is
    read, so the status says nothing of it before the cdi step runs."""
    ctx.early["nvidia-ctk --version"] = _Early(ctx, VERSION_ARGV,
                                               ctx.harmless_timeout("nvidia-ctk"))


def read_version(ctx: BootContext) -> Version | None:
    """Run ``nvidia-ctk --version`` once (at most the harmless-call time), or take the call
    :func:`start_version_read` made, and record the version in
    ``ctx.status.nvidia_ctk_version``; None, with a warning, when it cannot be read (the
    features are then tried as they come).

    Raises:
        Cancelled: the boot is ending (the early call was ended by it).
    """
    early = ctx.early.pop("nvidia-ctk --version", None)
    try:
        done = early.result() if early is not None else \
            ctx.runner.run(VERSION_ARGV, timeout=ctx.harmless_timeout("nvidia-ctk"))
        version = parse_version(done.stdout + done.stderr)
        why = None if version else f"printed no version: {one_line(done.output, 120) or 'nothing'}"
    except CommandError as err:
        version, why = None, str(err) if err.timed_out or err.returncode is None else \
            f"{exit_text(err.returncode)}: {err.tool_message()}"
    if version is None:
        ctx.warn(f"cdi: nvidia-ctk --version: {why}; the version is unknown, so features "
                 "that need 1.18.0 (IMEX channels, cdi.disable_hooks) are tried as they are")
        return None
    ctx.status.nvidia_ctk_version = version.text
    return version


def needed_features(config) -> list[str]:
    """The config keys set whose feature needs nvidia-ctk 1.18.0 (:data:`FEATURES`)."""
    wanted = []
    if config.imex.channels:
        wanted.append("imex.channels")
    if config.cdi.disable_hooks:
        wanted.append("cdi.disable_hooks")
    return wanted


def check_features(ctx: BootContext, version: Version | None) -> None:
    """Fail before nvidia-ctk runs when the config asks for what ``version`` lacks.

    Raises:
        StepFailed: ``<feature> needs nvidia-ctk 1.18.0 or later; this image has <version>``
            (the first such key of :data:`FEATURES`, the others counted).
    """
    if version is None or version.number >= SINCE_1_18:
        return
    lacking = needed_features(ctx.config)
    if not lacking:
        return
    more = f" (and {', '.join(lacking[1:])})" if len(lacking) > 1 else ""
    raise StepFailed(f"{FEATURES[lacking[0]]} needs nvidia-ctk 1.18.0 or later; this image has "
                     f"nvidia-ctk {version}{more}: install nvidia-container-toolkit 1.18.0 or "
                     f"later in the image, or unset {lacking[0]}")


def disable_hook_args(config) -> list[str]:
    """``--disable-hook=<name>`` for each of ``cdi.disable_hooks``, in the config's order."""
    return [f"--disable-hook={name}" for name in config.cdi.disable_hooks]


def hooks_to_ask(spec) -> dict[tuple[str, str], list[str]]:
    """Each (hook path, hook name) the spec names, once, in the spec's order, with the
    arguments that go between the binary and the name when it is asked (``[]`` for
    ``nvidia-cdi-hook``, ``["hook"]`` for ``nvidia-ctk``). A hook whose ``args[0]`` is neither
    binary is not asked (it is not the toolkit's)."""
    found: dict[tuple[str, str], list[str]] = {}
    for hook in spec.hooks():
        args = list(hook.args or [])
        binary = os.path.basename(args[0]) if args else ""
        at = HOOK_BINARIES.get(binary)
        if at is None or len(args) <= at or (at == 2 and args[1] != "hook"):
            continue
        found.setdefault((hook.path, args[at]), args[1:at])
    return found


def hooks_of(number: tuple[int, int, int]) -> tuple[str, ...]:
    """The hooks a hook binary of version ``number`` (``(1, 19, 1)``) has (:data:`HOOK_SINCE`)."""
    return tuple(name for name, since in HOOK_SINCE.items() if number >= since)


def written_hooks(number: tuple[int, int, int]) -> tuple[str, ...]:
    """The hooks a spec of nvidia-ctk ``number`` names by default (:data:`HOOK_SINCE` less
    :data:`NOT_WRITTEN`)."""
    return tuple(name for name in hooks_of(number) if name not in NOT_WRITTEN)


# urfave/cli's help: a "COMMANDS:" heading, then one indented line per command ("   name, alias
# <usage>"), ended by a blank line; "VERSION:" then the version on the next line (the
# nvidia-cdi-hook --help of every real build; nvidia-ctk hook --help has no VERSION section).
_HEADING = re.compile(r"^[A-Z][A-Z ]*:\s*$")
_HELP_VERSION = re.compile(r"^VERSION:\s*\n\s+v?(\d+)\.(\d+)\.(\d+)(\S*)", re.MULTILINE)


def parse_commands(help_text: str) -> tuple[str, ...] | None:
    """The command names of a urfave/cli ``--help`` (its COMMANDS section: each line's first
    word, aliases and ``help`` left out), or None when the text has no COMMANDS section."""
    names: list[str] | None = None
    for line in help_text.splitlines():
        if names is None:
            if line.strip() == "COMMANDS:":
                names = []
            continue
        if not line.strip() or _HEADING.match(line):
            break
        first = line.split()[0].rstrip(",")
        if first != "help":
            names.append(first)
    return tuple(names) if names is not None else None


def help_version(help_text: str) -> Version | None:
    """The version of a urfave/cli ``--help``'s VERSION section, None when it has none."""
    m = _HELP_VERSION.search(help_text)
    if m is None:
        return None
    number = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return Version(".".join(map(str, number)) + m.group(4), number)


def _ask_key(path: str, name: str) -> str:
    return f"hook {path} {name}"


def _list_key(path: str, middle) -> str:
    return f"hook list {path} {' '.join(middle)}".rstrip()


def start_hook_asks(ctx: BootContext, version: Version | None) -> None:
    """Ask the hook binary at its usual path (:data:`LIKELY_HOOK_PATH` under the root) for its
    list (``--help``) on a thread of its own while the generation runs, and, for nvidia-ctk
    ``version`` before 1.18.0, each hook its spec names (:func:`written_hooks`, less
    ``cdi.disable_hooks``) by name: the same calls :func:`check_hooks` makes after it, which
    takes the answers it needs and makes the rest itself (a hook elsewhere, a hook binary older
    than nvidia-ctk). The cdi step is the boot's longest lane; this takes the asks off it
    (issue 38). Nothing is decided here. Asks nothing when the version is unknown, every hook is
    disabled (``cdi.disable_hooks: [all]``) or the binary is not there."""
    disabled = ctx.config.cdi.disable_hooks
    if version is None or "all" in disabled:  # --disable-hook=all: a spec without hooks
        return
    binary = ctx.root.resolve(LIKELY_HOOK_PATH)
    if not os.path.isfile(binary):
        return
    timeout = ctx.harmless_timeout("nvidia-ctk")
    ctx.early[_list_key(LIKELY_HOOK_PATH, [])] = _Early(ctx, [binary, "--help"], timeout)
    if version.number >= SINCE_1_18:
        return
    for name in written_hooks(version.number):
        if name not in disabled:
            ctx.early[_ask_key(LIKELY_HOOK_PATH, name)] = _Early(ctx, [binary, name, "--help"],
                                                                 timeout)


class _Listing:
    """What a hook binary said of itself: ``names`` (its COMMANDS; None when unread),
    ``version`` (None when unknown), ``error`` (the ``--help`` call's :class:`CommandError`)."""

    def __init__(self, names=None, version=None, error=None):
        self.names, self.version, self.error = names, version, error


def _all_at_once(calls: list) -> list:
    """Run each callable on a thread of its own and return their results in order, a
    :class:`CommandError` as a result. Anything else raised (Cancelled: the boot is ending) is
    raised here, in the caller's thread, never left in a helper thread."""
    import threading

    said: dict[int, object] = {}
    raised: dict[int, BaseException] = {}

    def one(index: int, call) -> None:
        try:
            said[index] = call()
        except CommandError as err:
            said[index] = err
        except BaseException as err:  # re-raised below
            raised[index] = err

    threads = [threading.Thread(target=one, args=(i, call), name=f"hook-check-{i}", daemon=True)
               for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if raised:
        raise raised[min(raised)]
    return [said[i] for i in range(len(calls))]


def _list_binary(ctx: BootContext, path: str, middle: list[str], timeout: float) -> _Listing:
    early = ctx.early.pop(_list_key(path, middle), None)
    binary = ctx.root.resolve(path)
    try:
        done = early.result() if early is not None else \
            ctx.runner.run([binary, *middle, "--help"], timeout=timeout)
    except CommandError as err:
        return _Listing(error=err)
    version = help_version(done.stdout)
    if version is None:  # nvidia-ctk hook --help has no VERSION section
        try:
            asked = ctx.runner.run([binary, "--version"], timeout=timeout)
            version = parse_version(asked.stdout + asked.stderr)
        except CommandError:
            version = None
    return _Listing(parse_commands(done.stdout), version)


def _ask_name(ctx: BootContext, path: str, middle: list[str], name: str, timeout: float):
    early = None if middle else ctx.early.pop(_ask_key(path, name), None)
    if early is not None:  # asked while the generation ran (start_hook_asks)
        return early.result()
    return ctx.runner.run([ctx.root.resolve(path), *middle, name, "--help"], timeout=timeout)


def _by_name_too(listing: _Listing) -> bool:
    """Whether a binary is also asked name by name: before 1.18.0 (a refusal is its answer) or
    of an unknown version, unless its list ask did not run or hung (asked again, it would too)."""
    if listing.error is not None and (listing.error.timed_out or listing.error.returncode is None):
        return False
    return listing.version is None or listing.version.number < SINCE_1_18


def _unchecked(name: str, path: str, err: CommandError) -> StepFailed:
    said = f"did not answer in {err.timeout_s:g} s" if err.timed_out else err.tool_message()
    return StepFailed(f"the spec's hook {name} could not be checked: {path} {said}; "
                      "a container's creation runs it")


def _advice(name: str, ctk: Version | None) -> str:
    return (f"the spec comes from nvidia-ctk {ctk or '(version unknown)'}: install nvidia-ctk "
            f"and nvidia-cdi-hook of one toolkit version, or add {name} to cdi.disable_hooks")


def check_hooks(ctx: BootContext, spec, ctk: Version | None) -> int:
    """Ask each hook binary the spec names for its list of hooks (``<root><path> [hook]
    --help``) and, when it is older than 1.18.0 or of an unknown version, for each hook by name
    (``<root><path> [hook] <name> --help``); at most the harmless-call time each, each round all
    at once (a Go binary's start is most of a call, and the cdi step is on the boot's critical
    path); the asks made early (:func:`start_hook_asks`) are taken, not repeated. Returns how
    many hook names were checked. The first failure in the spec's order is the one reported.

    Raises:
        StepFailed: a hook is not in its binary's COMMANDS list (1.18.0 and later: containers
            would start without it), naming the hook, the binary, the binary's version and
            nvidia-ctk's; or a binary before 1.18.0 refused a name (a non-zero exit: the real
            refusal is exit 3 with ``No help topic for '<name>'``), naming the same; or an
            answer did not come in time, or the binary could not run (a container's creation
            would hang or fail the same way).
        Cancelled: the boot is ending (another step failed, a signal): raised here, in the
            step's thread, never left in a helper thread.
    """
    asks = list(hooks_to_ask(spec).items())
    timeout = ctx.harmless_timeout("nvidia-ctk")
    binaries = list(dict.fromkeys((path, tuple(middle)) for (path, _n), middle in asks))
    listings = dict(zip(binaries, _all_at_once(
        [lambda p=p, m=m: _list_binary(ctx, p, list(m), timeout) for p, m in binaries])))
    by_name = [(path, name, middle) for (path, name), middle in asks
               if _by_name_too(listings[(path, tuple(middle))])]
    answers = dict(zip([(p, n) for p, n, _m in by_name], _all_at_once(
        [lambda p=p, n=n, m=m: _ask_name(ctx, p, m, n, timeout) for p, n, m in by_name])))
    for key in [k for k in ctx.early if k.startswith("hook ")]:  # foreseen, not named: dropped
        ctx.early.pop(key)
    for (path, name), middle in asks:
        listing = listings[(path, tuple(middle))]
        base = os.path.basename(path)
        what = f"{base} {listing.version}" if listing.version else f"{base}, version unknown"
        answer = answers.get((path, name))
        if isinstance(answer, CommandError):
            if answer.timed_out or answer.returncode is None:
                raise _unchecked(name, path, answer) from answer
            raise StepFailed(
                f"the spec names hook {name}, which {path} ({what}) does not know "
                f"({exit_text(answer.returncode)}: {answer.tool_message()}): every container "
                f"would fail at creation; {_advice(name, ctk)}") from answer
        if listing.error is not None and (listing.error.timed_out or
                                          listing.error.returncode is None):
            raise _unchecked(name, path, listing.error) from listing.error
        if listing.names is not None and name not in listing.names:
            raise StepFailed(
                f"the spec names hook {name}, which {path} ({what}) does not have (its "
                f"{' '.join([*middle, '--help'])} lists {', '.join(listing.names)}): "
                f"containers would start without it (from 1.18.0 a hook binary only warns "
                f"'Unsupported CDI hook' and exits 0); {_advice(name, ctk)}")
    return len(asks)
