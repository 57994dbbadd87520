"""The CDI spec's typed model (CDI spec 0.3.0 to 1.1.0, ``specs-go/config.go`` of
tags.cncf.io/container-device-interface), built from a document :mod:`podvm_gpu.cdi.rules` has
checked; :func:`podvm_gpu.cdi.parse.parse_spec` makes one."""

from __future__ import annotations

import functools

from podvm_gpu.record import REQUIRED, Record


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
    """A parsed, valid CDI spec (build it with :func:`podvm_gpu.cdi.parse.parse_spec`).

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


# a field whose document key is not its name in camelCase (specs-go/config.go's json tags);
# None: a field of ours, not of the document
_KEYS = {"clos_id": "closID", "extra": None, "raw": None}
# a field that holds a record (or a list of them) -> the record's class
_NESTED = {"devices": Device, "container_edits": ContainerEdits, "device_nodes": DeviceNode,
           "hooks": Hook, "mounts": Mount, "net_devices": NetDevice, "intel_rdt": IntelRdt}


@functools.cache
def _key(name: str) -> str | None:
    head, *rest = name.split("_")
    return _KEYS.get(name, head + "".join(word.capitalize() for word in rest))


def _build(cls: type[Record], d: dict, **given) -> Record:
    """A ``cls`` from its document ``d``: each field from its key (absent: the field's default),
    lists and dicts copied, records built; unknown keys kept in ``extra``."""
    values, known = dict(given), set()
    for name, default in cls.FIELDS:
        key = _key(name)
        if key not in d:
            continue
        known.add(key)
        value = d[key]
        if name in _NESTED and isinstance(value, list):
            value = [_build(_NESTED[name], v) for v in value]
        elif name in _NESTED and value is not None:
            value = _build(_NESTED[name], value)
        elif default in (list, dict):
            value = default(value)
        values[name] = value
    return cls(**values, extra={k: v for k, v in d.items() if k not in known})


def build_spec(raw: dict) -> Spec:
    return _build(Spec, raw, raw=raw)


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
