"""The CDI spec's typed model (CDI spec 0.3.0 to 1.1.0, ``specs-go/config.go`` of
tags.cncf.io/container-device-interface), built from a document :mod:`podvm_gpu.cdi.rules` has
checked; :func:`podvm_gpu.cdi.parse.parse_spec` makes one."""

from __future__ import annotations

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


def build_spec(raw: dict) -> Spec:
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
