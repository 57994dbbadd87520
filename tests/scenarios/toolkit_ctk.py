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
- ``nvidia-cdi-hook <name> --help`` (and ``nvidia-ctk hook <name> --help``): exit 0 for a hook
  the version knows, else exit 3 with ``No help topic for '<name>'`` on stderr; ``nvidia-cdi-hook
  --version``: ``NVIDIA CDI Hook version <v>``. 1.17.8 knows ``update-ldcache``,
  ``create-symlinks``, ``chmod``, ``enable-cuda-compat``; 1.20.0 adds
  ``disable-device-node-modification`` and ``update-application-profile`` (their ``--help``
  COMMANDS lists). A version between is taken as the nearer known one by 1.18.0.

In a world whose case names a toolkit and gives no ``usr/bin/nvidia-cdi-hook`` of its own, the
harness puts a fake nvidia-cdi-hook there (world.py); other worlds keep the case's.

Stdlib only: the fakes run ``-IS``.
"""

from __future__ import annotations

import json

from . import effects as fx

DEFAULT_VERSION = "1.20.0"
SINCE = (1, 18, 0)  # IMEX mode, --disable-hook and --enable-hook arrived then
HOOKS_1_17 = ("update-ldcache", "create-symlinks", "chmod", "enable-cuda-compat")
HOOKS_1_20 = HOOKS_1_17 + ("disable-device-node-modification", "update-application-profile")
NEW_FLAGS = ("--disable-hook", "--enable-hook")
COMMITS = {"1.17.8": "f202b80", "1.20.0": "1d1bd5a"}
NO_TOPIC_RC = 3


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
    """The hooks a version's binaries know (and its nvidia-ctk writes)."""
    return HOOKS_1_20 if number(version) >= SINCE else HOOKS_1_17


def ctk_answer(argv: list[str], version: str) -> tuple[int, str, str] | None:
    """What nvidia-ctk ``version`` answers to ``argv`` whatever a rule says, or None (a rule or
    the rest of the harness answers): ``--version``, the refusals before 1.18.0, ``hook <name>
    --help``."""
    if argv[0] != "nvidia-ctk":
        return None
    if argv[1:] == ["--version"]:
        return 0, version_text("NVIDIA Container Toolkit CLI", version), ""
    if argv[1:2] == ["hook"] and len(argv) > 2:
        return hook_help(argv[2], argv[3:], version)
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


def hook_help(name: str, rest: list[str], version: str) -> tuple[int, str, str]:
    """``<name> [...]`` of a hook binary: exit 3 ``No help topic`` for a name it does not know."""
    if name not in known_hooks(version):
        return NO_TOPIC_RC, "", f"No help topic for '{name}'\n"
    return 0, (f"NAME:\n   {name}\n" if "--help" in rest else ""), ""


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
