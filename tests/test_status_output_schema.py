"""``status --json`` has a schema of its own output (issue 29 item 27): the file's document,
``{"state": null}`` and ``{"state": null, "error": ...}`` (docs/interface.md 1.4), while
docs/status.schema.json, the file's, stays strict and takes neither null form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from schemas import STATUS_OUTPUT_SCHEMA, STATUS_SCHEMA, problems

REPO = Path(__file__).resolve().parents[1]


def status_json(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "podvm_gpu", "status", "--json", "--root",
                           str(root)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(done.stdout)


def booted(root: Path) -> None:
    subprocess.run([sys.executable, "-m", "podvm_gpu", "boot", "--root", str(root)],
                   capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


def garbled(root: Path) -> None:
    (root / "run/podvm-gpu").mkdir(parents=True)
    (root / "run/podvm-gpu/status.json").write_text('{"state": "ready", "steps": 5')


@pytest.mark.parametrize("setup, form", [(booted, "document"), (None, "none yet"),
                                         (garbled, "unreadable")])
def test_every_form_status_json_prints_has_the_output_schema(tmp_path, setup, form):
    if setup:
        setup(tmp_path)
    doc = status_json(tmp_path)
    assert problems(doc, STATUS_OUTPUT_SCHEMA) == [], doc
    if form == "document":
        assert problems(doc, STATUS_SCHEMA) == []
    else:
        assert doc["state"] is None and problems(doc, STATUS_SCHEMA) != []


@pytest.mark.parametrize("doc", [{"state": None, "error": 5}, {"state": None, "extra": 1},
                                 {"state": None, "error": "other"}, {"state": "ready"}, {}])
def test_the_output_schema_takes_nothing_else(doc):
    assert problems(doc, STATUS_OUTPUT_SCHEMA) != []
