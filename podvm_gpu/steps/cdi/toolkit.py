"""nvidia-ctk's version and the hooks of its spec, part of step 9, ``cdi`` (issue 36).

Images carry nvidia-ctk 1.17 to 1.20, and the versions differ where the agent depends on them
(../shared/nvidia-ctk-real.md, both real builds run): 1.17.8 has no IMEX mode (``cdi generate
--mode=imex``: ``invalid discovery mode: imex``) and no ``--disable-hook`` (``flag provided but
not defined: -disable-hook``, exit 1); both arrived in 1.18.0. So the version is read once
(``nvidia-ctk --version``: ``NVIDIA Container Toolkit CLI version 1.20.0``, a harmless call,
bounded) before the generation, recorded in status.json (``nvidia_ctk_version``), and a feature
the config asks for that the version lacks fails the step before nvidia-ctk runs, naming the
feature and the version needed. An unreadable version is a warning and the features are tried.

A spec names hooks that the node's hook binary must run at every container creation: a spec
from a newer toolkit than the hook binary fails every container (``nvidia-cdi-hook
disable-device-node-modification`` on 1.17.8: exit 3, ``No help topic for
'disable-device-node-modification'``; kata/runc: ``error running createContainer hook #5: exit
status 3``, kubernetes-sigs/dra-driver-nvidia-gpu#568). So after the generation every hook name
is asked of its binary once, ``<path> <name> --help`` (``<path> hook <name> --help`` when the
hook runs as ``nvidia-ctk hook``), bounded; a refusal fails the step naming the hook, the hook
binary's version and nvidia-ctk's. The binary is the one at the hook's path under the root (the
spec's paths are the root's, section 8).
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
# What arrived in 1.18.0 (nvidia-ctk-real.md, 1.17.8 against 1.20.0): the feature's words for a
# reason, by config key.
SINCE_1_18 = (1, 18, 0)
FEATURES = {"imex.channels": "IMEX channels (cdi generate --mode=imex)",
            "cdi.disable_hooks": "cdi.disable_hooks (cdi generate --disable-hook)"}
# The hooks a spec of nvidia-ctk 1.17 and of 1.18 or later names (1.20.0 on the real H200:
# tests/data/real/h200-580/nvidia-ctk-1.20.0-cdi-generate.json; 1.17.8 writes neither of the two
# that 1.18 brought, ../shared/nvidia-ctk-real.md), and where their binary usually is: asked
# while the generation runs (:func:`start_hook_asks`).
HOOKS_BEFORE_1_18 = ("create-symlinks", "enable-cuda-compat", "update-ldcache")
HOOKS_SINCE_1_18 = HOOKS_BEFORE_1_18 + ("disable-device-node-modification",
                                        "update-application-profile")
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


def _ask_key(path: str, name: str) -> str:
    return f"hook {path} {name}"


def start_hook_asks(ctx: BootContext, version: Version | None) -> None:
    """Ask the hook binary at its usual path (:data:`LIKELY_HOOK_PATH` under the root) for each
    hook a spec of nvidia-ctk ``version`` names (:data:`HOOKS_SINCE_1_18` or
    :data:`HOOKS_BEFORE_1_18`, less ``cdi.disable_hooks``), each on a thread of its own, while
    the generation runs: the asks are the same calls :func:`check_hooks` makes after it, which
    takes the answers of those the spec names and asks the rest itself (a hook elsewhere, a
    name not foreseen). The cdi step is the boot's longest lane; this takes its hook asks off
    it (issue 38). Nothing is decided here. Asks nothing when the version is unknown, every
    hook is disabled (``cdi.disable_hooks: [all]``) or the binary is not there."""
    disabled = ctx.config.cdi.disable_hooks
    if version is None or "all" in disabled:  # --disable-hook=all: a spec without hooks
        return
    binary = ctx.root.resolve(LIKELY_HOOK_PATH)
    if not os.path.isfile(binary):
        return
    timeout = ctx.harmless_timeout("nvidia-ctk")
    for name in HOOKS_SINCE_1_18 if version.number >= SINCE_1_18 else HOOKS_BEFORE_1_18:
        if name not in disabled:
            ctx.early[_ask_key(LIKELY_HOOK_PATH, name)] = _Early(ctx, [binary, name, "--help"],
                                                                 timeout)


def check_hooks(ctx: BootContext, spec, ctk: Version | None) -> int:
    """Ask each hook binary, once per hook name, whether it knows the hook:
    ``<root><path> [hook] <name> --help``, at most the harmless-call time each, all at once (a
    Go binary's start is most of a call, and the cdi step is on the boot's critical path);
    returns how many were asked. The first failure in the spec's order is the one reported.

    Raises:
        StepFailed: a binary refused a name (a non-zero exit: the real refusal is exit 3 with
            ``No help topic for '<name>'``), naming the hook, the hook binary's version (its
            ``--version``, bounded) and nvidia-ctk's; or an answer did not come in time, or the
            binary could not run (a container's creation would hang or fail the same way).
        Cancelled: the boot is ending (another step failed, a signal): raised here, in the
            step's thread, never left in a helper thread.
    """
    import threading

    asks = list(hooks_to_ask(spec).items())
    timeout = ctx.harmless_timeout("nvidia-ctk")
    failed: dict[int, CommandError] = {}
    raised: dict[int, BaseException] = {}

    def ask(index: int, argv: list[str], early) -> None:
        try:
            if early is not None:  # asked while the generation ran (start_hook_asks)
                early.result()
            else:
                ctx.runner.run(argv, timeout=timeout)
        except CommandError as err:
            failed[index] = err
        except BaseException as err:  # Cancelled (the boot is ending): re-raised below
            raised[index] = err

    threads = []
    for index, ((path, name), middle) in enumerate(asks):
        binary = ctx.root.resolve(path)
        early = None if middle else ctx.early.pop(_ask_key(path, name), None)
        thread = threading.Thread(target=ask, args=(index, [binary, *middle, name, "--help"],
                                                    early),
                                  name=f"hook-check-{index}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if raised:  # in the step's own thread, as a call of its own would raise it
        raise raised[min(raised)]
    if not failed:
        return len(asks)
    index = min(failed)
    err = failed[index]
    (path, name), _middle = asks[index]
    if err.timed_out or err.returncode is None:
        said = f"did not answer {name} --help in {err.timeout_s:g} s" \
            if err.timed_out else err.tool_message()
        raise StepFailed(f"the spec's hook {name} could not be checked: {path} {said}; "
                         "a container's creation runs it") from err
    hook_version = _hook_version(ctx, ctx.root.resolve(path), timeout)
    raise StepFailed(
        f"the spec names hook {name}, which {path} ({hook_version}) does not know "
        f"({exit_text(err.returncode)}: {err.tool_message()}); the spec comes from "
        f"nvidia-ctk {ctk or '(version unknown)'}: every container would fail at "
        f"creation; install nvidia-ctk and nvidia-cdi-hook of one toolkit version, or "
        f"add {name} to cdi.disable_hooks") from err


def _hook_version(ctx: BootContext, binary: str, timeout: float) -> str:
    """``<name> <version>`` of a hook binary (its ``--version``), or why it is unknown."""
    base = os.path.basename(binary)
    try:
        done = ctx.runner.run([binary, "--version"], timeout=timeout)
    except CommandError:
        return f"{base}, version unknown"
    version = parse_version(done.stdout + done.stderr)
    return f"{base} {version}" if version else f"{base}, version unknown"
