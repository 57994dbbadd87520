"""The GPUs' memory health and recovery action, asked and judged once (issues 28, 33, 44): the
boot's health gate (steps/cdi/health.py), check's ``row-remapper``, ``memory-errors`` and
``recovery-action`` rows and the watcher's poll map what :func:`judge_remapper`,
:func:`judge_ecc` and :func:`read_recovery` return: a list of
:class:`~podvm_gpu.gpufacts.finding.Finding`, in the order the GPUs answered.

Kinds (``Finding.kind``): ``read`` (a GPU's values as read, level ok), ``not-offered`` (a
GPU without a remapper or ECC counters, an nvidia-smi that does not know a field; level ok),
``unread-value`` (a value the judge cannot read as one; warn), ``unread`` (a query or a recovery
value not read; warn), ``note`` (a recovery action that asks for something else than a reset:
Drain P2P, Recover IMEX Domain; warn), ``lost`` (fail, replace), ``requires-reset``,
``remap-pending``, ``ecc-volatile``, ``retirement-pending``, ``reset-required``,
``drain-and-reset`` (a reset needed: gpufacts/finding.py ``reset_needed``), ``remap-failed``
(fail, replace) and ``recovery-action`` (by the action's kind, gpufacts/judge.py ``ACTIONS``).

Only a value actually read fails: a query that is not answered (not supported, a tool too old,
a timeout, a field it does not know) is a warning. The queries' rules and what the real
programs print are in steps/cdi/health.py's and steps/cdi/recovery.py's docstrings.
"""

from __future__ import annotations

from podvm_gpu.errors import CommandError
from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.gpufacts.finding import FAIL, OK, REPLACE, WARN, Finding, finding, reset_needed

_na, _flag = words.na, smi.flag


class Broken(Exception):
    """nvidia-smi's answer says a GPU or the driver cannot answer (a lost GPU; an exit status of
    words.NVSMI_BROKEN): the message names it, ``gpu`` the GPU its output names (or None).
    Never an "unread" warning."""

    def __init__(self, said: str, output: str = ""):
        super().__init__(said)
        gpus = judge.buses_in([output])
        self.gpu = gpus[0] if gpus else None


def ask(runner, argv: list[str], width: int, timeout: float,
        parse=None) -> tuple[list[list[str]] | None, str]:
    """Run one health query with ``runner``: ``(rows, "")``, or ``(None, why it is unread)``
    (the boot gate, ``check`` and the watcher judge the same answer). ``parse(stdout)`` reads
    the rows (default: ``width`` values each, words.csv_rows).

    Raises:
        Broken: the exit status says a GPU is lost or the driver cannot answer.
    """
    try:
        done = runner.run(argv, check=False, timeout=timeout)
    except CommandError as err:
        return None, str(err)
    return answered(argv, width, done, parse)


def answered(argv: list[str], width: int, done, parse=None) -> tuple[list[list[str]] | None, str]:
    """:func:`ask`'s reading of a finished call ``done`` (``returncode``, ``stdout``,
    ``output``), the same whether it was run now or side by side before.

    Raises:
        Broken: the exit status says a GPU is lost or the driver cannot answer.
    """
    broken = words.broken(done.returncode, done.output)
    if broken:
        raise Broken(broken, done.output)
    if parse is None:
        rows = words.csv_rows(done.stdout, width) if done.returncode == 0 else None
    else:
        rows = parse(done.stdout) if done.returncode == 0 else None
    if rows is None:
        return None, words.failed_call(argv, done.returncode, done.output)
    return rows, ""


def _read(bus: str, what: str, kind: str = "read") -> Finding:
    return finding(OK, what, gpu=bus, kind=kind)


def judge_lost(rows: list[list[str]], reset_pending_warns: bool,
               out: list[Finding]) -> list[list[str]]:
    """Rows of ``[GPU is lost]`` (fail, replace: by their place in NVML's list) and of ``[GPU
    requires reset]`` (the recovery action GPU Reset: gpufacts/judge.py) into ``out``; the
    others returned."""
    kept = []
    for n, row in enumerate(rows):
        if any(v.strip() == words.GPU_LOST for v in row):
            out.append(finding(FAIL, f"GPU #{n} of NVML's list is lost (nvidia-smi printed "
                                     f"{words.GPU_LOST}): it fell off the bus or needs a reset",
                               action=REPLACE, kind="lost"))
        elif any(v.strip() == words.GPU_REQUIRES_RESET for v in row):
            bus = row[0].strip()
            out.append(reset_needed(f"GPU {bus}: GPU reset needed (nvidia-smi printed "
                                    f"{words.GPU_REQUIRES_RESET}: the recovery action GPU Reset)",
                                    bus, reset_pending_warns, kind="requires-reset"))
        else:
            kept.append(row)
    return kept


def judge_remapper(rows: list[list[str]], reset_pending_warns: bool) -> list[Finding]:
    """Rows of smi.REMAP_FIELDS judged: ``1``/``0`` as the real program prints them
    (``Yes``/``No`` as ``-q`` and field reports do); ``[N/A]``: no remapper; ``[GPU is lost]``:
    fail; another value is ``unread-value``.

    Args:
        rows: ``[bus, pending, failure]`` each; reset_pending_warns: the config's
            ``health.reset_pending_warns``.
    """
    out: list[Finding] = []
    for bus, pending, failure in judge_lost(rows, reset_pending_warns, out):
        if _na(pending) and _na(failure):
            out.append(_read(bus, f"{bus} remapper N/A", "not-offered"))
            continue
        failed, waiting = _flag(failure), _flag(pending)
        if failed is None or waiting is None:
            out.append(finding(WARN, f"GPU {bus}: remapper answered pending {pending!r}, failure "
                                     f"{failure!r}", gpu=bus, kind="unread-value"))
        if judge.memory_kind(failed, waiting, None, None) == judge.FATAL:  # the one decision
            out.append(finding(FAIL, f"GPU {bus}: row remapping failed (remapped_rows.failure "
                                     f"{failure}): the GPU's memory cannot be repaired, the GPU "
                                     "needs replacing", action=REPLACE, gpu=bus,
                               kind="remap-failed"))
        if waiting:  # also beside a failure: both are said
            out.append(reset_needed(f"GPU {bus}: a row remap is pending (remapped_rows.pending "
                                    f"{pending}): GPU reset needed", bus, reset_pending_warns,
                                    kind="remap-pending"))
        out.append(_read(bus, f"{bus} remap pending {pending}, failure {failure}"))
    return out


def judge_ecc(rows: list[list[str]], reset_pending_warns: bool) -> list[Finding]:
    """Rows of smi.ECC_FIELDS judged: a count of ASCII digits, a ``Yes``/``No`` (``1``/``0``)
    pending retirement; ``[N/A]``: no counter (ECC off, or a GPU without it); another value is
    ``unread-value``, as :func:`judge_remapper` says it (a garbled count was passed as none).

    Args:
        rows: ``[bus, volatile uncorrectable count, retirement pending]`` each;
            reset_pending_warns: the config's ``health.reset_pending_warns``.
    """
    out: list[Finding] = []
    for bus, volatile, retire in judge_lost(rows, reset_pending_warns, out):
        if _na(volatile) and _na(retire):
            out.append(_read(bus, f"{bus} ECC N/A", "not-offered"))
            continue
        readable = _na(volatile) or (volatile.isascii() and volatile.isdigit())
        if not readable or (not _na(retire) and _flag(retire) is None):
            out.append(finding(WARN, f"GPU {bus}: ECC answered volatile uncorrectable "
                                     f"{volatile!r}, retirement pending {retire!r}", gpu=bus,
                               kind="unread-value"))
        count = int(volatile) if not _na(volatile) and readable else None
        out.append(_read(bus, f"{bus} volatile uncorrectable ECC {volatile}, retirement pending "
                              f"{retire}"))
        if judge.memory_kind(None, None, count, _flag(retire)) != judge.RESET:
            continue
        if count:
            out.append(reset_needed(f"GPU {bus}: {volatile} uncorrectable ECC error(s) since the "
                                    "driver loaded (volatile counter): GPU reset needed", bus,
                                    reset_pending_warns, kind="ecc-volatile"))
        if _flag(retire):
            out.append(reset_needed(f"GPU {bus}: a page retirement is pending "
                                    f"(retired_pages.pending {retire}): GPU reset needed", bus,
                                    reset_pending_warns, kind="retirement-pending"))
    return out


def judge_reset(rows: list[list[str]], reset_pending_warns: bool) -> list[Finding]:
    """Rows of smi.RESET_FIELDS (``[bus, reset required, drain and reset recommended]``) judged."""
    out: list[Finding] = []
    for bus, required, drain in rows:
        if _na(required) and _na(drain):
            out.append(_read(bus, f"{bus} reset status N/A", "not-offered"))
            continue
        unknown = [v for v in (required, drain) if not _na(v) and _flag(v) is None]
        if unknown:
            out.append(finding(WARN, f"GPU {bus}: reset status {', '.join(unknown)} not "
                                     "understood", gpu=bus, kind="unread"))
        if _flag(required):
            out.append(reset_needed(f"GPU {bus}: the driver says a reset is required "
                                    "(reset_status.reset_required Yes): GPU reset needed", bus,
                                    reset_pending_warns, kind="reset-required"))
        if _flag(drain):
            out.append(reset_needed(f"GPU {bus}: the driver recommends drain and reset "
                                    "(reset_status.drain_and_reset_recommended Yes): GPU reset "
                                    "needed", bus, reset_pending_warns, kind="drain-and-reset"))
        out.append(_read(bus, f"{bus} reset required {required}, drain and reset {drain}"))
    return out


def judge_action(rows: list[list[str]], reset_pending_warns: bool) -> list[Finding]:
    """Rows of smi.ACTION_FIELDS judged, each action by its kind (gpufacts/judge.py: the table
    of the 8 actions); a value no table knows is said verbatim (``unread``)."""
    out: list[Finding] = []
    for row in rows:
        bus, value = row[0], ", ".join(row[1:])  # "1, Reset" (NVIDIA/DCGM#263) is one value
        if _na(value):
            out.append(_read(bus, f"{bus} recovery action N/A", "not-offered"))
            continue
        action = judge.action_of(value)
        if action is None:
            out.append(finding(WARN, f"GPU {bus}: recovery action {value!r} not understood",
                               gpu=bus, kind="unread"))
            continue
        said = f"GPU {bus}: recovery action {action.name} (gpu_recovery_action): " \
               f"{judge.action_says(action)}"
        if action.kind == judge.FATAL:
            out.append(finding(FAIL, said, action=REPLACE, gpu=bus, kind="recovery-action"))
        elif action.kind == judge.RESET:
            out.append(reset_needed(said, bus, reset_pending_warns, kind="recovery-action"))
        elif action.kind == judge.NOTE:
            out.append(finding(WARN, said, gpu=bus, kind="note"))
        out.append(_read(bus, f"{bus} recovery action {action.name}"))
    return out


def _action_rows(text: str) -> list[list[str]] | None:
    """The action query's rows: two values each, or three where the value is ``<number>,
    <words>`` (a real nvidia-smi printed ``1, Reset``, NVIDIA/DCGM#263)."""
    width = len(smi.ACTION_FIELDS)
    return words.csv_rows(text, width) or words.csv_rows(text, width + 1)


def read_recovery(asker, runner, timeout: float, reset_pending_warns: bool) -> list[Finding]:
    """Run the reset-status and recovery-action queries with ``asker`` (:func:`ask`'s shape)
    and judge them. A query not answered is ``unread``, except a field refused as "not a valid
    field" (not offered by this nvidia-smi, ``not-offered``): ``gpu_recovery_action`` before 565, and
    the reset status after 570 when the recovery action answers (NVML deprecated the reset
    status for it; 580 refuses the fields, tests/data/real/h200-580).

    Raises:
        Broken: as :func:`ask`.
    """
    reset_rows, reset_why = asker(runner, smi.reset_argv(), len(smi.RESET_FIELDS), timeout)
    action_rows, action_why = asker(runner, smi.action_argv(), len(smi.ACTION_FIELDS), timeout,
                                    parse=_action_rows)
    out: list[Finding] = []
    if reset_rows is not None:
        out += judge_reset(reset_rows, reset_pending_warns)
    elif words.NOT_A_FIELD in reset_why and action_rows is not None:
        out.append(finding(OK, "reset status not offered by this nvidia-smi (deprecated since "
                               "570: the recovery action says it)", kind="not-offered"))
    else:
        out.append(finding(WARN, f"reset status not read ({reset_why})", kind="unread"))
    if action_rows is None and words.NOT_A_FIELD in action_why:
        out.append(finding(OK, "recovery action not offered by this nvidia-smi", kind="not-offered"))
    elif action_rows is None:
        out.append(finding(WARN, f"recovery action not read ({action_why})", kind="unread"))
    else:
        out += judge_action(action_rows, reset_pending_warns)
    return out


def read_remapper(runner, timeout: float, reset_pending_warns: bool,
                  asker=ask) -> tuple[list[Finding] | None, str]:
    """Run the row-remapper query (smi.remap_argv) with ``asker`` (:func:`ask`'s shape) and
    judge it (:func:`judge_remapper`): ``(findings, "")``, or ``(None, why it is unread)``.

    Raises:
        Broken: as :func:`ask`.
    """
    rows, why = asker(runner, smi.remap_argv(), len(smi.REMAP_FIELDS), timeout)
    return (None, why) if rows is None else (judge_remapper(rows, reset_pending_warns), "")


def read_ecc(runner, timeout: float, reset_pending_warns: bool,
             asker=ask) -> tuple[list[Finding] | None, str]:
    """Run the ECC and page-retirement query (smi.ecc_argv) with ``asker`` and judge it
    (:func:`judge_ecc`): ``(findings, "")``, or ``(None, why it is unread)``.

    Raises:
        Broken: as :func:`ask`.
    """
    rows, why = asker(runner, smi.ecc_argv(), len(smi.ECC_FIELDS), timeout)
    return (None, why) if rows is None else (judge_ecc(rows, reset_pending_warns), "")


def read_memory(runner, timeout: float, reset_pending_warns: bool, unread: list[str],
                asker=ask) -> list[Finding]:
    """:func:`read_remapper`, :func:`read_ecc` and :func:`read_recovery`, one after another
    (the watcher's poll): their findings, in that order; why the remapper or the ECC query is
    unread is appended to ``unread`` as it is found (kept when a later query raises).

    Raises:
        Broken: as :func:`ask`.
    """
    found: list[Finding] = []
    for read in (read_remapper, read_ecc):
        findings, why = read(runner, timeout, reset_pending_warns, asker)
        if findings is None:
            unread.append(why)
        else:
            found += findings
    return found + read_recovery(asker, runner, timeout, reset_pending_warns)


def side_by_side(runner, timeout: float):
    """:func:`ask` with the gate's four queries (remapper, ECC, reset status, recovery action)
    asked at once, side by side (issue 38: they do not depend on each other, and a real H200
    answers four nvidia-smi calls at once in about the time of one); the caller reads their
    answers in its own order, so a ``Broken`` or a warning comes where asking one after another
    put it. A query not asked here is asked when it is read. Each call at most ``timeout``
    seconds."""
    from podvm_gpu.host.proc import side_by_side as at_once

    argvs = [smi.remap_argv(), smi.ecc_argv(), smi.reset_argv(), smi.action_argv()]
    done = dict(zip([tuple(argv) for argv in argvs], at_once(
        [lambda argv=argv: runner.run(argv, check=False, timeout=timeout)
         for argv in argvs])))

    def asked(runner, argv: list[str], width: int, timeout: float, parse=None):
        if tuple(argv) not in done:
            return ask(runner, argv, width, timeout, parse)
        call, err = done.pop(tuple(argv))
        if isinstance(err, CommandError):  # as ask() says a call that could not run
            return None, str(err)
        if err is not None:
            raise err
        return answered(argv, width, call, parse)

    return asked


def said(findings: list[Finding], *kinds: str) -> list[str]:
    """The ``what`` of each finding of ``kinds`` (none: every one), in order."""
    return [f.what for f in findings if not kinds or f.kind in kinds]


READ = ("read", "not-offered")
