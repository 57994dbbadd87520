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


def _settings(text: str, section: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            continue
        if current == section and "=" in line:
            key, value = (p.strip() for p in line.split("=", 1))
            if value == "" and key not in _NO_RESET:
                out[key] = []  # an empty assignment resets a list setting
            elif value:
                out.setdefault(key, []).extend(value.split())
    return out


def _unit_texts(root: Root, unit: str) -> list[str]:
    """The unit's file (unless masked) and then its drop-ins, in the order systemd applies them:
    ``<unit>.d/*.conf`` of every unit directory sorted by file name, a name in a higher-priority
    directory hiding the same name in a lower one."""
    main = unit_file(root, unit)
    texts = []
    if main and not masked(root, unit):
        texts.append(root.read_text(main) or "")
    dropins = {}
    for folder in reversed(UNIT_DIRS):  # lower priority first: higher ones override by name
        for path in glob.glob(os.path.join(root.resolve(f"{folder}/{unit}.d"), "*.conf")):
            dropins[os.path.basename(path)] = path
    for name in sorted(dropins):
        try:
            with open(dropins[name], encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        except OSError:
            continue
    return texts


def unit_settings(root: Root, unit: str, section: str = "Unit") -> dict[str, list[str]]:
    """A section's settings of the unit plus its drop-ins, list values split on spaces."""
    merged: dict[str, list[str]] = {}
    for text in _unit_texts(root, unit):
        for key, values in _settings(text, section).items():
            reset = values == [] and key not in _NO_RESET
            merged[key] = [] if reset else merged.get(key, []) + values
    return merged


def exec_start(root: Root, unit: str) -> list[str] | None:
    """The argv of the unit's last ``ExecStart=`` after its drop-ins (an empty assignment resets
    the list, systemd.service(5)), split as systemd quotes (shell-like); the executable's prefix
    characters (``-@:+!``) are dropped. None when the unit has none or it cannot be split."""
    import shlex

    lines: list[str] = []
    for text in _unit_texts(root, unit):
        current = None
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                current = line[1:-1]
            elif current == "Service" and "=" in line and line[0] not in "#;":
                key, value = (p.strip() for p in line.split("=", 1))
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
