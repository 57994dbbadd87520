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
from contextlib import suppress

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
        import shlex

        argv = [str(a) for a in getattr(err, "argv", None) or []]
        command = shlex.join(argv) if argv else "the command"  # named (issue 47 item 15)
        return Check(name, FAIL, f"query failed: {err}",
                     f"run {command} by hand to see why it fails or hangs")
    except Exception as err:  # one broken check must not hide the others
        return broken(name, err)


def broken(name: str, err: BaseException) -> Check:
    """The ``fail`` row of a check that raised instead of answering."""
    return Check(name, FAIL, f"the check itself failed: {type(err).__name__}: {err}",
                 "report this with the output of podvm-gpu check --json")


DEFAULT_WIDTH = 100  # the table's width when stdout is not a terminal and COLUMNS is unset
# The widest table: a wider COLUMNS is taken as this. No terminal is that wide (a 4K screen at
# its smallest font holds about 800), and the hints and details, at most a few hundred
# characters each, are then on one line anyway.
MAX_WIDTH = 1000
MIN_DETAIL = 30  # the narrowest detail column: below it the table is wider than asked


def table_width() -> int:
    """The width the ``check`` table fits: ``COLUMNS`` when it is a positive whole number in
    ASCII digits (as :func:`shutil.get_terminal_size` reads it), at most :data:`MAX_WIDTH` (a
    larger one, of any number of digits, is taken as that: it asks for a wide table, and before
    it fell back to 100 columns), else the terminal's when stdout is one, else
    :data:`DEFAULT_WIDTH` (issue 35 item 3). ``sys.__stdout__`` is asked: a command's
    ``sys.stdout`` is the buffer :mod:`podvm_gpu.cli` sends at the end."""
    import os

    text = os.environ.get("COLUMNS", "").strip()
    if text.isascii() and text.isdigit() and text.strip("0"):
        # compared by its digits first: int() refuses more than 4300 of them
        digits = text.lstrip("0")
        return MAX_WIDTH if len(digits) > len(str(MAX_WIDTH)) else min(int(digits), MAX_WIDTH)
    with suppress(AttributeError, ValueError, OSError):
        fd = sys.__stdout__.fileno()
        if os.isatty(fd) and os.get_terminal_size(fd).columns > 0:
            return os.get_terminal_size(fd).columns
    return DEFAULT_WIDTH


def print_table(checks: list[Check], summary: dict[str, int], width: int | None = None) -> None:
    """The rows as a table fitted to ``width`` columns (None: :func:`table_width`), then a
    summary line, as plain text: no markup language, so a detail quoting a tool or the kernel
    (``[/...]``) prints as it is.

    Each row is ``result  check  detail``; the detail wraps within its column, and a hint
    follows on lines of its own below it, ``hint: ...``, wrapped alike, so what to do next is
    never off-screen (before issue 35 the detail column was padded to its longest entry, 195 to
    591 columns). A word longer than the column is broken. No line is wider than ``width``
    unless the detail column would be narrower than :data:`MIN_DETAIL` characters.
    """
    import textwrap

    from podvm_gpu.model import shown

    rows = [(c.result, c.name, shown(" ".join(c.detail.split())), shown(" ".join(c.hint.split())))
            for c in checks]
    widths = [max(len(r[i]) for r in [("result", "check"), *rows]) for i in range(2)]
    indent = widths[0] + 2 + widths[1] + 2
    room = max((width or table_width()) - indent, MIN_DETAIL)
    pad = " " * indent

    def wrapped(text: str, first: str) -> list[str]:
        return textwrap.wrap(text, indent + room, initial_indent=first, subsequent_indent=pad,
                             break_on_hyphens=False) or [first.rstrip()]

    out = [f"{'result'.ljust(widths[0])}  {'check'.ljust(widths[1])}  detail"]
    for result, name, detail, hint in rows:
        lead = f"{result.ljust(widths[0])}  {name.ljust(widths[1])}  "
        out += wrapped(detail, lead)
        if hint:
            out += wrapped(f"hint: {hint}", pad)
    verdict = "FAILED" if summary[FAIL] else "OK"
    out.append(f"{verdict}: {summary[PASS]} pass, {summary[WARN]} warn, {summary[FAIL]} fail, "
               f"{summary[SKIP]} skip")
    sys.stdout.write("\n".join(out) + "\n")
