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

from podvm_gpu import nvidia_ctk
from podvm_gpu.errors import CommandError, StepFailed, exit_text, one_line
from podvm_gpu.host.proc import Background, side_by_side
from podvm_gpu.steps.context import BootContext


def _early(ctx: BootContext, argv: list[str], timeout: float) -> Background:
    """A tool call made on a thread of its own (host/proc.py :class:`Background`); its
    ``result()`` waits for it (bounded by the call's own timeout, :meth:`Runner.run`) and
    returns the :class:`~podvm_gpu.host.proc.Completed` call, or raises what the call raised."""
    return Background(lambda: ctx.runner.run(argv, timeout=timeout),
                      "early-" + os.path.basename(argv[0]))


def start_version_read(ctx: BootContext) -> None:
    """Start ``nvidia-ctk --version`` now, on a thread of its own, for :func:`read_version`
    to take later. The version needs neither the GPUs nor persistenced, so the boot asks it
    once the versions step passed (boot/pipeline.py ``_STARTED_AFTER``), while device-nodes and
    persistenced run, instead of first thing in the cdi step, the boot's longest lane (issue
    38: 5-12 ms a boot there). The call is the same one, with the
    same timeout; what it means (a warning, the version recorded) is decided where it is
    read, so the status says nothing of it before the cdi step runs."""
    ctx.early["nvidia-ctk --version"] = _early(ctx, nvidia_ctk.VERSION_ARGV,
                                               ctx.harmless_timeout("nvidia-ctk"))


def read_version(ctx: BootContext) -> nvidia_ctk.Version | None:
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
            ctx.runner.run(nvidia_ctk.VERSION_ARGV, timeout=ctx.harmless_timeout("nvidia-ctk"))
        version = nvidia_ctk.parse_version(done.stdout + done.stderr)
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


def check_features(ctx: BootContext, version: nvidia_ctk.Version | None) -> None:
    """Fail before nvidia-ctk runs when the config asks for what ``version`` lacks.

    Raises:
        StepFailed: ``<feature> needs nvidia-ctk 1.18.0 or later; this image has <version>``
            (the first such key of :data:`~podvm_gpu.nvidia_ctk.FEATURES`, the others
            counted).
    """
    if version is None or version.number >= nvidia_ctk.SINCE_1_18:
        return
    lacking = nvidia_ctk.needed_features(ctx.config)
    if not lacking:
        return
    more = f" (and {', '.join(lacking[1:])})" if len(lacking) > 1 else ""
    raise StepFailed(f"{nvidia_ctk.FEATURES[lacking[0]]} needs nvidia-ctk 1.18.0 or later; this image "
                     f"has nvidia-ctk {version}{more}: install nvidia-container-toolkit 1.18.0 or "
                     f"later in the image, or unset {lacking[0]}")


def _ask_key(path: str, name: str) -> str:
    return f"hook {path} {name}"


def _list_key(path: str, middle) -> str:
    return f"hook list {path} {' '.join(middle)}".rstrip()


def start_hook_asks(ctx: BootContext, version: nvidia_ctk.Version | None) -> None:
    """Ask the hook binary at its usual path (:data:`~podvm_gpu.nvidia_ctk.LIKELY_HOOK_PATH` under
    the root) for its list (``--help``) on a thread of its own while the generation runs, and, for
    nvidia-ctk ``version`` before 1.18.0, each hook its spec names
    (:func:`~podvm_gpu.nvidia_ctk.written_hooks`, less ``cdi.disable_hooks``) by name: the same
    calls :func:`check_hooks` makes after it, which takes the answers it needs and makes the rest
    itself (a hook elsewhere, a hook binary older than nvidia-ctk). The cdi step is the boot's
    longest lane; this takes the asks off it (issue 38). Nothing is decided here. Asks nothing
    when the version is unknown, every hook is disabled (``cdi.disable_hooks: [all]``) or the
    binary is not there."""
    disabled = ctx.config.cdi.disable_hooks
    if version is None or "all" in disabled:  # --disable-hook=all: a spec without hooks
        return
    path = nvidia_ctk.LIKELY_HOOK_PATH
    binary = ctx.root.resolve(path)
    if not os.path.isfile(binary):
        return
    timeout = ctx.harmless_timeout("nvidia-ctk")
    ctx.early[_list_key(path, [])] = _early(ctx, nvidia_ctk.hook_help_argv(binary), timeout)
    if version.number >= nvidia_ctk.SINCE_1_18:
        return
    for name in nvidia_ctk.written_hooks(version.number):
        if name not in disabled:
            ctx.early[_ask_key(path, name)] = _early(ctx, nvidia_ctk.hook_help_argv(binary, name),
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
    said = side_by_side(calls)
    for _result, err in said:
        if err is not None and not isinstance(err, CommandError):
            raise err
    return [result if err is None else err for result, err in said]


def _list_binary(ctx: BootContext, path: str, middle: list[str], timeout: float) -> _Listing:
    early = ctx.early.pop(_list_key(path, middle), None)
    binary = ctx.root.resolve(path)
    try:
        done = early.result() if early is not None else \
            ctx.runner.run(nvidia_ctk.hook_help_argv(binary, *middle), timeout=timeout)
    except CommandError as err:
        return _Listing(error=err)
    version = nvidia_ctk.help_version(done.stdout)
    if version is None:  # nvidia-ctk hook --help has no VERSION section
        try:
            asked = ctx.runner.run(nvidia_ctk.version_argv(binary), timeout=timeout)
            version = nvidia_ctk.parse_version(asked.stdout + asked.stderr)
        except CommandError:
            version = None
    return _Listing(nvidia_ctk.parse_commands(done.stdout), version)


def _ask_name(ctx: BootContext, path: str, middle: list[str], name: str, timeout: float):
    early = None if middle else ctx.early.pop(_ask_key(path, name), None)
    if early is not None:  # asked while the generation ran (start_hook_asks)
        return early.result()
    return ctx.runner.run(nvidia_ctk.hook_help_argv(ctx.root.resolve(path), *middle, name), timeout=timeout)


def _by_name_too(listing: _Listing) -> bool:
    """Whether a binary is also asked name by name: before 1.18.0 (a refusal is its answer) or
    of an unknown version, unless its list ask did not run or hung (asked again, it would too)."""
    if listing.error is not None and (listing.error.timed_out or listing.error.returncode is None):
        return False
    return listing.version is None or listing.version.number < nvidia_ctk.SINCE_1_18


def _unchecked(name: str, path: str, err: CommandError) -> StepFailed:
    said = f"did not answer in {err.timeout_s:g} s" if err.timed_out else err.tool_message()
    return StepFailed(f"the spec's hook {name} could not be checked: {path} {said}; "
                      "a container's creation runs it")


def _advice(name: str, ctk: nvidia_ctk.Version | None) -> str:
    return (f"the spec comes from nvidia-ctk {ctk or '(version unknown)'}: install nvidia-ctk "
            f"and nvidia-cdi-hook of one toolkit version, or add {name} to cdi.disable_hooks")


def check_hooks(ctx: BootContext, spec, ctk: nvidia_ctk.Version | None) -> int:
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
    asks = list(nvidia_ctk.hooks_to_ask(spec).items())
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
