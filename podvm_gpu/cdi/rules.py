"""The rules a document must keep to be a CDI spec, as the CDI Go package checks them.

* the shape of the official JSON schema (``schema/schema.json`` and ``schema/defs.json`` of
  tags.cncf.io/container-device-interface), written as data: one shape per object;
* the rules the schema leaves to the Go package (``specs-go/version.go``,
  ``pkg/parser/parser.go``, ``pkg/cdi/spec.go``, ``pkg/cdi/container-edits.go``, ``producer``
  default validator): known ``cdiVersion`` and its minimum, kind and device names, unique
  names, non-empty device edits.

The validator is this code, not the JSON schema: the product needs no schema file at run time;
the tests cross-check it against the official schema with ``jsonschema``.
"""

from __future__ import annotations

import json

from podvm_gpu.cdi import KIND

# specs-go/version.go lists 0.1.0 and 0.2.0 too, but its floor (vEarliest) is 0.3.0, so a spec
# declaring either always fails the minimum-version check: accepted in practice, oldest first.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_PRE_FLOOR_VERSIONS = ("0.1.0", "0.2.0")
_FLOOR = KNOWN_VERSIONS[0]

# OCI hook names the CDI package accepts (pkg/cdi/container-edits.go, validHookNames).
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
# Device node types the CDI package accepts; "" means "take it from the host node".
_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})

_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Invalid(Exception):
    """A rule broken; the message is one line without the source (parse_spec adds it)."""


# --- the schema's shape (schema/schema.json, schema/defs.json) -------------------------------

_Check = object  # a check: (value, where) -> None, raising Invalid


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _string(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise Invalid(f"{where}: expected a string, got {describe(value)}")


def _boolean(value: object, where: str) -> None:
    if not isinstance(value, bool):
        raise Invalid(f"{where}: expected true or false, got {describe(value)}")


def _integer(low: int, high: int) -> _Check:
    def check(value: object, where: str) -> None:
        # Stricter than draft-07, which also takes 1.0: Go's decoder rejects it for an int field.
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Invalid(f"{where}: expected an integer from {low} to {high}, "
                           f"got {describe(value)}")
    return check


_UINT32 = _integer(0, _UINT32_MAX)
_INT64 = _integer(_INT64_MIN, _INT64_MAX)


def _list_of(item: _Check) -> _Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, list):
            raise Invalid(f"{where}: expected a list, got {describe(value)}")
        for i, v in enumerate(value):
            item(v, f"{where}[{i}]")
    return check


def _string_map(value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected a mapping, got {describe(value)}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise Invalid(f"{where}: key {describe(k)} is not a string")
        _string(v, _at(where, k))


def _object(fields: dict[str, _Check], required: tuple[str, ...] = ()) -> _Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(f"{where or 'the spec'}: expected a mapping, got {describe(value)}")
        for key in required:
            if key not in value:
                prefix = f"{where}: " if where else ""
                raise Invalid(f"{prefix}missing required key {q(key)}")
        for key, sub in fields.items():
            if key in value:
                sub(value[key], _at(where, key))
    return check


_DEVICE_NODE_SHAPE = _object(
    {"path": _string, "hostPath": _string, "permissions": _string, "type": _string,
     "major": _INT64, "minor": _INT64, "uid": _UINT32, "gid": _UINT32,
     # not in the schema; the Go type is *os.FileMode (uint32)
     "fileMode": _UINT32},
    ("path",))
_MOUNT_SHAPE = _object(
    {"hostPath": _string, "containerPath": _string, "options": _list_of(_string), "type": _string},
    ("hostPath", "containerPath"))
_HOOK_SHAPE = _object(
    {"hookName": _string, "path": _string, "args": _list_of(_string), "env": _list_of(_string),
     "timeout": _UINT32},
    ("hookName", "path"))
_NET_DEVICE_SHAPE = _object({"hostInterfaceName": _string, "name": _string},
                            ("hostInterfaceName", "name"))
_INTEL_RDT_SHAPE = _object(
    {"closID": _string, "l3CacheSchema": _string, "memBwSchema": _string,
     "schemata": _list_of(_string), "enableMonitoring": _boolean})
_EDITS_SHAPE = _object(
    # env items: the schema's rule is spelled "ref" and so ignored; the Go type is []string.
    {"env": _list_of(_string), "deviceNodes": _list_of(_DEVICE_NODE_SHAPE),
     "netDevices": _list_of(_NET_DEVICE_SHAPE), "mounts": _list_of(_MOUNT_SHAPE),
     "hooks": _list_of(_HOOK_SHAPE), "intelRdt": _INTEL_RDT_SHAPE,
     "additionalGids": _list_of(_UINT32)})
_DEVICE_SHAPE = _object(
    {"name": _string, "annotations": _string_map, "containerEdits": _EDITS_SHAPE},
    ("name", "containerEdits"))
SPEC_SHAPE = _object(
    {"cdiVersion": _string, "kind": _string, "annotations": _string_map,
     "devices": _list_of(_DEVICE_SHAPE), "containerEdits": _EDITS_SHAPE},
    ("cdiVersion", "kind", "devices"))


# --- the rules the schema leaves to the Go package -------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def minimum_version(raw: dict) -> tuple[str, str]:
    """The lowest ``cdiVersion`` the content of a spec needs, and the feature that needs it.

    The rules of the CDI Go package (``specs-go/version.go``, ``requiresV040`` .. ``requiresV110``),
    checked newest first: 1.1.0 ``netDevices``, ``intelRdt`` ``schemata`` or ``enableMonitoring``;
    0.7.0 ``intelRdt``, ``additionalGids``; 0.6.0 spec or device annotations, a ``.`` in the
    class of ``kind``; 0.5.0 a device name that does not start with a letter, a device node
    ``hostPath``; 0.4.0 a mount ``type``; otherwise the floor 0.3.0. Empty values count as
    absent, as in Go (``hostPath: ""``, ``annotations: {}``); ``intelRdt: {}`` counts.

    Args:
        raw: the parsed spec (a dict; keys of unexpected types are ignored, not raised on).

    Returns:
        ``(version, feature)``, e.g. ``("0.5.0", 'device name "0" (starts with a digit)')``;
        ``("0.3.0", "no feature newer than 0.3.0")`` for the floor.
    """
    edits = _edits_with_owner(raw)
    for where, e in edits:
        rdt = e.get("intelRdt")
        if isinstance(rdt, dict) and rdt.get("schemata") is not None:
            return "1.1.0", f"intelRdt schemata in {where}"
        if isinstance(rdt, dict) and rdt.get("enableMonitoring"):
            return "1.1.0", f"intelRdt enableMonitoring in {where}"
        if _non_empty(e.get("netDevices")):
            return "1.1.0", f"netDevices in {where}"
    for where, e in edits:
        if e.get("intelRdt") is not None:
            return "0.7.0", f"intelRdt in {where}"
        if _non_empty(e.get("additionalGids")):
            return "0.7.0", f"additionalGids in {where}"
    if _non_empty(raw.get("annotations")):
        return "0.6.0", "spec annotations"
    for d in _devices(raw):
        if _non_empty(d.get("annotations")):
            return "0.6.0", f"annotations on device {q(d.get('name'))}"
    kind = raw.get("kind")
    if isinstance(kind, str):
        vendor, _, device_class = kind.partition("/")
        if vendor and device_class and "." in device_class:
            return "0.6.0", f'class {q(device_class)} (contains ".")'
    for d in _devices(raw):
        name = d.get("name")
        if isinstance(name, str) and name and not _is_letter(name[0]):
            why = "starts with a digit" if name[0].isdigit() else "does not start with a letter"
            return "0.5.0", f"device name {q(name)} ({why})"
    for where, e in _edits_with_owner(raw, spec_first=False):
        for node in _dicts(e.get("deviceNodes")):
            if node.get("hostPath"):
                return "0.5.0", f"deviceNode hostPath in {where}"
    for where, e in edits:
        for mount in _dicts(e.get("mounts")):
            if mount.get("type"):
                return "0.4.0", f"mount type in {where}"
    return _FLOOR, f"no feature newer than {_FLOOR}"


def _non_empty(value: object) -> bool:
    return isinstance(value, (list, dict)) and len(value) > 0


def _dicts(value: object) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _devices(raw: dict) -> list[dict]:
    return _dicts(raw.get("devices"))


def _edits_with_owner(raw: dict, *, spec_first: bool = True) -> list[tuple[str, dict]]:
    spec_edits = raw.get("containerEdits")
    spec_part = [("the spec's containerEdits", spec_edits)] if isinstance(spec_edits, dict) else []
    device_part = [(f"device {q(d.get('name'))}", d["containerEdits"])
                   for d in _devices(raw) if isinstance(d.get("containerEdits"), dict)]
    return spec_part + device_part if spec_first else device_part + spec_part


def _is_letter(c: str) -> bool:
    return ("A" <= c <= "Z") or ("a" <= c <= "z")


def _is_alnum(c: str) -> bool:
    return _is_letter(c) or ("0" <= c <= "9")


def _name_problem(name: str, *, first, first_rule: str,
                  middle: str) -> str | None:
    """Why ``name`` breaks a CDI name rule (pkg/parser/parser.go), None when it does not."""
    if not name:
        return "it is empty"
    if not first(name[0]):
        return f"it must start with {first_rule}"
    for c in name[1:-1]:
        if not (_is_alnum(c) or c in middle):
            return f"character {q(c)} is not allowed"
    if not _is_alnum(name[-1]):
        return "it must end with a letter or digit"
    return None


def check_rules(raw: dict) -> None:
    """The CDI package's checks, in its order (pkg/cdi/spec.go validate, producer validator)."""
    declared = raw["cdiVersion"]
    version = declared.removeprefix("v")  # specs-go/version.go, newVersion: a leading "v" is ignored
    if version in _PRE_FLOOR_VERSIONS:
        raise Invalid(f"cdiVersion {declared} is below {_FLOOR}, the earliest version the CDI "
                       f"library accepts")
    if version not in KNOWN_VERSIONS:
        raise Invalid(f"cdiVersion {q(declared)} is not a CDI version "
                       f"(known: {KNOWN_VERSIONS[0]} to {KNOWN_VERSIONS[-1]})")
    needed, feature = minimum_version(raw)
    if _version_key(needed) > _version_key(version):
        raise Invalid(f"cdiVersion {declared} is below {needed}, which {feature} needs")

    kind = raw["kind"]
    vendor, slash, device_class = kind.partition("/")
    if not slash or not vendor or not device_class:
        raise Invalid(f"kind {q(kind)} is not <vendor>/<class> (e.g. {q(KIND)})")
    for part, value in (("vendor", vendor), ("class", device_class)):
        why = _name_problem(value, first=_is_letter, first_rule="a letter", middle="_-.")
        if why:
            raise Invalid(f"kind {q(kind)} has an invalid {part} {q(value)}: {why} "
                           f"(letters, digits, _ - . ; a letter first, a letter or digit last)")

    if "containerEdits" in raw:
        _check_edit_rules(raw["containerEdits"], "containerEdits")

    seen: dict[str, int] = {}
    for i, device in enumerate(raw["devices"]):
        name = device["name"]
        if name in seen:
            raise Invalid(f"device name {q(name)} is defined twice (devices[{seen[name]}] and "
                           f"devices[{i}])")
        seen[name] = i
        why = _name_problem(name, first=_is_alnum, first_rule="a letter or digit", middle="_-.:")
        if why:
            raise Invalid(f"device name {q(name)} is invalid: {why} "
                           f"(letters, digits, _ - . : ; a letter or digit at both ends)")
        edits = device["containerEdits"]
        if not any(_non_empty(edits.get(k)) for k in ("env", "deviceNodes", "hooks", "mounts",
                                                      "netDevices", "additionalGids")) \
                and edits.get("intelRdt") is None:
            raise Invalid(f"device {q(name)} has empty containerEdits (a device must change "
                           f"something: env, deviceNodes, hooks, mounts, ...)")
        _check_edit_rules(edits, f"devices[{i}].containerEdits")

    if not raw["devices"]:
        raise Invalid("no devices (a CDI spec needs at least one)")


def _check_edit_rules(edits: dict, where: str) -> None:
    """Container-edit rules of pkg/cdi/container-edits.go (Validate) beyond the schema."""
    _check_env(edits.get("env", []), f"{where}.env")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        at = f"{where}.deviceNodes[{i}]"
        path = node["path"]
        if not path:
            raise Invalid(f"{at}: empty device path")
        node_type = node.get("type", "")
        if node_type not in _NODE_TYPES:
            raise Invalid(f"{at} ({path}): invalid type {q(node_type)} (b, c, u or p)")
        major, minor = node.get("major", 0), node.get("minor", 0)
        if major < 0 or minor < 0:
            raise Invalid(f"{at} ({path}): negative device number {major}:{minor}")
        permissions = node.get("permissions", "")
        if permissions != "none" and permissions.strip("rwm"):
            raise Invalid(f"{at} ({path}): invalid permissions {q(permissions)} "
                           f"(r, w, m or none)")
    for i, hook in enumerate(edits.get("hooks", [])):
        at = f"{where}.hooks[{i}]"
        if hook["hookName"] not in HOOK_NAMES:
            raise Invalid(f"{at}: invalid hookName {q(hook['hookName'])} "
                           f"(one of {', '.join(sorted(HOOK_NAMES))})")
        if not hook["path"]:
            raise Invalid(f"{at}: empty path")
        _check_env(hook.get("env", []), f"{at}.env")
    for i, mount in enumerate(edits.get("mounts", [])):
        at = f"{where}.mounts[{i}]"
        if not mount["hostPath"]:
            raise Invalid(f"{at}: empty hostPath")
        if not mount["containerPath"]:
            raise Invalid(f"{at}: empty containerPath")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        clos_id = rdt.get("closID", "")
        if clos_id != "/" and (len(clos_id) >= 4096 or clos_id in (".", "..")
                               or "/" in clos_id or "\n" in clos_id):
            raise Invalid(f"{where}.intelRdt: invalid closID {q(clos_id)} (not a file name)")
    host_seen: set[str] = set()
    name_seen: set[str] = set()
    for i, dev in enumerate(edits.get("netDevices", [])):
        at = f"{where}.netDevices[{i}]"
        host, name = dev["hostInterfaceName"], dev["name"]
        if not host or not name:
            raise Invalid(f"{at}: empty {'hostInterfaceName' if not host else 'name'}")
        if host in host_seen or name in name_seen:
            dup = f"hostInterfaceName {q(host)}" if host in host_seen else f"name {q(name)}"
            raise Invalid(f"{at}: duplicate {dup}")
        host_seen.add(host)
        name_seen.add(name)


def _check_env(env: list[str], where: str) -> None:
    for i, entry in enumerate(env):
        if entry.find("=") <= 0:
            raise Invalid(f"{where}[{i}]: {q(entry)} is not NAME=VALUE")


# --- message helpers -------------------------------------------------------------------------


def q(value: object) -> str:
    """A value quoted for a one-line message: JSON escapes keep line breaks out."""
    return json.dumps(value)


def describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {q(shown)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
