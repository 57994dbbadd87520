"""``podvm-gpu check``: the read-only diagnosis engineers run on a GPU VM (contract section 5), and
``check --image`` for image builds (contract section 6).

Every check reports ``pass``, ``warn``, ``fail`` or ``skip`` with a detail line stating the fact
found and, on ``warn``/``fail``, a hint saying what to do next. It reuses boot's readers and
validators and never loads a module, starts a daemon or writes a file: the runner is read-only
(it refuses to spawn) and the only commands run are queries with timeouts (``nvidia-smi``
queries, the row remapper's among them, ``nv-fabricmanager --version``, ``modinfo -F
version|firmware FILE`` and, on the root ``/``, ``modprobe -S <release> --show-depends
<module>``, which prints what it would load).

Rooms: each boot step's module under :mod:`podvm_gpu.steps` owns its rows (``VM_ROWS``, and
``IMAGE_ROWS`` where an image can be judged), beside its ``run``; :mod:`~podvm_gpu.check.vm`
and :mod:`~podvm_gpu.check.image` run them in the step order with the rows that belong to no
step (:mod:`~podvm_gpu.check.units`, the status, the image's own rows);
:mod:`~podvm_gpu.check.command` is the command. Here: the row's isolation and the table; the
row itself is :mod:`podvm_gpu.row`, below both the steps and check (the steps import it).
"""

from __future__ import annotations

import sys

from podvm_gpu.errors import CommandError
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, WARN, Check

__all__ = ["FAIL", "NO_GPU", "PASS", "SKIP", "WARN", "Check", "broken", "isolated", "print_table",
           "safely"]


def safely(fact, default):
    """A fact for several checks, or ``default`` when reading it fails (each check that needs
    it then reports what it finds)."""
    try:
        return fact()
    except (OSError, ValueError, RecursionError):
        return default


def isolated(name: str, check) -> Check:
    """Run one check; a query that failed or any error becomes a ``fail`` row naming it."""
    try:
        return check()
    except CommandError as err:
        return Check(name, FAIL, f"query failed: {err}",
                     "run the command by hand to see why it fails or hangs")
    except Exception as err:  # one broken check must not hide the others
        return broken(name, err)


def broken(name: str, err: BaseException) -> Check:
    """The ``fail`` row of a check that raised instead of answering."""
    return Check(name, FAIL, f"the check itself failed: {type(err).__name__}: {err}",
                 "report this with the output of podvm-gpu check --json")


def print_table(checks: list[Check], summary: dict[str, int]) -> None:
    """An aligned table (result, check, detail, hint) and a summary line, as plain text: no
    markup language, so a detail quoting a tool or the kernel (``[/...]``) prints as it is."""
    from podvm_gpu.status import shown

    rows = [("result", "check", "detail", "hint")]
    rows += [(c.result, c.name, shown(" ".join(c.detail.split())), shown(" ".join(c.hint.split())))
             for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
        out.append("  ".join(cells).rstrip())
    verdict = "FAILED" if summary[FAIL] else "OK"
    out.append(f"{verdict}: {summary[PASS]} pass, {summary[WARN]} warn, {summary[FAIL]} fail, "
               f"{summary[SKIP]} skip")
    sys.stdout.write("\n".join(out) + "\n")
