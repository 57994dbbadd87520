"""The scenario harness's nvidia-ctk and nvidia-cdi-hook, version by version (issue 36).

A world's toolkit is NVIDIA's 1.20.0 unless its case says otherwise (``toolkit: 1.17.8``, or
``toolkit: {nvidia-ctk: 1.20.0, nvidia-cdi-hook: 1.17.8}`` for an image whose two binaries come
from different toolkits). What each version does is what NVIDIA's real builds did
(../shared/nvidia-ctk-real.md, "1.17.8 against 1.20.0"), whatever the case's rules say:

- ``nvidia-ctk --version``: ``NVIDIA Container Toolkit CLI version <v>`` and a ``commit:`` line,
  exit 0 (answered by the harness unless a rule answers ``[nvidia-ctk, --version]``).
- before 1.18.0, ``cdi generate`` with ``--disable-hook`` or ``--enable-hook``: ``flag provided
  but not defined: -<flag>``, exit 1 (urfave/cli parses flags first); with ``--mode=imex``:
  ``invalid discovery mode: imex``, exit 1. 1.17.8 has ``--class`` (``--mode=imex
  --class=imex-channel`` is refused for the mode; run 2026-12-04, the real 1.17.8 built here).
- the spec a generation writes (a rule's ``write_spec``, ``--format=json``) holds only the hooks
  that version writes: 1.17.8 none of ``disable-device-node-modification`` and
  ``update-application-profile``; each ``--disable-hook=<name>`` (``all``: every hook) takes
  its hooks out, as 1.18.0 and later do.
- an empty ``--output=`` glued to its flag, as each release's urfave/cli parses it (issue 42, the
  real builds: ../shared/nvidia-ctk/README.md): 1.17 and 1.20 take it as empty (the spec on
  stdout; a rule answers); 1.19 refuses it wherever it stands (``Incorrect Usage: flag needs an
  argument: --output=`` and ``level=error msg="flag needs an argument: --output="`` on stderr,
  exit 1); 1.18 refuses it last and otherwise takes the next argv word as the output path: a
  ``--driver-root=``/``--dev-root=`` so taken leaves NVML looked for under ``/``
  (``failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND``, exit 1), any other word becomes a file
  of that name (``.json`` appended under ``--format=json``) in the working folder, written with
  nothing on stdout, exit 0.
- ``nvidia-cdi-hook --help`` (and ``nvidia-ctk hook --help``): the version's COMMANDS list in the
  real builds' shape (nvidia-cdi-hook's with its VERSION section; tests/data/real/
  nvidia-ctk-help). ``<name> --help``: exit 0 for a hook the version has; for one it lacks,
  before 1.18.0 exit 3 with ``No help topic for '<name>'`` on stderr, from 1.18.0
  ``level=warning msg="Unsupported CDI hook: <name>"`` on stderr and exit 0.
  ``nvidia-cdi-hook --version``: ``NVIDIA CDI Hook version <v>``. Which hook each version has
  (:data:`HOOK_SINCE`): 1.17.8 ``update-ldcache``, ``create-symlinks``, ``chmod``,
  ``enable-cuda-compat``; 1.18.0 adds ``disable-device-node-modification``; 1.20.0 adds
  ``update-application-profile``; nvidia-ctk writes them all but ``chmod`` in its spec.

In a world whose case names a toolkit and gives no ``usr/bin/nvidia-cdi-hook`` of its own, the
harness puts a fake nvidia-cdi-hook there (world.py); other worlds keep the case's.

Stdlib only: the fakes run ``-IS``.
"""

from __future__ import annotations

import json

from . import effects as fx

DEFAULT_VERSION = "1.20.0"
SINCE = (1, 18, 0)  # IMEX mode, --disable-hook and --enable-hook arrived then
# the version each hook arrived in ((1, 17, 0): 1.17 or before), as the real builds' --help
# COMMANDS lists show (the agent's own table is podvm_gpu/nvidia_ctk.py HOOK_SINCE: the
# stand-in keeps its own, read from the real builds, not from the product)
HOOK_SINCE = {"update-ldcache": (1, 17, 0), "create-symlinks": (1, 17, 0), "chmod": (1, 17, 0),
              "enable-cuda-compat": (1, 17, 0), "disable-device-node-modification": (1, 18, 0),
              "update-application-profile": (1, 20, 0)}
HOOKS_1_17 = ("update-ldcache", "create-symlinks", "chmod", "enable-cuda-compat")
HOOKS_1_20 = tuple(HOOK_SINCE)
USAGE = {"update-ldcache": "Update ldcache in a container by running ldconfig",
         "create-symlinks": "A hook to create symlinks in the container.",
         "chmod": "Set the permissions of folders in the container by running chmod. The "
                  "container root is prefixed to the specified paths.",
         "enable-cuda-compat": "This hook ensures that the folder containing the CUDA compat "
                               "libraries is added to the ldconfig search path if required.",
         "disable-device-node-modification": "Ensure that the /proc/driver/nvidia/params file "
                                             "present in the container does not allow device "
                                             "node modifications.",
         "update-application-profile": "Updates driver settings through \"application "
                                       "profiles\". Currently, this hook sets "
                                       "EGLVisibleDGPUDevices to restrict EGL/Vulkan GPU "
                                       "visibility inside the container"}
NEW_FLAGS = ("--disable-hook", "--enable-hook")
COMMITS = {"1.17.8": "f202b80", "1.18.2": "9e88ed3", "1.19.1": "09ceee5", "1.20.0": "1d1bd5a"}
NO_TOPIC_RC = 3
NEEDS_ARGUMENT = "flag needs an argument: --output="
NO_NVML = ("failed to generate CDI spec: failed to create device CDI specs: failed to construct "
           "device spec generators: failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND")


def versions(case_value) -> dict[str, str]:
    """``{"nvidia-ctk": v, "nvidia-cdi-hook": v}`` from a case's ``toolkit`` (None, a version,
    or a mapping naming either binary).

    Raises:
        ValueError: anything else.
    """
    if case_value is None:
        return {"nvidia-ctk": DEFAULT_VERSION, "nvidia-cdi-hook": DEFAULT_VERSION}
    if isinstance(case_value, str):
        number(case_value)
        return {"nvidia-ctk": case_value, "nvidia-cdi-hook": case_value}
    if isinstance(case_value, dict) and set(case_value) <= {"nvidia-ctk", "nvidia-cdi-hook"}:
        for value in case_value.values():
            number(str(value))
        return {**versions(None), **{k: str(v) for k, v in case_value.items()}}
    raise ValueError(f"toolkit must be a version or a mapping of nvidia-ctk/nvidia-cdi-hook to "
                     f"versions, not {case_value!r}")


def number(version: str) -> tuple[int, int, int]:
    """``1.17.8`` -> ``(1, 17, 8)``.

    Raises:
        ValueError: not three dotted numbers.
    """
    parts = version.split("-", 1)[0].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a toolkit version: {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def known_hooks(version: str) -> tuple[str, ...]:
    """The hooks a version's binaries know (and its nvidia-ctk writes, ``chmod`` aside)."""
    return tuple(name for name, since in HOOK_SINCE.items() if number(version) >= since)


def empty_output(argv: list[str], version: str, cwd: str = ".") -> tuple[int, str, str] | None:
    """What nvidia-ctk ``version`` does with an empty ``--output=`` in a ``cdi generate`` argv
    (module docstring), or None when it takes it as empty (or there is none)."""
    if "--output=" not in argv:
        return None
    minor = number(version)[:2]
    at = argv.index("--output=")
    refused = (1, "", f"Incorrect Usage: {NEEDS_ARGUMENT}\n\nlevel=error msg=\"{NEEDS_ARGUMENT}\"\n")
    if minor == (1, 19) or (minor == (1, 18) and at == len(argv) - 1):
        return refused
    if minor != (1, 18):
        return None
    taken = argv[at + 1]
    if taken.startswith(("--driver-root=", "--dev-root=")):
        return 1, "", f'level=error msg="{NO_NVML}"\n'
    name = taken if taken.endswith((".json", ".yaml")) or \
        fx.option_value(argv, "--format") != "json" else taken + ".json"
    import os

    with open(os.path.join(cwd, name), "w") as out:
        out.write("{}")
    return 0, "", ""


def ctk_answer(argv: list[str], version: str) -> tuple[int, str, str] | None:
    """What nvidia-ctk ``version`` answers to ``argv`` whatever a rule says, or None (a rule or
    the rest of the harness answers): ``--version``, the refusals before 1.18.0, ``hook <name>
    --help``."""
    if argv[0] != "nvidia-ctk":
        return None
    if argv[1:] == ["--version"]:
        return 0, version_text("NVIDIA Container Toolkit CLI", version), ""
    if argv[1:2] == ["hook"] and len(argv) > 2:
        return hook_help(argv[2], argv[3:], version, app=None)
    if argv[1:3] == ["cdi", "generate"]:
        said = empty_output(argv, version)
        if said is not None:
            return said
    if argv[1:3] == ["cdi", "generate"] and number(version) < SINCE:
        for flag in NEW_FLAGS:
            if fx.option_value(argv, flag) is not None:
                said = f"flag provided but not defined: {flag[1:]}"
                return 1, f"Incorrect Usage: {said}\n\n", f'level=error msg="{said}"\n'
        if fx.option_value(argv, "--mode") == "imex":
            return 1, "", 'level=error msg="invalid discovery mode: imex"\n'
    return None


def hook_answer(argv: list[str], version: str) -> tuple[int, str, str]:
    """What nvidia-cdi-hook ``version`` answers to ``argv`` (``--version``, ``<name> --help``;
    anything else runs nothing and exits 0: no container is created in a world)."""
    if argv[1:] == ["--version"]:
        return 0, version_text("NVIDIA CDI Hook", version), ""
    if len(argv) > 1:
        return hook_help(argv[1], argv[2:], version)
    return 0, "", ""


def hook_help(name: str, rest: list[str], version: str,
              app: str | None = "NVIDIA CDI Hook") -> tuple[int, str, str]:
    """``<name> [...]`` of a hook binary: ``--help`` its list (:func:`help_text`); for a name it
    does not know exit 3 ``No help topic`` before 1.18.0, a warning and exit 0 from 1.18.0."""
    if name in ("--help", "-h"):
        return 0, help_text(version, app), ""
    if name not in known_hooks(version):
        if number(version) >= SINCE:
            return 0, "", f'level=warning msg="Unsupported CDI hook: {name}"\n'
        return NO_TOPIC_RC, "", f"No help topic for '{name}'\n"
    return 0, (f"NAME:\n   {name}\n" if "--help" in rest else ""), ""


def help_text(version: str, app: str | None) -> str:
    """``--help`` of ``nvidia-cdi-hook`` (``app`` its name: NAME, VERSION, COMMANDS) or of
    ``nvidia-ctk hook`` (``app`` None: NAME, COMMANDS), as the real builds print them
    (tests/data/real/nvidia-ctk-help)."""
    names = known_hooks(version) + (("help, h",) if app or number(version) < SINCE else ())
    width = max(len(n) for n in names) + 2
    usage = {**USAGE, "help, h": "Shows a list of commands or help for one command"}
    rows = "".join(f"   {n.ljust(width)}{usage[n]}\n" for n in names)
    if app is None:
        return ("NAME:\n   NVIDIA Container Toolkit CLI hook - A collection of hooks that may be "
                "injected into an OCI spec\n\nUSAGE:\n   NVIDIA Container Toolkit CLI hook "
                f"[command [command options]]\n\nCOMMANDS:\n{rows}\nOPTIONS:\n"
                "   --help, -h  show help\n")
    return (f"NAME:\n   {app} - Command to structure files for usage inside a container, called "
            "as hooks from a container runtime, defined in a CDI yaml file\n\nUSAGE:\n   "
            f"{app} [global options] [command [command options]]\n\nVERSION:\n   {version}\n"
            f"commit: {COMMITS.get(version, 'unknown')}\n\nCOMMANDS:\n{rows}\nGLOBAL OPTIONS:\n"
            "   --help, -h     show help\n   --version, -v  print the version\n")


def version_text(app: str, version: str) -> str:
    """urfave/cli's ``--version`` output as the toolkit's builds print it."""
    return f"{app} version {version}\ncommit: {COMMITS.get(version, 'unknown')}\n"


def filter_spec(text: str, argv: list[str], version: str) -> str:
    """The spec ``text`` (JSON, as the agent asks for) with only the hooks nvidia-ctk
    ``version`` writes, less those ``--disable-hook`` names; unchanged when nothing goes (or it
    is not a JSON spec)."""
    disabled = {a.split("=", 1)[1] for a in argv if a.startswith("--disable-hook=")}
    for i, arg in enumerate(argv[:-1]):
        if arg == "--disable-hook":
            disabled.add(argv[i + 1])
    keep = set(known_hooks(version)) - disabled
    if "all" in disabled:
        keep = set()
    try:
        spec = json.loads(text)
    except ValueError:
        return text
    if not isinstance(spec, dict):
        return text
    edits = [spec.get("containerEdits")] + [d.get("containerEdits") for d in spec.get("devices", [])
                                            if isinstance(d, dict)]
    dropped = False
    for edit in edits:
        if not isinstance(edit, dict) or not isinstance(edit.get("hooks"), list):
            continue
        kept = [h for h in edit["hooks"] if _hook_name(h) is None or _hook_name(h) in keep]
        if len(kept) != len(edit["hooks"]):
            dropped = True
            if kept:
                edit["hooks"] = kept
            else:
                del edit["hooks"]
    return json.dumps(spec, separators=(",", ":")) if dropped else text


def _hook_name(hook) -> str | None:
    args = hook.get("args") if isinstance(hook, dict) else None
    if not isinstance(args, list) or len(args) < 2:
        return None
    if args[0] == "nvidia-ctk" and args[1] == "hook":
        return args[2] if len(args) > 2 else None
    return args[1] if args[0] == "nvidia-cdi-hook" else None
