"""One row of ``podvm-gpu check`` (contract sections 5 and 6): below both the steps, whose rooms
own their rows, and :mod:`podvm_gpu.check`, which runs and prints them; so neither imports the
other's way up (docs/design.md, "Layers").
"""

from __future__ import annotations

from podvm_gpu.record import REQUIRED, Record

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
NO_GPU = "no NVIDIA GPU found on PCI"


class Check(Record):
    """One check's outcome: ``name``, ``result`` (pass/warn/fail/skip), ``detail`` (the fact
    found) and ``hint`` (what to do); ``to_dict`` is the ``--json`` row."""

    FIELDS = (("name", REQUIRED), ("result", REQUIRED), ("detail", REQUIRED), ("hint", ""))
