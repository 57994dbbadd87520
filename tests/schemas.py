"""The interface schemas in docs/ (docs/interface.md): ``status.schema.json`` for
/run/podvm-gpu/status.json and ``check.schema.json`` for ``podvm-gpu check [--image] --json``,
for every test that reads such a document from a real run."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from jsonschema import Draft202012Validator

DOCS = Path(__file__).resolve().parents[1] / "docs"
STATUS_SCHEMA = "status.schema.json"
CHECK_SCHEMA = "check.schema.json"
STATUS_OUTPUT_SCHEMA = "status-output.schema.json"  # status --json's output


@functools.cache
def schema(name: str) -> dict:
    """The schema ``docs/<name>``, checked against the draft 2020-12 meta-schema."""
    doc = json.loads((DOCS / name).read_text())
    Draft202012Validator.check_schema(doc)
    return doc


def problems(doc: object, name: str = STATUS_SCHEMA) -> list[str]:
    """Where ``doc`` breaks the schema ``docs/<name>``, one line each (empty: it conforms); a
    ``$ref`` to another schema of docs/ by its file name is resolved there."""
    from referencing import Registry, Resource

    registry = Registry().with_resources(
        (path.name, Resource.from_contents(schema(path.name)))
        for path in DOCS.glob("*.schema.json"))
    validator = Draft202012Validator(schema(name), registry=registry)
    found = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
    return sorted(found)


def assert_status_conforms(doc: object) -> None:
    """Fail naming every place where ``doc`` breaks docs/status.schema.json."""
    found = problems(doc, STATUS_SCHEMA)
    assert not found, f"status.json breaks docs/{STATUS_SCHEMA}: {found}\n{json.dumps(doc, indent=1)}"


def assert_check_conforms(doc: object) -> None:
    """Fail naming every place where ``doc`` breaks docs/check.schema.json."""
    found = problems(doc, CHECK_SCHEMA)
    assert not found, f"check --json breaks docs/{CHECK_SCHEMA}: {found}"
