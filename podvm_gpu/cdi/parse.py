"""Reading a CDI spec: strict YAML or JSON, then :mod:`podvm_gpu.cdi.rules`, then the model
(contract section 8).

``nvidia-ctk cdi generate`` exits 0 for specs that kata-agent cannot use, so boot judges the
spec by its content: :func:`parse_spec` here (what makes a spec a CDI spec at all), then
:func:`podvm_gpu.cdi.ready.check_ready_spec` (what a ``ready`` boot needs of it).
"""

from __future__ import annotations

import functools
import json

from podvm_gpu.cdi.model import Spec, build_spec
from podvm_gpu.cdi.rules import SPEC_SHAPE, Invalid, check_rules, describe, q
from podvm_gpu.errors import CdiSpecError, one_line


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
    where = one_line(source, None)
    try:
        raw = _load(text)
        if not isinstance(raw, dict):
            raise Invalid(f"not a mapping but {describe(raw)}; a CDI spec is a YAML or JSON "
                           f"object")
        SPEC_SHAPE(raw, "")
        check_rules(raw)
    except Invalid as err:
        raise CdiSpecError(f"{where}: {err}") from None
    return build_spec(raw)


def _load(text: str | bytes) -> object:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise Invalid(f"not UTF-8 text (byte {err.start})") from None
    body = text
    while body.startswith("#"):  # comment lines before a JSON document (the unavailable spec)
        body = body.partition("\n")[2]
    if body.lstrip().startswith("{"):
        # JSON (nvidia-ctk --format=json) is read with the JSON parser: faster, and exact about
        # numbers. YAML in flow style also starts with "{", so fall back to YAML.
        try:
            return json.loads(body, object_pairs_hook=_json_object)
        except Invalid:
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
        raise Invalid(f"not YAML or JSON: {one_line(what, None)}{at}") from None
    except yaml.YAMLError as err:
        raise Invalid(f"not YAML or JSON: {one_line(err, None)}") from None


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise Invalid(f"duplicate key {q(key)} in a JSON object")
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
                            None, None, f"duplicate key {q(key_node.value)}", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader
