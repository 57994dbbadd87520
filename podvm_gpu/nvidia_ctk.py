"""The NVIDIA Container Toolkit's back end (issue 44 item 4): every command line the agent gives
nvidia-ctk and nvidia-cdi-hook, what each toolkit version has, and how their answers read.

One file for one back end, the shape of the toolkit's own ``pkg/nvcdi``; gpufacts/ is
nvidia-smi's. Here: the command lines (``nvidia-ctk --version``, ``cdi generate --mode=nvml``
and ``--mode=imex``, ``system create-device-nodes``, a hook binary's ``--help`` list and its ask
of one hook by name), the parsers of a version and of a urfave/cli ``--help``, the
version/feature table (:data:`SINCE_1_18`, :data:`FEATURES`, :data:`HOOK_SINCE`,
:data:`NOT_WRITTEN`, :data:`SPEC_VERSIONS`), the one list of hook names (:data:`HOOK_SINCE`:
config's ``cdi.disable_hooks`` takes ``all`` and these, :data:`DISABLE_HOOK_NAMES`), the hook
binaries (:data:`HOOK_BINARIES`) and the environment the binaries run with
(:data:`TOOL_ENV_ALLOWED`, host/proc.py). What runs them and decides on the answers:
steps/cdi/toolkit.py (the version read, the features, the hook check), steps/cdi/step.py and
imex.py (the generations), steps/nodes.py (the control nodes), check --image's toolkit row
(steps/cdi/toolkit_image.py). tests/test_layout.py holds that no other module writes one of
these command lines or names a hook.

It imports nothing of the package and, when imported, only ``os``: the config's loading (on
the CPU fast path with a config file) and host/proc.py import it, so ``re`` (with ``enum``,
``functools`` and ``collections``, 3-4 ms of a CPU boot) is imported by the parsers when they
run, on the GPU path.
"""

from __future__ import annotations

import os

# The toolkit's two binaries (one package, nvidia-container-toolkit-base, carries both).
BINARIES = ("nvidia-ctk", "nvidia-cdi-hook")
VERSION_ARGV = ["nvidia-ctk", "--version"]
# The generation's first words: an NVML client (host/proc.py nvml_client).
GENERATE = ["nvidia-ctk", "cdi", "generate"]

# The environment variables a tool gets when its name is here, every other one left out (with
# LC_ALL=C added). nvidia-ctk (urfave/cli) fills every flag the agent does not pass from a
# variable: NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS=all made 1.20.0 write a spec without hooks that
# passed as ready, and on a real VM (no --root) ROOT, DRIVER_ROOT, NVIDIA_DRIVER_ROOT, DEV_ROOT,
# NVIDIA_DEV_ROOT, DRY_RUN and NVIDIA_CTK_* redirect or disable what it does (issue 29 item 28);
# XDG_CONFIG_HOME would point it at another config.toml. Kept: PATH (it finds nvidia-cdi-hook
# and ldconfig there, as boot finds the tools) and the dynamic loader's LD_LIBRARY_PATH and
# LD_PRELOAD (read by ld.so for every program, no flag of nvidia-ctk's; where libnvidia-ml.so.1
# is found, and how the test harness's umockdev works). LANG and LC_* are not kept: Go programs
# do not read the locale, and LC_ALL=C is set for every tool anyway.
# nvidia-cdi-hook is a urfave/cli program of the same toolkit (the cdi step's hook check runs
# it, and nvidia-ctk as `nvidia-ctk hook`, by the absolute path the spec names: the basename
# decides).
TOOL_ENV_ALLOWED = dict.fromkeys(BINARIES, ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD"))

# urfave/cli's version line: "<app name> version <v>" (nvidia-ctk: "NVIDIA Container Toolkit
# CLI", nvidia-cdi-hook: its own name); a build without the version injected says "unknown".
_VERSION = r"\bversion\s+v?(\d+)\.(\d+)\.(\d+)(\S*)"
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
# The hook names nvidia-ctk's ``cdi generate --disable-hook`` takes (1.18.0 and later;
# internal/discover/hooks.go of NVIDIA/nvidia-container-toolkit: ``all`` and one name per hook
# it can write; chmod is off by default there). ``cdi.disable_hooks`` is checked against them.
DISABLE_HOOK_NAMES = ("all", *sorted(HOOK_SINCE))
# Where the hook binary usually is: its list is asked while the generation runs
# (steps/cdi/toolkit.py start_hook_asks).
LIKELY_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
# The binaries whose hooks the agent knows how to ask: args[0] of a hook, its name after them.
HOOK_BINARIES = {"nvidia-cdi-hook": 1, "nvidia-ctk": 2}  # nvidia-ctk: ["nvidia-ctk", "hook", name]
# nvidia-ctk version -> the cdiVersion its `cdi generate --mode=nvml` spec was seen with:
# 1.17.8 and 1.20.0 from their real binaries (docs/compatibility.md; 1.20.0 on a real H200,
# tests/data/real/h200-580), 1.19.1 as reported (nvidia-container-toolkit#1940)
SPEC_VERSIONS = {"1.17.8": "0.5.0", "1.19.1": "0.7.0", "1.20.0": "0.5.0"}


def version_argv(binary: str) -> list[str]:
    """``<binary> --version``: a toolkit binary at a path (``/usr/bin/nvidia-cdi-hook``) asked
    its version."""
    return [binary, "--version"]


def hook_help_argv(binary: str, *words: str) -> list[str]:
    """``<binary> <words> --help``: a hook binary asked for its list of hooks (``words``: none,
    or ``hook`` when nvidia-ctk runs the hooks), or for one hook by name (``words`` ending in the
    name). ``binary``: the path of the binary as run (under the root)."""
    return [binary, *words, "--help"]


def _roots(root) -> list[str]:
    """``--driver-root`` and ``--dev-root`` at ``root`` (a host.fs Root), none at ``/``."""
    return [] if root.is_host else [f"--driver-root={root.path}", f"--dev-root={root.path}"]


def disable_hook_args(names) -> list[str]:
    """``--disable-hook=<name>`` for each of ``names`` (``cdi.disable_hooks``), in its order."""
    return [f"--disable-hook={name}" for name in names]


def generate_nvml_argv(root, disable_hooks=()) -> list[str]:
    """``nvidia-ctk cdi generate --mode=nvml --format=json`` (the spec on stdout: no ``--output``,
    which 1.18 and 1.19 parse differently when empty; steps/cdi/step.py's docstring), with the
    roots when not ``/``.

    ``--mode=nvml`` explicitly: without it the toolkit takes its mode from
    ``/etc/nvidia-container-runtime/config.toml``, and 1.18.0 with ``mode = "cdi"`` there fails
    with ``invalid discovery mode: cdi`` (NVIDIA/nvidia-container-toolkit#1376, fixed in #1377).
    A pod VM's GPUs are NVML devices whatever the runtime's config says. ``cdi.disable_hooks``
    adds ``--disable-hook=<name>`` each (steps/cdi/toolkit.py).

    Args:
        root: a host.fs Root; disable_hooks: ``cdi.disable_hooks``'s names."""
    return [*GENERATE, "--mode=nvml", "--format=json", *disable_hook_args(disable_hooks),
            *_roots(root)]


def generate_imex_argv(root) -> list[str]:
    """``nvidia-ctk cdi generate --mode=imex --class=imex-channel --format=json`` (the spec on
    stdout, no ``--output``: 1.18 and 1.19 parse an empty one differently, issue 42), with the
    roots when not ``/`` (the shape of the GPUs' generation, :func:`generate_nvml_argv`)."""
    return [*GENERATE, "--mode=imex", "--class=imex-channel", "--format=json", *_roots(root)]


def control_nodes_argv(root) -> list[str]:
    """``nvidia-ctk system create-device-nodes --control-devices`` (the control device nodes,
    steps/nodes.py), with ``--dev-root`` when ``root`` (a host.fs Root) is not ``/``."""
    argv = ["nvidia-ctk", "system", "create-device-nodes", "--control-devices"]
    return argv if root.is_host else [*argv, f"--dev-root={root.path}"]


class Version:
    """A toolkit version as ``--version`` printed it: ``text`` (``1.20.0``, a suffix kept) and
    ``number`` (``(1, 20, 0)``)."""

    def __init__(self, text: str, number: tuple[int, int, int]):
        self.text, self.number = text, number

    def __str__(self) -> str:
        return self.text


def parse_version(output: str) -> Version | None:
    """The version in ``--version`` output (its first ``version X.Y.Z``), None when none."""
    import re

    return _version_of(re.search(_VERSION, output))


def _version_of(m) -> Version | None:
    if m is None:
        return None
    number = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return Version(".".join(map(str, number)) + m.group(4), number)


def needed_features(config) -> list[str]:
    """The config keys set whose feature needs nvidia-ctk 1.18.0 (:data:`FEATURES`)."""
    wanted = []
    for key in FEATURES:
        section, name = key.split(".")
        if getattr(getattr(config, section), name):
            wanted.append(key)
    return wanted


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
_HEADING = r"^[A-Z][A-Z ]*:\s*$"
_HELP_VERSION = r"(?m)^VERSION:\s*\n\s+v?(\d+)\.(\d+)\.(\d+)(\S*)"


def parse_commands(help_text: str) -> tuple[str, ...] | None:
    """The command names of a urfave/cli ``--help`` (its COMMANDS section: each line's first
    word, aliases and ``help`` left out), or None when the text has no COMMANDS section."""
    import re

    names: list[str] | None = None
    for line in help_text.splitlines():
        if names is None:
            if line.strip() == "COMMANDS:":
                names = []
            continue
        if not line.strip() or re.match(_HEADING, line):
            break
        first = line.split()[0].rstrip(",")
        if first != "help":
            names.append(first)
    return tuple(names) if names is not None else None


def help_version(help_text: str) -> Version | None:
    """The version of a urfave/cli ``--help``'s VERSION section, None when it has none."""
    import re

    return _version_of(re.search(_HELP_VERSION, help_text))
