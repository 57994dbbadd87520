"""CDI spec parsing and validation (podvm_gpu.cdi, contract section 8).

The fixtures are real ``nvidia-ctk cdi generate`` output (shared/fixtures/nvidia-ctk/README.md).
Every spec here is also run through the official CDI JSON schema with ``jsonschema``: the
product's validator must reject whatever the schema rejects, and more (name, version and
edit rules the schema lacks).
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from podvm_gpu import cdi
from podvm_gpu.cdi import model, parse, ready, rules
from podvm_gpu.errors import CdiSpecError
from podvm_gpu.host.fs import Root

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def data_dir(*parts: str) -> Path:
    """``tests/data/<parts>`` when the project carries its own copy, else ``../shared/<parts>``."""
    local = REPO / "tests" / "data" / Path(*parts)
    return local if local.is_dir() else SHARED.joinpath(*parts)


FIXTURES = data_dir("fixtures", "nvidia-ctk")
SCHEMA_DIR = data_dir("cdi-schema")

HAND_WRITTEN = ("spec-invalid-name.yaml", "spec-empty-edits.yaml")
SPEC_FILES = sorted(p.name for p in FIXTURES.glob("spec-*") if p.suffix in (".yaml", ".json"))
GENERATED = [n for n in SPEC_FILES if n not in HAND_WRITTEN]
# Read once, up front: the pyfakefs tests below cannot see the real files.
TEXT = {name: (FIXTURES / name).read_text() for name in SPEC_FILES}

# C14 (shared/cases): what a toolkit that writes 0.4.0 produced, numeric name included.
C14_SPEC = """\
cdiVersion: 0.4.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
"""

# C15 (shared/cases): generated with the no-all-device option; paths only, no hostPath.
C15_SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-11111111-2222-3333-4444-555555555555
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
"""

HOOK = "/usr/bin/nvidia-cdi-hook"


@pytest.fixture(scope="module")
def schema() -> Draft7Validator:
    """The official CDI schema, loaded as the CDI Go package embeds it (cdi-schema/README.md)."""
    main = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resources([
        ("file:///schema.json", Resource.from_contents(main, DRAFT7)),
        ("file:///defs.json", Resource.from_contents(defs, DRAFT7)),
    ])
    return Draft7Validator({"$ref": "file:///schema.json"}, registry=registry)


def schema_rejects(schema: Draft7Validator, doc) -> bool:
    return any(True for _ in schema.iter_errors(doc))


def rejection(text, source="spec.yaml") -> str:
    """parse_spec's message for a spec it must reject; asserts the message is one line."""
    with pytest.raises(CdiSpecError) as info:
        parse.parse_spec(text, source=source)
    message = str(info.value)
    assert message.startswith(f"{source}: ")
    assert len(message.splitlines()) == 1, message
    return message


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_BASE = yaml.load(TEXT["spec-1gpu.yaml"], Loader=_LOADER)


def base_doc() -> dict:
    """A fresh copy of the 1-GPU spec as a document, for the hand-made variants."""
    return copy.deepcopy(_BASE)


def dump(doc) -> str:
    return yaml.dump(doc, Dumper=_DUMPER, sort_keys=False)


def with_dev_root(text: str, root: Path) -> str:
    """What nvidia-ctk writes with ``--dev-root=<root>``: the root in front of every hostPath.

    The fixtures were rewritten to driver root ``/`` (fixtures README); this undoes it.
    """
    return re.sub(r"(hostPath: )/", lambda m: f"{m.group(1)}{root}/", text)


# --- the fixtures ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED)
def test_every_generated_fixture_parses_and_passes_the_official_schema(name, schema):
    spec = parse.parse_spec(TEXT[name], source=name)

    assert not schema_rejects(schema, spec.raw)
    assert spec.kind == cdi.KIND
    assert spec.cdi_version == "0.5.0"
    assert "all" in spec.device_names() and "0" in spec.device_names()


@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_hand_written_fixtures_pass_the_schema_but_not_parse_spec(name, schema):
    doc = yaml.safe_load(TEXT[name])

    assert not schema_rejects(schema, doc)
    message = rejection(TEXT[name], source=name)
    assert {"spec-invalid-name.yaml": 'device name "gpu 0"',
            "spec-empty-edits.yaml": 'device "0" has empty containerEdits'}[name] in message


def test_json_fixture_parses_to_the_same_spec_as_the_yaml_one():
    from_json = parse.parse_spec(TEXT["spec-1gpu.json"].encode())
    from_yaml = parse.parse_spec(TEXT["spec-1gpu.yaml"])

    assert from_json.raw == from_yaml.raw
    assert from_json == from_yaml


def test_model_exposes_nodes_hooks_and_names_of_the_8gpu_spec():
    spec = parse.parse_spec(TEXT["spec-8gpu.yaml"])

    assert spec.device_names()[:8] == [str(i) for i in range(8)]
    assert len(spec.devices) == 17
    paths = {n.path for n in spec.device_nodes()}
    assert {f"/dev/nvidia{i}" for i in range(8)} | set(ready.CONTROL_NODES) <= paths
    uvm_tools = next(n for n in spec.device_nodes() if n.path == "/dev/nvidia-uvm-tools")
    assert (uvm_tools.major, uvm_tools.minor, uvm_tools.file_mode) == (510, 1, 0o666)
    assert spec.device("0").container_edits.device_nodes[0].minor is None  # omitempty
    assert {h.path for h in spec.hooks()} == {HOOK}
    assert {h.hook_name for h in spec.hooks()} == {"createContainer"}
    assert spec.hooks()[2].args == ["nvidia-cdi-hook", "enable-cuda-compat",
                                    "--host-driver-version=550.54.15"]
    assert spec.container_edits.mounts[0].options == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert (spec.vendor, spec.device_class) == ("nvidia.com", "gpu")


def test_parsing_the_8gpu_spec_takes_milliseconds():
    text = TEXT["spec-8gpu.yaml"]
    parse.parse_spec(text)  # first use imports PyYAML
    start = time.perf_counter()
    for _ in range(10):
        parse.parse_spec(text)
    assert (time.perf_counter() - start) / 10 < 0.05


# --- hand-made specs: the schema's verdict and parse_spec's ----------------------------------


def _set(path, value):
    """A mutation of the 1-GPU spec: set ``doc[path...] = value`` (``...`` pops the key)."""
    def mutate(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        if value is ...:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc
    return mutate


DEV0 = ["devices", 0]
DEV0_EDITS = DEV0 + ["containerEdits"]
NODE0 = DEV0_EDITS + ["deviceNodes", 0]
SPEC_EDITS = ["containerEdits"]
HOOK0 = SPEC_EDITS + ["hooks", 0]
MOUNT0 = SPEC_EDITS + ["mounts", 0]


def _both(*mutations):
    def mutate(doc):
        for m in mutations:
            doc = m(doc)
        return doc
    return mutate


def _letter_names(doc):
    """Rename devices so that none starts with a digit and drop hostPath (pre-0.5.0 content)."""
    for d in doc["devices"]:
        if d["name"][0].isdigit():
            d["name"] = "gpu" + d["name"]
    for e in [doc["containerEdits"]] + [d["containerEdits"] for d in doc["devices"]]:
        for n in e.get("deviceNodes", []):
            n.pop("hostPath", None)
    return doc


# (id, mutation of the 1-GPU spec, does the official schema reject it, parse_spec's message)
BROKEN = [
    ("top-level-list", lambda doc: [doc], True, "not a mapping but a list"),
    ("top-level-string", lambda doc: "nvidia.com/gpu", True, 'not a mapping but string'),
    ("no-cdiVersion", _set(["cdiVersion"], ...), True, 'missing required key "cdiVersion"'),
    ("no-kind", _set(["kind"], ...), True, 'missing required key "kind"'),
    ("no-devices-key", _set(["devices"], ...), True, 'missing required key "devices"'),
    ("cdiVersion-number", _set(["cdiVersion"], 0.5), True, "cdiVersion: expected a string"),
    ("devices-mapping", _set(["devices"], {"0": {}}), True, "devices: expected a list"),
    ("device-not-mapping", _set(DEV0, "0"), True, "devices[0]: expected a mapping"),
    ("device-no-name", _set(DEV0 + ["name"], ...), True, 'devices[0]: missing required key "name"'),
    ("device-name-integer", _set(DEV0 + ["name"], 0), True,
     "devices[0].name: expected a string, got integer 0"),
    ("device-no-edits", _set(DEV0_EDITS, ...), True,
     'devices[0]: missing required key "containerEdits"'),
    ("device-edits-null", _set(DEV0_EDITS, None), True,
     "devices[0].containerEdits: expected a mapping, got null"),
    ("spec-edits-list", _set(SPEC_EDITS, []), True, "containerEdits: expected a mapping"),
    ("node-no-path", _set(NODE0 + ["path"], ...), True,
     'devices[0].containerEdits.deviceNodes[0]: missing required key "path"'),
    ("node-path-integer", _set(NODE0 + ["path"], 0), True,
     "deviceNodes[0].path: expected a string"),
    ("node-major-string", _set(NODE0 + ["major"], "195"), True,
     "deviceNodes[0].major: expected an integer"),
    ("node-uid-negative", _set(NODE0 + ["uid"], -1), True,
     "deviceNodes[0].uid: expected an integer from 0 to 4294967295, got integer -1"),
    ("node-hostPath-null", _set(NODE0 + ["hostPath"], None), True,
     "deviceNodes[0].hostPath: expected a string, got null"),
    ("mount-no-hostPath", _set(MOUNT0 + ["hostPath"], ...), True,
     'containerEdits.mounts[0]: missing required key "hostPath"'),
    ("mount-no-containerPath", _set(MOUNT0 + ["containerPath"], ...), True,
     'containerEdits.mounts[0]: missing required key "containerPath"'),
    ("mount-options-string", _set(MOUNT0 + ["options"], "ro"), True,
     "mounts[0].options: expected a list"),
    ("hook-no-hookName", _set(HOOK0 + ["hookName"], ...), True,
     'containerEdits.hooks[0]: missing required key "hookName"'),
    ("hook-no-path", _set(HOOK0 + ["path"], ...), True,
     'containerEdits.hooks[0]: missing required key "path"'),
    ("hook-arg-integer", _set(HOOK0 + ["args", 1], 7), True, "hooks[0].args[1]: expected a string"),
    ("hook-timeout-negative", _set(HOOK0 + ["timeout"], -5), True,
     "hooks[0].timeout: expected an integer from 0"),
    ("env-not-list", _set(SPEC_EDITS + ["env"], "A=1"), True,
     "containerEdits.env: expected a list"),
    ("annotation-not-string", _both(_set(["cdiVersion"], "0.6.0"), _set(["annotations"], {"a": 1})),
     True, "annotations.a: expected a string, got integer 1"),
    ("netDevice-no-name",
     _both(_set(["cdiVersion"], "1.1.0"),
           _set(DEV0_EDITS + ["netDevices"], [{"hostInterfaceName": "eth1"}])),
     True, 'netDevices[0]: missing required key "name"'),
    ("additionalGids-negative",
     _both(_set(["cdiVersion"], "0.7.0"), _set(SPEC_EDITS + ["additionalGids"], [-1])),
     True, "additionalGids[0]: expected an integer from 0"),
    ("intelRdt-enableMonitoring-string",
     _both(_set(["cdiVersion"], "1.1.0"),
           _set(SPEC_EDITS + ["intelRdt"], {"enableMonitoring": "yes"})),
     True, "intelRdt.enableMonitoring: expected true or false"),
    # The schema accepts these; the CDI package's rules (and so parse_spec) do not.
    ("cdiVersion-unknown", _set(["cdiVersion"], "0.9.0"), False,
     'cdiVersion "0.9.0" is not a CDI version (known: 0.3.0 to 1.1.0)'),
    ("cdiVersion-below-floor", _set(["cdiVersion"], "0.2.0"), False,
     "cdiVersion 0.2.0 is below 0.3.0"),
    ("cdiVersion-0.4.0-with-hostPath",
     _both(_set(["cdiVersion"], "0.4.0"), _set(DEV0 + ["name"], "gpu0")),
     False, 'cdiVersion 0.4.0 is below 0.5.0, which deviceNode hostPath in device "gpu0" needs'),
    ("annotations-under-0.6.0", _set(["annotations"], {"a": "b"}), False,
     "cdiVersion 0.5.0 is below 0.6.0, which spec annotations needs"),
    ("dot-in-class-under-0.6.0", _set(["kind"], "nvidia.com/gpu.x"), False,
     'cdiVersion 0.5.0 is below 0.6.0, which class "gpu.x" (contains ".") needs'),
    ("intelRdt-under-0.7.0", _set(SPEC_EDITS + ["intelRdt"], {"closID": "x"}), False,
     "below 0.7.0, which intelRdt in the spec's containerEdits needs"),
    ("netDevices-under-1.1.0",
     _both(_set(["cdiVersion"], "1.0.0"),
           _set(DEV0_EDITS + ["netDevices"], [{"hostInterfaceName": "eth1", "name": "eth1"}])),
     False, 'cdiVersion 1.0.0 is below 1.1.0, which netDevices in device "0" needs'),
    ("kind-without-class", _set(["kind"], "nvidia.com"), False,
     'kind "nvidia.com" is not <vendor>/<class>'),
    ("kind-bad-class-character", _set(["kind"], "nvidia.com/g!pu"), False,
     'kind "nvidia.com/g!pu" has an invalid class "g!pu": character "!" is not allowed'),
    ("kind-vendor-starts-with-digit", _set(["kind"], "1nvidia.com/gpu"), False,
     'invalid vendor "1nvidia.com": it must start with a letter'),
    ("duplicate-device-name", _set(["devices", 1, "name"], "0"), False,
     'device name "0" is defined twice (devices[0] and devices[1])'),
    ("no-devices", _set(["devices"], []), False, "no devices"),
    ("device-name-space", _set(DEV0 + ["name"], "gpu 0"), False,
     'device name "gpu 0" is invalid: character " " is not allowed'),
    ("device-name-trailing-dash", _set(DEV0 + ["name"], "gpu-"), False,
     'device name "gpu-" is invalid: it must end with a letter or digit'),
    ("device-name-leading-underscore", _set(DEV0 + ["name"], "_gpu"), False,
     'device name "_gpu" is invalid: it must start with a letter or digit'),
    ("device-name-empty", _set(DEV0 + ["name"], ""), False,
     'device name "" is invalid: it is empty'),
    ("device-empty-edits", _set(DEV0_EDITS, {}), False, 'device "0" has empty containerEdits'),
    ("env-without-equals", _set(SPEC_EDITS + ["env", 0], "NVIDIA_VISIBLE_DEVICES"), False,
     'containerEdits.env[0]: "NVIDIA_VISIBLE_DEVICES" is not NAME=VALUE'),
    ("hook-name-unknown", _set(HOOK0 + ["hookName"], "preStart"), False,
     'containerEdits.hooks[0]: invalid hookName "preStart"'),
    ("hook-path-empty", _set(HOOK0 + ["path"], ""), False, "containerEdits.hooks[0]: empty path"),
    ("hook-env-without-equals", _set(HOOK0 + ["env"], ["=x"]), False,
     'hooks[0].env[0]: "=x" is not NAME=VALUE'),
    ("mount-hostPath-empty", _set(MOUNT0 + ["hostPath"], ""), False, "mounts[0]: empty hostPath"),
    ("node-type-unknown", _set(NODE0 + ["type"], "x"), False, 'invalid type "x"'),
    ("node-permissions-unknown", _set(NODE0 + ["permissions"], "rwx"), False,
     'invalid permissions "rwx"'),
    ("node-major-negative", _set(NODE0 + ["major"], -1), False, "negative device number -1:0"),
    ("node-path-empty", _set(NODE0 + ["path"], ""), False, "deviceNodes[0]: empty device path"),
    ("intelRdt-closID-path",
     _both(_set(["cdiVersion"], "0.7.0"), _set(SPEC_EDITS + ["intelRdt"], {"closID": "a/b"})),
     False, 'invalid closID "a/b"'),
]


@pytest.mark.parametrize("make, schema_verdict, expected",
                         [pytest.param(m, v, e, id=i) for i, m, v, e in BROKEN])
def test_parse_spec_rejects_what_the_schema_rejects_and_the_cdi_rules_on_top(
        make, schema_verdict, expected, schema):
    doc = make(base_doc())

    assert schema_rejects(schema, doc) is schema_verdict
    assert expected in rejection(dump(doc))


# (id, mutation, parse_spec's cdiVersion) for specs that both the schema and the CDI rules accept
VALID = [
    ("leading-v", _set(["cdiVersion"], "v0.5.0")),
    ("no-spec-level-edits", _both(_set(SPEC_EDITS, ...))),
    ("pre-0.5.0-content-at-0.3.0", _both(_letter_names, _set(["cdiVersion"], "0.3.0"))),
    ("mount-type-at-0.4.0",
     _both(_letter_names, _set(["cdiVersion"], "0.4.0"), _set(MOUNT0 + ["type"], "bind"))),
    ("annotations-at-0.6.0",
     _both(_set(["cdiVersion"], "0.6.0"), _set(["annotations"], {"a": "b"}),
           _set(DEV0 + ["annotations"], {"c": "d"}))),
    ("netDevices-at-1.1.0",
     _both(_set(["cdiVersion"], "1.1.0"),
           _set(DEV0_EDITS + ["netDevices"], [{"hostInterfaceName": "eth1", "name": "net1"}]))),
    ("unknown-keys-kept", _both(_set(["x-extra"], {"k": 1}), _set(NODE0 + ["x-node"], True))),
    ("permissions-none", _set(NODE0 + ["permissions"], "none")),
    ("name-with-colon-and-dot", _set(DEV0 + ["name"], "0:mig.1")),
    ("single-letter-vendor-and-class", _set(["kind"], "n/g")),
]


@pytest.mark.parametrize("make", [pytest.param(m, id=i) for i, m in VALID])
def test_specs_valid_under_schema_and_cdi_rules_parse(make, schema):
    doc = make(base_doc())

    assert not schema_rejects(schema, doc)
    assert parse.parse_spec(dump(doc)).raw == doc


def test_unknown_keys_are_kept_in_the_model():
    doc = _both(_set(["x-extra"], {"k": 1}), _set(NODE0 + ["x-node"], True))(base_doc())
    spec = parse.parse_spec(json.dumps(doc))

    assert spec.extra == {"x-extra": {"k": 1}}
    assert spec.devices[0].container_edits.device_nodes[0].extra == {"x-node": True}


# --- text that is not a spec at all ----------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("cdiVersion: 0.5.0\ndevices: [\n", "not YAML or JSON:"),
    ('{"cdiVersion": "0.5.0",', "not YAML or JSON:"),
    ("a: 1\n---\nb: 2\n", "not YAML or JSON: expected a single document"),
    (b"cdiVersion: \xff\n", "not UTF-8 text"),
    ("", "not a mapping but null"),
    ("- a\n- b\n", "not a mapping but a list"),
], ids=["yaml-syntax", "json-truncated", "two-documents", "not-utf8", "empty", "list"])
def test_text_that_is_not_a_spec_is_rejected_on_one_line(text, expected):
    assert expected in rejection(text)


def test_duplicate_yaml_key_is_rejected_not_silently_overwritten():
    text = TEXT["spec-1gpu.yaml"].replace("kind: nvidia.com/gpu\n",
                                          "kind: nvidia.com/gpu\nkind: x/y\n", 1)

    assert 'duplicate key "kind"' in rejection(text)


def test_duplicate_json_key_is_rejected():
    assert 'duplicate key "kind"' in rejection('{"kind": "a/b", "kind": "c/d"}')


def test_yaml_merge_keys_are_not_mistaken_for_duplicates():
    text = ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"
            "x-node: &node {path: /dev/nvidia0, major: 195}\n"
            "devices:\n- name: all\n  containerEdits:\n    deviceNodes:\n"
            "    - <<: *node\n      path: /dev/nvidia1\n")

    node = parse.parse_spec(text).device_nodes()[0]
    assert (node.path, node.major) == ("/dev/nvidia1", 195)


# --- the minimum cdiVersion (specs-go/version.go) --------------------------------------------


@pytest.mark.parametrize("make, expected", [
    (_letter_names, "0.3.0"),
    (_both(_letter_names, _set(MOUNT0 + ["type"], "bind")), "0.4.0"),
    (_both(_letter_names, _set(MOUNT0 + ["type"], "")), "0.3.0"),
    (lambda d: d, "0.5.0"),
    (_both(_letter_names, _set(NODE0 + ["hostPath"], "/dev/nvidia0")), "0.5.0"),
    (_set(DEV0 + ["annotations"], {"k": "v"}), "0.6.0"),
    (_set(DEV0 + ["annotations"], {}), "0.5.0"),
    (_set(["kind"], "nvidia.com/gpu.x"), "0.6.0"),
    (_set(DEV0_EDITS + ["additionalGids"], [5]), "0.7.0"),
    (_set(SPEC_EDITS + ["intelRdt"], {}), "0.7.0"),
    (_set(SPEC_EDITS + ["intelRdt"], {"schemata": []}), "1.1.0"),
    (_set(DEV0_EDITS + ["intelRdt"], {"enableMonitoring": True}), "1.1.0"),
    (_set(DEV0_EDITS + ["intelRdt"], {"enableMonitoring": False}), "0.7.0"),
    (_set(SPEC_EDITS + ["netDevices"], [{"hostInterfaceName": "a", "name": "b"}]), "1.1.0"),
], ids=["floor", "mount-type", "empty-mount-type", "numeric-name", "hostPath", "device-annotations",
        "empty-annotations", "dot-in-class", "additionalGids", "intelRdt", "intelRdt-schemata",
        "intelRdt-enableMonitoring", "intelRdt-monitoring-off", "netDevices"])
def test_minimum_version_follows_the_cdi_library_rules(make, expected):
    version, feature = rules.minimum_version(make(base_doc()))

    assert version == expected
    assert feature and "\n" not in feature


def test_minimum_version_names_the_numeric_device_name():
    assert rules.minimum_version(base_doc()) == ("0.5.0", 'device name "0" (starts with a digit)')


def test_c14_spec_declaring_0_4_0_with_device_0_fails_naming_the_version():
    message = rejection(C14_SPEC, source="nvidia-ctk cdi generate")

    assert message == ('nvidia-ctk cdi generate: cdiVersion 0.4.0 is below 0.5.0, '
                       'which device name "0" (starts with a digit) needs')


# --- the ready-boot rules: real nodes in a temporary root ------------------------------------

CONTROL = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254),
           "nvidia-uvm": (510, 0), "nvidia-uvm-tools": (510, 1)}


@pytest.fixture
def make_root(tmp_path):
    """A root like the fixtures' (README: nodes made with mknod -m 0666), and the hook.

    Call with ``gpus=N`` (nodes ``nvidia0..N-1`` 195:i), ``nodes={name: (major, minor) | None}``
    to change or leave out nodes, ``hook_mode`` (None: no hook).
    """
    def make(gpus=1, nodes=None, hook_mode=0o755, name="root"):
        root = tmp_path / name
        (root / "dev").mkdir(parents=True)
        wanted = dict(CONTROL) | {f"nvidia{i}": (195, i) for i in range(gpus)} | (nodes or {})
        for node, numbers in wanted.items():
            if numbers is None:
                continue
            try:
                os.mknod(root / "dev" / node, stat.S_IFCHR | 0o666, os.makedev(*numbers))
            except PermissionError as err:
                assert err.errno == errno.EPERM
                pytest.skip("making character devices needs root (CAP_MKNOD)")
        if hook_mode is not None:
            hook = root / HOOK.lstrip("/")
            hook.parent.mkdir(parents=True)
            hook.write_text("#!/bin/sh\nexit 0\n")
            hook.chmod(hook_mode)
        return root
    return make


@pytest.mark.parametrize("name, gpus", [("spec-1gpu.yaml", 1), ("spec-2gpu.yaml", 2),
                                        ("spec-8gpu.yaml", 8)])
def test_generated_spec_is_ready_when_nodes_and_hook_exist_under_the_root(name, gpus, make_root):
    root = make_root(gpus=gpus)
    spec = parse.parse_spec(with_dev_root(TEXT[name], root))

    assert ready.check_ready_spec(spec, Root(root), list(range(gpus))) == []


def test_gpu_minors_may_be_given_by_pci_address(make_root):
    root = make_root(gpus=2)
    spec = parse.parse_spec(with_dev_root(TEXT["spec-2gpu.yaml"], root))

    assert ready.check_ready_spec(spec, Root(root), {"0000:00:04.0": 0, "0000:00:05.0": 1}) == []


def test_spec_without_a_gpus_node_is_reported_with_the_pci_address(make_root):
    root = make_root(gpus=1)
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu.yaml"], root))

    problems = ready.check_ready_spec(spec, Root(root), {"0000:00:04.0": 0, "0000:00:05.0": 3})
    assert problems == ['missing device "1"',
                        "device node /dev/nvidia3 missing from the spec (GPU 0000:00:05.0)"]


def test_node_with_the_wrong_minor_fails(make_root):
    root = make_root(gpus=0, nodes={"nvidia0": (195, 3)})
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu.yaml"], root))

    assert ready.check_ready_spec(spec, Root(root), [0]) == [
        "device node /dev/nvidia0: spec says 195:0, node is 195:3"]


def test_uvm_node_with_another_major_than_the_spec_fails(make_root):
    root = make_root(nodes={"nvidia-uvm": (511, 0), "nvidia-uvm-tools": (511, 1)})
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu.yaml"], root))

    assert ready.check_ready_spec(spec, Root(root), [0]) == [
        "device node /dev/nvidia-uvm: spec says 510:0, node is 511:0",
        "device node /dev/nvidia-uvm-tools: spec says 510:1, node is 511:1"]


def test_regular_file_in_place_of_a_node_fails(make_root):
    root = make_root(nodes={"nvidiactl": None})
    (root / "dev" / "nvidiactl").write_text("")
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu.yaml"], root))

    [problem] = ready.check_ready_spec(spec, Root(root), [0])
    assert problem.startswith(f"device node /dev/nvidiactl: hostPath {root}/dev/nvidiactl "
                              f"is not a character device (a regular file")


def test_spec_without_uvm_nodes_fails_naming_nvidia_uvm(make_root):
    root = make_root()
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu-no-uvm.yaml"], root))

    assert ready.check_ready_spec(spec, Root(root), [0]) == [
        "device node /dev/nvidia-uvm missing from the spec",
        "device node /dev/nvidia-uvm-tools missing from the spec"]


def test_spec_with_hook_missing_from_the_root_fails_naming_nvidia_cdi_hook(make_root):
    root = make_root(hook_mode=None)
    spec = parse.parse_spec(with_dev_root(TEXT["spec-1gpu-bad-hook.yaml"], root))

    assert ready.check_ready_spec(spec, Root(root), [0]) == [
        "hook /usr/bin/nvidia-cdi-hook does not exist under the root"]


def test_c15_spec_without_all_fails_naming_all_and_takes_paths_under_the_root(make_root):
    root = make_root()
    spec = parse.parse_spec(C15_SPEC)

    assert ready.check_ready_spec(spec, Root(root), [0]) == ['missing device "all"']


def test_devroot_spec_hostpath_is_checked_as_written_not_under_the_root(make_root):
    dev_root = make_root(name="devroot")
    empty_root = make_root(gpus=0, nodes={n: None for n in CONTROL}, name="empty")
    spec = parse.parse_spec(TEXT["spec-1gpu-devroot.yaml"].replace("/ROOT/", f"{dev_root}/"))

    # The --root given to boot has no nodes at all: only the hostPaths are looked at.
    assert ready.check_ready_spec(spec, Root(empty_root), [0]) == []


def test_devroot_spec_with_placeholder_root_names_the_hostpath(make_root):
    root = make_root()
    spec = parse.parse_spec(TEXT["spec-1gpu-devroot.yaml"])

    problems = ready.check_ready_spec(spec, Root(root), [0])
    # The nodes exist under the root, but hostPath is not joined to it.
    assert ("device node /dev/nvidia0: hostPath /ROOT/dev/nvidia0 is not a character device "
            "(missing)") in problems
    assert len(problems) == 5  # nvidia0, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, nvidiactl


# --- the ready-boot rules without device nodes: pyfakefs -------------------------------------


def test_kind_other_than_nvidia_gpu_is_not_ready(fs):
    spec = parse.parse_spec(C15_SPEC.replace("nvidia.com/gpu", "example.com/gpu"))

    problems = ready.check_ready_spec(spec, Root("/r"), [0])
    assert problems[0] == 'kind is "example.com/gpu", not "nvidia.com/gpu"'


def test_missing_devices_come_first_then_missing_nodes(fs):
    spec = parse.parse_spec(TEXT["spec-1gpu-no-uvm.yaml"].replace('name: "0"', "name: gpu0"))

    problems = ready.check_ready_spec(spec, Root("/r"), [0, 1])
    assert problems[:5] == ['missing device "0"', 'missing device "1"',
                            "device node /dev/nvidia-uvm missing from the spec",
                            "device node /dev/nvidia-uvm-tools missing from the spec",
                            "device node /dev/nvidia1 missing from the spec"]


def test_path_without_hostpath_is_looked_up_under_the_root(fs):
    fs.create_file("/r/dev/nvidia0")  # a plain file: pyfakefs cannot make character devices
    spec = parse.parse_spec(C15_SPEC)

    problems = ready.check_ready_spec(spec, Root("/r"), [0])
    assert ("device node /dev/nvidia0: not a character device under the root "
            "(a regular file, mode 0644)") in problems
    assert "device node /dev/nvidiactl: not a character device under the root (missing)" in problems


def test_hook_that_is_not_executable_fails(fs):
    fs.create_file("/r/usr/bin/nvidia-cdi-hook", contents="#!/bin/sh\n",
                   st_mode=stat.S_IFREG | 0o644)
    spec = parse.parse_spec(TEXT["spec-1gpu.yaml"])

    problems = ready.check_ready_spec(spec, Root("/r"), [0])
    assert "hook /usr/bin/nvidia-cdi-hook is not executable (a regular file, mode 0644)" in problems


def test_hook_is_found_through_an_absolute_symlink_inside_the_root(fs):
    fs.create_file("/r/opt/nvidia/nvidia-cdi-hook", contents="#!/bin/sh\n",
                   st_mode=stat.S_IFREG | 0o755)
    fs.create_symlink("/r/usr/bin/nvidia-cdi-hook", "/opt/nvidia/nvidia-cdi-hook")
    spec = parse.parse_spec(TEXT["spec-1gpu.yaml"])

    problems = ready.check_ready_spec(spec, Root("/r"), [0])
    assert not [p for p in problems if p.startswith("hook")]


def test_shared_nodes_and_hooks_are_reported_once(fs):
    spec = parse.parse_spec(TEXT["spec-1gpu.yaml"])

    problems = ready.check_ready_spec(spec, Root("/r"), [0])
    assert len(problems) == len(set(problems))
    assert sum(p.startswith("device node /dev/nvidia0:") for p in problems) == 1
    assert sum(p.startswith("hook ") for p in problems) == 1


# --- writing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED)
def test_rendered_spec_parses_back_to_the_same_document(name):
    raw = parse.parse_spec(TEXT[name]).raw
    text = model.render_spec_yaml(raw)

    assert parse.parse_spec(text).raw == raw
    assert list(yaml.safe_load(text)) == list(raw)  # key order kept
    assert model.render_spec_yaml(copy.deepcopy(raw)) == text
