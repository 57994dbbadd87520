"""The CDI spec: typed model, parsing and validation (contract section 8).

``nvidia-ctk cdi generate`` exits 0 for specs that kata-agent cannot use (no ``/dev/nvidia-uvm``,
a hook binary that is not installed, no ``all`` device), so boot judges the spec by its content:

* :func:`parse_spec` checks what makes a spec a CDI spec at all: the shape of the official JSON
  schema (``schema/schema.json`` and ``schema/defs.json`` of
  tags.cncf.io/container-device-interface)
  plus the rules the schema leaves to the Go package (``specs-go/version.go``,
  ``pkg/parser/parser.go``, ``pkg/cdi/spec.go``, ``pkg/cdi/container-edits.go``,
  ``producer`` default validator): known ``cdiVersion`` and its minimum, kind and device names,
  unique names, non-empty device edits.
* :func:`check_ready_spec` adds the rules of a ``ready`` boot: one device per GPU index plus
  ``all``, the control and GPU nodes present in the spec and on the host with the numbers the
  spec gives, and every hook executable under the root.

The validator is this code, not the JSON schema: the product needs no schema file at run time;
the tests cross-check it against the official schema with ``jsonschema``.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from podvm_gpu.record import REQUIRED, Record

from podvm_gpu.errors import CdiSpecError
from podvm_gpu.host.fs import Root, is_char_device

KIND = "nvidia.com/gpu"

# specs-go/version.go lists 0.1.0 and 0.2.0 too, but its floor (vEarliest) is 0.3.0, so a spec
# declaring either always fails the minimum-version check: accepted in practice, oldest first.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_PRE_FLOOR_VERSIONS = ("0.1.0", "0.2.0")
_FLOOR = KNOWN_VERSIONS[0]

# The control nodes every GPU container needs (contract sections 3 step 5 and 8).
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# OCI hook names the CDI package accepts (pkg/cdi/container-edits.go, validHookNames).
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
# Device node types the CDI package accepts; "" means "take it from the host node".
_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})

_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --- the typed model -------------------------------------------------------------------------


class DeviceNode(Record):
    """One ``deviceNodes`` entry (CDI spec, DeviceNode).

    ``path`` is the path in the container; ``host_path`` the node on the host (CDI 0.5.0), as
    nvidia-ctk wrote it, i.e. with its ``--dev-root`` in front. ``major``/``minor`` are None when
    the key is absent; nvidia-ctk omits ``minor: 0`` (Go ``omitempty``). ``file_mode`` is the
    permission bits as an integer (``438`` = 0o666). Unknown keys are kept in ``extra``.
    """

    FIELDS = (
        ("path", REQUIRED),  # str
        ("host_path", None),  # str | None
        ("type", None),  # str | None
        ("major", None),  # int | None
        ("minor", None),  # int | None
        ("file_mode", None),  # int | None
        ("permissions", None),  # str | None
        ("uid", None),  # int | None
        ("gid", None),  # int | None
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class Mount(Record):
    """One ``mounts`` entry (CDI spec, Mount); ``type`` needs cdiVersion 0.4.0."""

    FIELDS = (
        ("host_path", REQUIRED),  # str
        ("container_path", REQUIRED),  # str
        ("options", list),  # list[str]
        ("type", None),  # str | None
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class Hook(Record):
    """One ``hooks`` entry (CDI spec, Hook): an OCI hook, ``hook_name`` one of :data:`HOOK_NAMES`.

    ``timeout`` is in seconds, None when absent.
    """

    FIELDS = (
        ("hook_name", REQUIRED),  # str
        ("path", REQUIRED),  # str
        ("args", list),  # list[str]
        ("env", list),  # list[str]
        ("timeout", None),  # int | None
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class NetDevice(Record):
    """One ``netDevices`` entry (CDI 1.1.0): a host interface moved into the container."""

    FIELDS = (
        ("host_interface_name", REQUIRED),  # str
        ("name", REQUIRED),  # str
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class IntelRdt(Record):
    """``intelRdt`` (CDI 0.7.0; ``schemata``/``enable_monitoring`` need 1.1.0)."""

    FIELDS = (
        ("clos_id", None),  # str | None
        ("l3_cache_schema", None),  # str | None
        ("mem_bw_schema", None),  # str | None
        ("schemata", None),  # list[str] | None
        ("enable_monitoring", None),  # bool | None
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class ContainerEdits(Record):
    """``containerEdits`` of the spec or of one device (CDI spec, ContainerEdits).

    ``env`` holds ``NAME=VALUE`` strings. ``additional_gids`` needs cdiVersion 0.7.0.
    """

    FIELDS = (
        ("env", list),  # list[str]
        ("device_nodes", list),  # list[DeviceNode]
        ("hooks", list),  # list[Hook]
        ("mounts", list),  # list[Mount]
        ("net_devices", list),  # list[NetDevice]
        ("intel_rdt", None),  # IntelRdt | None
        ("additional_gids", list),  # list[int]
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)

    def is_empty(self) -> bool:
        """True when the edits change nothing (pkg/cdi/container-edits.go, isEmpty)."""
        return not (self.env or self.device_nodes or self.hooks or self.mounts
                    or self.net_devices or self.additional_gids or self.intel_rdt is not None)


class Device(Record):
    """One CDI device: ``name`` is the part after ``=`` in ``nvidia.com/gpu=<name>``."""

    FIELDS = (
        ("name", REQUIRED),  # str
        ("container_edits", REQUIRED),  # ContainerEdits
        ("annotations", dict),  # dict[str, str]
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('extra',)


class Spec(Record):
    """A parsed, valid CDI spec (build it with :func:`parse_spec`).

    ``container_edits`` is None when the spec has no spec-level edits. ``raw`` is the parsed
    document (a dict, unknown keys included), e.g. for :func:`render_spec_yaml`.
    """

    FIELDS = (
        ("cdi_version", REQUIRED),  # str
        ("kind", REQUIRED),  # str
        ("devices", REQUIRED),  # list[Device]
        ("container_edits", None),  # ContainerEdits | None
        ("annotations", dict),  # dict[str, str]
        ("raw", dict),  # dict[str, object]
        ("extra", dict),  # dict[str, object]
    )
    NOT_COMPARED = ('raw', 'extra')

    @property
    def vendor(self) -> str:
        """The part of ``kind`` before the first ``/`` (``nvidia.com``)."""
        return self.kind.split("/", 1)[0]

    @property
    def device_class(self) -> str:
        """The part of ``kind`` after the first ``/`` (``gpu``)."""
        return self.kind.split("/", 1)[1]

    def device_names(self) -> list[str]:
        """The device names in spec order, e.g. ``["0", "GPU-...", "all"]``."""
        return [d.name for d in self.devices]

    def device(self, name: str) -> Device | None:
        """The device called ``name``, None when the spec has none."""
        for d in self.devices:
            if d.name == name:
                return d
        return None

    def _all_edits(self) -> list[ContainerEdits]:
        edits = [self.container_edits] if self.container_edits is not None else []
        return edits + [d.container_edits for d in self.devices]

    def device_nodes(self) -> list[DeviceNode]:
        """Every device node of the spec-level edits, then of each device's edits, in order.

        A node that several devices share (``/dev/nvidia0`` in ``0``, ``GPU-...`` and ``all``)
        is listed once per device.
        """
        return [n for e in self._all_edits() for n in e.device_nodes]

    def hooks(self) -> list[Hook]:
        """Every hook of the spec-level edits, then of each device's edits, in order."""
        return [h for e in self._all_edits() for h in e.hooks]



# --- parsing ---------------------------------------------------------------------------------


class _Invalid(Exception):
    """A rule broken; the message is one line without the source (parse_spec adds it)."""


def parse_spec(text: str | bytes, *, source: str = "<spec>") -> Spec:
    """Parse and validate a CDI spec as written by ``nvidia-ctk cdi generate`` (contract section 8).

    Args:
        text: the spec as YAML or JSON (str, or bytes in UTF-8). One document.
        source: what to call the spec in messages, e.g. its path or ``nvidia-ctk cdi generate``.

    Returns:
        The typed :class:`Spec`; ``Spec.raw`` is the parsed document.

    Raises:
        CdiSpecError: one line, ``"<source>: <what is wrong>"``, for the first rule broken, in
            the order the CDI Go package checks them: not UTF-8, YAML or JSON (duplicate keys
            included, which the Go package's strict unmarshal rejects); not a mapping; the shape
            of the CDI JSON schema (required keys, types, integer ranges, with the location,
            e.g. ``devices[1].containerEdits.deviceNodes[0]: missing required key "path"``);
            ``cdiVersion`` unknown or below the minimum its content needs
            (``specs-go/version.go``, see :func:`minimum_version`); ``kind`` not
            ``<vendor>/<class>`` with the CDI name rules (``pkg/parser/parser.go``); container
            edits the CDI package rejects (``NAME=VALUE`` env entries, hook names, node types and
            permissions, empty paths, negative device numbers; ``pkg/cdi/container-edits.go``);
            a duplicate device name, an invalid device name or a device with empty edits
            (``pkg/cdi/spec.go``, producer default validator); no devices.
            Unknown keys (``fileMode``, ...) are allowed, as the schema allows them.
    """
    where = _one_line(source)
    try:
        raw = _load(text)
        if not isinstance(raw, dict):
            raise _Invalid(f"not a mapping but {_describe(raw)}; a CDI spec is a YAML or JSON "
                           f"object")
        _SPEC_SHAPE(raw, "")
        _check_rules(raw)
    except _Invalid as err:
        raise CdiSpecError(f"{where}: {err}") from None
    return _build_spec(raw)


def _load(text: str | bytes) -> object:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise _Invalid(f"not UTF-8 text (byte {err.start})") from None
    body = text
    while body.startswith("#"):  # comment lines before a JSON document (the unavailable spec)
        body = body.partition("\n")[2]
    if body.lstrip().startswith("{"):
        # JSON (nvidia-ctk --format=json) is read with the JSON parser: faster, and exact about
        # numbers. YAML in flow style also starts with "{", so fall back to YAML.
        try:
            return json.loads(body, object_pairs_hook=_json_object)
        except _Invalid:
            raise
        except ValueError:
            pass
    import yaml  # only for a YAML answer: nvidia-ctk is asked for JSON

    try:
        return yaml.load(text, Loader=_strict_loader())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = " ".join(p for p in (err.context, err.problem) if p) or "invalid"
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _Invalid(f"not YAML or JSON: {_one_line(what)}{at}") from None
    except yaml.YAMLError as err:
        raise _Invalid(f"not YAML or JSON: {_one_line(str(err))}") from None


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Invalid(f"duplicate key {_q(key)} in a JSON object")
        out[key] = value
    return out


@functools.cache
def _strict_loader():
    """A safe loader that rejects duplicate keys, as the Go package's strict unmarshal does;
    on libyaml's parser when PyYAML has it (several times faster on an 8-GPU spec). Made on
    first use: PyYAML is imported only for a YAML spec."""
    import yaml

    class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                # "<<" merge keys may repeat; merged keys are overridden by design.
                if isinstance(key_node, yaml.ScalarNode) and \
                        key_node.tag != "tag:yaml.org,2002:merge":
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {_q(key_node.value)}", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


# --- the schema's shape (schema/schema.json, schema/defs.json) -------------------------------

_Check = object  # a check: (value, where) -> None, raising _Invalid


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _string(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise _Invalid(f"{where}: expected a string, got {_describe(value)}")


def _boolean(value: object, where: str) -> None:
    if not isinstance(value, bool):
        raise _Invalid(f"{where}: expected true or false, got {_describe(value)}")


def _integer(low: int, high: int) -> _Check:
    def check(value: object, where: str) -> None:
        # Stricter than draft-07, which also takes 1.0: Go's decoder rejects it for an int field.
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"{where}: expected an integer from {low} to {high}, "
                           f"got {_describe(value)}")
    return check


_UINT32 = _integer(0, _UINT32_MAX)
_INT64 = _integer(_INT64_MIN, _INT64_MAX)


def _list_of(item: _Check) -> _Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, list):
            raise _Invalid(f"{where}: expected a list, got {_describe(value)}")
        for i, v in enumerate(value):
            item(v, f"{where}[{i}]")
    return check


def _string_map(value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise _Invalid(f"{where}: expected a mapping, got {_describe(value)}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise _Invalid(f"{where}: key {_describe(k)} is not a string")
        _string(v, _at(where, k))


def _object(fields: dict[str, _Check], required: tuple[str, ...] = ()) -> _Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise _Invalid(f"{where or 'the spec'}: expected a mapping, got {_describe(value)}")
        for key in required:
            if key not in value:
                prefix = f"{where}: " if where else ""
                raise _Invalid(f"{prefix}missing required key {_q(key)}")
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
_SPEC_SHAPE = _object(
    {"cdiVersion": _string, "kind": _string, "annotations": _string_map,
     "devices": _list_of(_DEVICE_SHAPE), "containerEdits": _EDITS_SHAPE},
    ("cdiVersion", "kind", "devices"))


# --- the rules the schema leaves to the Go package -------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _normalize_version(version: str) -> str:
    # specs-go/version.go, newVersion: a leading "v" is ignored.
    return version[1:] if version.startswith("v") else version


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
            return "0.6.0", f"annotations on device {_q(d.get('name'))}"
    kind = raw.get("kind")
    if isinstance(kind, str):
        vendor, _, device_class = kind.partition("/")
        if vendor and device_class and "." in device_class:
            return "0.6.0", f'class {_q(device_class)} (contains ".")'
    for d in _devices(raw):
        name = d.get("name")
        if isinstance(name, str) and name and not _is_letter(name[0]):
            why = "starts with a digit" if name[0].isdigit() else "does not start with a letter"
            return "0.5.0", f"device name {_q(name)} ({why})"
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
    device_part = [(f"device {_q(d.get('name'))}", d["containerEdits"])
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
            return f"character {_q(c)} is not allowed"
    if not _is_alnum(name[-1]):
        return "it must end with a letter or digit"
    return None


def _check_rules(raw: dict) -> None:
    """The CDI package's checks, in its order (pkg/cdi/spec.go validate, producer validator)."""
    declared = raw["cdiVersion"]
    version = _normalize_version(declared)
    if version in _PRE_FLOOR_VERSIONS:
        raise _Invalid(f"cdiVersion {declared} is below {_FLOOR}, the earliest version the CDI "
                       f"library accepts")
    if version not in KNOWN_VERSIONS:
        raise _Invalid(f"cdiVersion {_q(declared)} is not a CDI version "
                       f"(known: {KNOWN_VERSIONS[0]} to {KNOWN_VERSIONS[-1]})")
    needed, feature = minimum_version(raw)
    if _version_key(needed) > _version_key(version):
        raise _Invalid(f"cdiVersion {declared} is below {needed}, which {feature} needs")

    kind = raw["kind"]
    vendor, slash, device_class = kind.partition("/")
    if not slash or not vendor or not device_class:
        raise _Invalid(f"kind {_q(kind)} is not <vendor>/<class> (e.g. {_q(KIND)})")
    for part, value in (("vendor", vendor), ("class", device_class)):
        why = _name_problem(value, first=_is_letter, first_rule="a letter", middle="_-.")
        if why:
            raise _Invalid(f"kind {_q(kind)} has an invalid {part} {_q(value)}: {why} "
                           f"(letters, digits, _ - . ; a letter first, a letter or digit last)")

    if "containerEdits" in raw:
        _check_edit_rules(raw["containerEdits"], "containerEdits")

    seen: dict[str, int] = {}
    for i, device in enumerate(raw["devices"]):
        name = device["name"]
        if name in seen:
            raise _Invalid(f"device name {_q(name)} is defined twice (devices[{seen[name]}] and "
                           f"devices[{i}])")
        seen[name] = i
        why = _name_problem(name, first=_is_alnum, first_rule="a letter or digit", middle="_-.:")
        if why:
            raise _Invalid(f"device name {_q(name)} is invalid: {why} "
                           f"(letters, digits, _ - . : ; a letter or digit at both ends)")
        edits = device["containerEdits"]
        if not any(_non_empty(edits.get(k)) for k in ("env", "deviceNodes", "hooks", "mounts",
                                                      "netDevices", "additionalGids")) \
                and edits.get("intelRdt") is None:
            raise _Invalid(f"device {_q(name)} has empty containerEdits (a device must change "
                           f"something: env, deviceNodes, hooks, mounts, ...)")
        _check_edit_rules(edits, f"devices[{i}].containerEdits")

    if not raw["devices"]:
        raise _Invalid("no devices (a CDI spec needs at least one)")


def _check_edit_rules(edits: dict, where: str) -> None:
    """Container-edit rules of pkg/cdi/container-edits.go (Validate) beyond the schema."""
    _check_env(edits.get("env", []), f"{where}.env")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        at = f"{where}.deviceNodes[{i}]"
        path = node["path"]
        if not path:
            raise _Invalid(f"{at}: empty device path")
        node_type = node.get("type", "")
        if node_type not in _NODE_TYPES:
            raise _Invalid(f"{at} ({path}): invalid type {_q(node_type)} (b, c, u or p)")
        major, minor = node.get("major", 0), node.get("minor", 0)
        if major < 0 or minor < 0:
            raise _Invalid(f"{at} ({path}): negative device number {major}:{minor}")
        permissions = node.get("permissions", "")
        if permissions != "none" and permissions.strip("rwm"):
            raise _Invalid(f"{at} ({path}): invalid permissions {_q(permissions)} "
                           f"(r, w, m or none)")
    for i, hook in enumerate(edits.get("hooks", [])):
        at = f"{where}.hooks[{i}]"
        if hook["hookName"] not in HOOK_NAMES:
            raise _Invalid(f"{at}: invalid hookName {_q(hook['hookName'])} "
                           f"(one of {', '.join(sorted(HOOK_NAMES))})")
        if not hook["path"]:
            raise _Invalid(f"{at}: empty path")
        _check_env(hook.get("env", []), f"{at}.env")
    for i, mount in enumerate(edits.get("mounts", [])):
        at = f"{where}.mounts[{i}]"
        if not mount["hostPath"]:
            raise _Invalid(f"{at}: empty hostPath")
        if not mount["containerPath"]:
            raise _Invalid(f"{at}: empty containerPath")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        clos_id = rdt.get("closID", "")
        if clos_id != "/" and (len(clos_id) >= 4096 or clos_id in (".", "..")
                               or "/" in clos_id or "\n" in clos_id):
            raise _Invalid(f"{where}.intelRdt: invalid closID {_q(clos_id)} (not a file name)")
    host_seen: set[str] = set()
    name_seen: set[str] = set()
    for i, dev in enumerate(edits.get("netDevices", [])):
        at = f"{where}.netDevices[{i}]"
        host, name = dev["hostInterfaceName"], dev["name"]
        if not host or not name:
            raise _Invalid(f"{at}: empty {'hostInterfaceName' if not host else 'name'}")
        if host in host_seen or name in name_seen:
            dup = f"hostInterfaceName {_q(host)}" if host in host_seen else f"name {_q(name)}"
            raise _Invalid(f"{at}: duplicate {dup}")
        host_seen.add(host)
        name_seen.add(name)


def _check_env(env: list[str], where: str) -> None:
    for i, entry in enumerate(env):
        if entry.find("=") <= 0:
            raise _Invalid(f"{where}[{i}]: {_q(entry)} is not NAME=VALUE")


# --- from the checked document to the typed model --------------------------------------------


def _extra(d: dict, known: tuple[str, ...]) -> dict[str, object]:
    return {k: v for k, v in d.items() if k not in known}


def _build_edits(e: dict) -> ContainerEdits:
    rdt = e.get("intelRdt")
    return ContainerEdits(
        env=list(e.get("env", [])),
        device_nodes=[
            DeviceNode(path=n["path"], host_path=n.get("hostPath"), type=n.get("type"),
                       major=n.get("major"), minor=n.get("minor"), file_mode=n.get("fileMode"),
                       permissions=n.get("permissions"), uid=n.get("uid"), gid=n.get("gid"),
                       extra=_extra(n, ("path", "hostPath", "type", "major", "minor", "fileMode",
                                        "permissions", "uid", "gid")))
            for n in e.get("deviceNodes", [])],
        hooks=[
            Hook(hook_name=h["hookName"], path=h["path"], args=list(h.get("args", [])),
                 env=list(h.get("env", [])), timeout=h.get("timeout"),
                 extra=_extra(h, ("hookName", "path", "args", "env", "timeout")))
            for h in e.get("hooks", [])],
        mounts=[
            Mount(host_path=m["hostPath"], container_path=m["containerPath"],
                  options=list(m.get("options", [])), type=m.get("type"),
                  extra=_extra(m, ("hostPath", "containerPath", "options", "type")))
            for m in e.get("mounts", [])],
        net_devices=[
            NetDevice(host_interface_name=n["hostInterfaceName"], name=n["name"],
                      extra=_extra(n, ("hostInterfaceName", "name")))
            for n in e.get("netDevices", [])],
        intel_rdt=None if rdt is None else IntelRdt(
            clos_id=rdt.get("closID"), l3_cache_schema=rdt.get("l3CacheSchema"),
            mem_bw_schema=rdt.get("memBwSchema"), schemata=rdt.get("schemata"),
            enable_monitoring=rdt.get("enableMonitoring"),
            extra=_extra(rdt, ("closID", "l3CacheSchema", "memBwSchema", "schemata",
                               "enableMonitoring"))),
        additional_gids=list(e.get("additionalGids", [])),
        extra=_extra(e, ("env", "deviceNodes", "hooks", "mounts", "netDevices", "intelRdt",
                         "additionalGids")),
    )


def _build_spec(raw: dict) -> Spec:
    edits = raw.get("containerEdits")
    return Spec(
        cdi_version=raw["cdiVersion"],
        kind=raw["kind"],
        devices=[Device(name=d["name"], container_edits=_build_edits(d["containerEdits"]),
                        annotations=dict(d.get("annotations", {})),
                        extra=_extra(d, ("name", "containerEdits", "annotations")))
                 for d in raw["devices"]],
        container_edits=None if edits is None else _build_edits(edits),
        annotations=dict(raw.get("annotations", {})),
        raw=raw,
        extra=_extra(raw, ("cdiVersion", "kind", "devices", "containerEdits", "annotations")),
    )


# --- the rules of a ready boot ---------------------------------------------------------------


# The driver libraries a CUDA container cannot do without; nvidia-ctk mounts them as
# <name>.<driver version>. A spec cut short (a truncated stdout with exit 0 still parses)
# lacks them.
DRIVER_LIBRARIES = ("libnvidia-ml.so", "libcuda.so")


def check_ready_spec(spec: Spec, root: Root, gpu_minors: dict[str, int] | list[int],
                     driver_version: str | None = None) -> list[str]:
    """What keeps a valid spec from serving a ``ready`` boot (contract section 8, ready boot).

    Rules, in the order the problems are listed:
      1. ``kind`` is ``nvidia.com/gpu`` (boot owns that kind, contract section 3 step 9).
      2. A device per GPU index ``"0"`` .. ``"N-1"``, then ``"all"`` (peer pods ask for
         ``nvidia.com/gpu=all``).
      3. The spec's device nodes (matched on ``path``) include ``/dev/nvidiactl``,
         ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and ``/dev/nvidia<minor>`` per GPU
         (nvidia-ctk leaves the uvm nodes out with exit 0 when it cannot find them).
      4. Every node of the spec is a character device: its ``hostPath`` as written (nvidia-ctk
         already put its ``--dev-root``, i.e. the root, in front of it, so it is a real path on
         this machine), or, without ``hostPath``, its ``path`` under the root. When the spec gives
         ``major`` or ``minor``, both must match the node; an absent one reads as 0, as nvidia-ctk
         omits zero values (Go ``omitempty``). With neither, the runtime takes the node's own.
      5. Every hook ``path``, taken under the root, is an executable file (nvidia-ctk writes
         ``/usr/bin/nvidia-cdi-hook`` even when it cannot find it, with exit 0).
      6. With ``driver_version``: the spec mounts the driver's NVML and CUDA libraries of that
         version (a ``containerPath`` ending in ``libnvidia-ml.so.<version>`` and
         ``libcuda.so.<version>``), as nvidia-ctk generates them; a spec cut short lacks them.
    A node or hook that several devices share is checked, and reported, once.

    Args:
        spec: a spec from :func:`parse_spec`.
        root: the root the boot runs under (``--root``).
        gpu_minors: the GPUs found, as ``{pci_address: minor}`` (e.g.
            ``{"0000:00:04.0": 0}``) or a list of minors; N is its length.
        driver_version: the loaded driver's version (``550.54.15``), or None to skip rule 6.

    Returns:
        The problems, one line each and naming the rule, e.g. ``'missing device "all"'``,
        ``"device node /dev/nvidia-uvm missing from the spec"``,
        ``"device node /dev/nvidia0: spec says 195:0, node is 195:3"``,
        ``"hook /usr/bin/nvidia-cdi-hook does not exist under the root"``.
        Empty when the spec is good. Nothing is raised for a missing file.
    """
    problems: list[str] = []
    if spec.kind != KIND:
        problems.append(f"kind is {_q(spec.kind)}, not {_q(KIND)}")

    if isinstance(gpu_minors, dict):
        gpus = [(minor, f" (GPU {pci})") for pci, minor in gpu_minors.items()]
    else:
        gpus = [(minor, "") for minor in gpu_minors]
    names = set(spec.device_names())
    for wanted in [str(i) for i in range(len(gpus))] + ["all"]:
        if wanted not in names:
            problems.append(f"missing device {_q(wanted)}")

    nodes = spec.device_nodes()
    paths = {n.path for n in nodes}
    wanted_nodes = [(p, "") for p in CONTROL_NODES] + [(f"/dev/nvidia{m}", gpu) for m, gpu in gpus]
    for path, gpu in wanted_nodes:
        if path not in paths:
            problems.append(f"device node {path} missing from the spec{gpu}")

    checked: set[tuple] = set()
    for node in nodes:
        key = (node.path, node.host_path, node.major, node.minor)
        if key in checked:
            continue
        checked.add(key)
        problem = _node_problem(node, root)
        if problem:
            problems.append(problem)

    for hook_path in dict.fromkeys(h.path for h in spec.hooks()):
        real = root.resolve(hook_path)
        if not os.path.exists(real):
            problems.append(f"hook {hook_path} does not exist under the root")
        elif not os.path.isfile(real) or not os.access(real, os.X_OK):
            problems.append(f"hook {hook_path} is not executable ({_file_kind(real)})")

    if driver_version:
        mounted = {os.path.basename(m.container_path) for e in spec._all_edits() for m in e.mounts}
        for library in DRIVER_LIBRARIES:
            if f"{library}.{driver_version}" not in mounted:
                problems.append(f"the spec mounts no {library}.{driver_version} (the driver's "
                                "library of the loaded version): cut short, or generated for "
                                "another driver")
    return problems


def _node_problem(node: DeviceNode, root: Root) -> str | None:
    if node.host_path:
        real = node.host_path
        missing = f"hostPath {node.host_path} is not a character device"
    else:
        real = root.resolve(node.path)
        missing = "not a character device under the root"
    numbers = is_char_device(real)
    if numbers is None:
        return f"device node {node.path}: {missing} ({_file_kind(real)})"
    if node.major is None and node.minor is None:
        return None
    declared = (node.major or 0, node.minor or 0)
    if declared != numbers:
        return (f"device node {node.path}: spec says {declared[0]}:{declared[1]}, "
                f"node is {numbers[0]}:{numbers[1]}")
    return None


def _file_kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return _one_line(err.strerror or str(err))
    if stat.S_ISREG(mode):
        return f"a regular file, mode {stat.S_IMODE(mode):04o}"
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "an unknown file type"


# --- writing ---------------------------------------------------------------------------------


def render_spec_yaml(raw: dict) -> str:
    """The YAML text to install a spec as (``/var/run/cdi/nvidia.yaml``, contract section 2).

    ``yaml.safe_dump`` with the keys in their given order and no line wrapping, so the same
    dict always gives the same text and a long value (a reason) stays on one line.

    Args:
        raw: a spec document, e.g. ``Spec.raw``.

    Raises:
        yaml.representer.RepresenterError: ``raw`` holds something that is not plain data.
    """
    import yaml

    return yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, width=1_000_000)


# --- message helpers -------------------------------------------------------------------------


def _q(value: object) -> str:
    """A value quoted for a one-line message: JSON escapes keep line breaks out."""
    return json.dumps(value)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(value: object) -> str:
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
        return f"string {_q(shown)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
