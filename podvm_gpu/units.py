"""systemd unit files under a root, read without systemctl (contract section 1: under ``--root``
enablement is read from the ``.wants``/``.requires`` links under ``<root>/etc/systemd/system``).

Only what check needs: where a unit is installed, whether it is enabled or masked, and the
ordering dependencies of a unit with its drop-ins (systemd.unit(5): later directories in the
search path lose to earlier ones; drop-ins ``<unit>.d/*.conf`` add to list settings).
"""

from __future__ import annotations

import glob
import os

from podvm_gpu.host.fs import Root

AGENT_UNIT = "podvm-gpu.service"
KATA_UNIT = "kata-agent.service"
# guest-components' attestation-agent (with its NVIDIA attester: an NVML client from its start)
ATTESTATION_UNIT = "attestation-agent.service"
REFRESH_UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
# systemd's system unit search path, highest priority first (systemd.unit(5)).
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system")


def unit_file(root: Root, unit: str) -> str | None:
    """Host path of the unit's file that systemd would load, or None when it is not installed."""
    for folder in UNIT_DIRS:
        path = f"{folder}/{unit}"
        if os.path.lexists(root.resolve(path, follow_last=False)):
            return path
    return None


def masked(root: Root, unit: str) -> bool:
    """True when the unit is linked to /dev/null in /etc or /run (``systemctl mask``)."""
    for folder in ("/etc/systemd/system", "/run/systemd/system"):
        link = root.resolve(f"{folder}/{unit}", follow_last=False)
        if os.path.islink(link) and os.readlink(link) == "/dev/null":
            return True
    return False


def enabled_by(root: Root, unit: str) -> list[str]:
    """The ``.wants``/``.requires`` folders that link the unit (``multi-user.target.wants``)."""
    found = []
    for folder in UNIT_DIRS:
        base = root.resolve(folder)
        for path in sorted(glob.glob(os.path.join(base, "*.wants", unit))
                           + glob.glob(os.path.join(base, "*.requires", unit))):
            found.append(os.path.basename(os.path.dirname(path)))
    return found


# Dependencies cannot be reset by an empty assignment (systemd.unit(5)); other lists can.
_NO_RESET = frozenset({"After", "Before", "Wants", "Requires", "Requisite", "BindsTo", "PartOf",
                       "Upholds", "Conflicts", "WantedBy", "RequiredBy"})


def _assignments(text: str, section: str):
    """Each ``(key, value)`` assignment of ``section`` in a unit file's text, in order, both
    stripped; comments (``#``, ``;``) and other sections left out."""
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line:
            key, value = (p.strip() for p in line.split("=", 1))
            yield key, value


def _unit_files(root: Root, unit: str) -> list[tuple[str, str | None, str]]:
    """``(host path, text or None, why not read)`` of the unit's file (unless masked) and then
    its drop-ins, in the order systemd applies them: ``<unit>.d/*.conf`` of every unit
    directory sorted by file name, a name in a higher-priority directory hiding the same name
    in a lower one. Each is read as a bounded regular file (host/fs.py ``read_bounded``): a
    FIFO, a device or a folder there is named in ``why``, never waited on (interface.md 2.7)."""
    main = unit_file(root, unit)
    files = []
    if main and not masked(root, unit):
        files.append((main, *root.read_or_why(main)))
    dropins = {}
    for folder in reversed(UNIT_DIRS):  # lower priority first: higher ones override by name
        try:
            real = root.resolve(f"{folder}/{unit}.d")
        except OSError:
            continue
        for path in glob.glob(os.path.join(glob.escape(real), "*.conf")):
            name = os.path.basename(path)
            dropins[name] = f"{folder}/{unit}.d/{name}"
    for name in sorted(dropins):
        files.append((dropins[name], *root.read_or_why(dropins[name])))
    return files


def _unit_texts(root: Root, unit: str) -> list[str]:
    """The texts :func:`_unit_files` could read, in systemd's order."""
    return [text for _, text, _ in _unit_files(root, unit) if text is not None]


def unread_files(root: Root, unit: str) -> list[str]:
    """Why each of the unit's files (its file and drop-ins) could not be read, each naming the
    file (``/etc/systemd/system/kata-agent.service.d/50.conf is a FIFO, not a regular file``);
    empty when all were. What those files set is unknown to :func:`unit_settings` and
    :func:`exec_start`, so a row that reads them reports these."""
    return [why for _, text, why in _unit_files(root, unit) if text is None]


def unit_settings(root: Root, unit: str, section: str = "Unit") -> dict[str, list[str]]:
    """A section's settings of the unit plus its drop-ins, list values split on spaces."""
    merged: dict[str, list[str]] = {}
    for text in _unit_texts(root, unit):
        for key, value in _assignments(text, section):
            if value == "" and key not in _NO_RESET:
                merged[key] = []  # an empty assignment resets a list setting
            elif value:
                merged.setdefault(key, []).extend(value.split())
    return merged


def exec_start(root: Root, unit: str) -> list[str] | None:
    """The argv of the unit's last ``ExecStart=`` after its drop-ins (an empty assignment resets
    the list, systemd.service(5)), split as systemd quotes (shell-like); the executable's prefix
    characters (``-@:+!``) are dropped. None when the unit has none or it cannot be split."""
    import shlex

    lines: list[str] = []
    for text in _unit_texts(root, unit):
        for key, value in _assignments(text, "Service"):
            if key == "ExecStart":
                lines = lines + [value] if value else []
    if not lines:
        return None
    try:
        argv = shlex.split(lines[-1])
    except ValueError:
        return None
    if argv:
        argv[0] = argv[0].lstrip("-@:+!")
    return argv or None


def ordered_before_kata(root: Root) -> tuple[bool, str]:
    """Whether podvm-gpu.service runs before kata-agent.service, and the setting that says so."""
    return ordered_before(root, KATA_UNIT)


def ordered_before(root: Root, unit: str) -> tuple[bool, str]:
    """Whether podvm-gpu.service runs before ``unit`` (its ``Before=``, or the unit's
    ``After=`` with its drop-ins), and the setting that says so."""
    agent = unit_settings(root, AGENT_UNIT)
    if unit in agent.get("Before", []):
        return True, f"{AGENT_UNIT} has Before={unit}"
    other = unit_settings(root, unit)
    if AGENT_UNIT in other.get("After", []):
        return True, f"{unit} has After={AGENT_UNIT}"
    return False, f"neither {AGENT_UNIT} Before={unit} nor {unit} After={AGENT_UNIT}"


# systemd.time(7)'s time span units, in seconds
_SPAN_UNITS = {"usec": 1e-6, "us": 1e-6, "msec": 1e-3, "ms": 1e-3, "": 1.0, "s": 1.0,
               "sec": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0,
               "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hour": 3600.0,
               "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
               "w": 604800.0, "week": 604800.0, "weeks": 604800.0}


def timespan_s(text: str) -> float | None:
    """A systemd time span in seconds (systemd.time(7): ``270``, ``5min``, ``4min 30s``,
    ``infinity``; a plain number is seconds); ``math.inf`` for ``infinity`` and ``0`` (a start
    time-out of 0 is none); None for a text that is not one."""
    import math
    import re

    text = text.strip().lower()
    if text == "infinity":
        return math.inf
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text)
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text):
        return None
    if any(unit not in _SPAN_UNITS for _n, unit in parts):
        return None
    total = sum(float(n) * _SPAN_UNITS[unit] for n, unit in parts)
    return math.inf if total == 0 else total


def start_timeout(root: Root, unit: str) -> tuple[float | None, str]:
    """The unit's start time-out after its drop-ins, ``(seconds, where)``: the last
    ``TimeoutStartSec=`` or ``TimeoutSec=`` assignment of ``[Service]`` (the last one wins;
    an empty one resets it), ``where`` the file that set it. ``(None, "")`` when none is set
    (a ``Type=oneshot`` unit then has no start time-out, systemd.service(5)) or the value is
    not a time span."""
    value, where = None, ""
    for path, text, _why in _unit_files(root, unit):
        for key, found in _assignments(text or "", "Service"):
            if key in ("TimeoutStartSec", "TimeoutSec"):
                value, where = (found or None), path
    seconds = timespan_s(value) if value else None
    return seconds, (where if seconds is not None else "")


def budget_warning(root: Root, budget_s: float) -> str | None:
    """A warning when the config's ``budget_s`` runs past podvm-gpu.service's start time-out:
    systemd then stops the boot before its budget ends (issue 46); None when it fits or the
    unit sets none."""
    limit, where = start_timeout(root, AGENT_UNIT)
    if limit is None or budget_s <= limit:
        return None
    return (f"budget_s {budget_s:g} s is above {AGENT_UNIT}'s TimeoutStartSec {limit:g} s "
            f"({where}): systemd stops the boot at {limit:g} s, before its budget ends and "
            "before it writes its status; raise TimeoutStartSec (a drop-in) to at least "
            f"budget_s + 30 s, or lower budget_s")
