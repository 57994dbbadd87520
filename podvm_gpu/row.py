"""One row of ``podvm-gpu check`` (contract sections 5 and 6): below both the steps, whose rooms
own their rows, and :mod:`podvm_gpu.check`, which runs and prints them; so neither imports the
other's way up (docs/design.md, "Layers").
"""

from __future__ import annotations

from podvm_gpu.record import REQUIRED, Record

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
NO_GPU = "no NVIDIA GPU found on PCI"
DOC_DIR = "share/doc/podvm-gpu"  # under the install prefix: pyproject.toml's data-files


def doc_ref(name: str, section: str) -> str:
    """Where a hint's reader finds ``section`` of the project's document ``name``
    (``operating.md``): the copy installed with the program (``<sys.prefix>/share/doc/podvm-gpu/``,
    pyproject.toml's ``data-files``: ``/opt/podvm-gpu/share/doc/podvm-gpu/`` in an image), else a
    source checkout's ``docs/`` (an editable install), else the name alone. A hint once cited
    ``docs/operating.md``, which an installed program does not have (issue 35 item 10)."""
    import os
    import sys

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (os.path.join(sys.prefix, DOC_DIR, name), os.path.join(here, "docs", name)):
        if os.path.isfile(path):
            return f"{path}, \"{section}\""
    return f"podvm-gpu's {name}, \"{section}\""


class Check(Record):
    """One check's outcome: ``name``, ``result`` (pass/warn/fail/skip), ``detail`` (the fact
    found) and ``hint`` (what to do); ``to_dict`` is the ``--json`` row."""

    FIELDS = (("name", REQUIRED), ("result", REQUIRED), ("detail", REQUIRED), ("hint", ""))
