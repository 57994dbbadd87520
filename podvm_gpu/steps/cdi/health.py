"""The health gate, in the ``cdi`` step between generation and installation: what the GPUs'
memory says before a CDI reader is told they are usable.

A GPU whose row remapping failed stays "ready" and corrupts jobs (aws/eks-node-monitoring-agent
#245); a pending remap or page retirement takes effect only after a GPU reset (awslabs/awsome-
distributed-ai#1190). Two bounded nvidia-smi queries, each at most the harmless-call time
(steps/context.py), after persistenced (they are NVML clients):

- ``--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure``: the row
  remapper per GPU; ``[N/A]`` where the GPU has none (before Ampere);
- ``--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending``: the
  *volatile* uncorrectable ECC count, since the driver loaded (in a pod VM: this boot), not the
  aggregate one, which the infoROM keeps for the board's life, errors long repaired by a remap
  or a retirement included, and would fail a repaired GPU forever; and page retirement pending
  (the pre-Ampere repair; ``[N/A]`` on GPUs that remap rows instead).

What the real program prints (nvidia-smi-real.md, 535 to 555): ``remapped_rows.pending`` and
``.failure`` are ``1``/``0`` in ``--query-remapped-rows`` (``Yes``/``No`` only in ``-q``; both are
read), ``retired_pages.pending`` is ``Yes``/``No``; a GPU lost after NVML took its handle prints
``[GPU is lost]`` in every column (exit 0), one lost at the handle stops the query with exit 15
naming its bus id: both fail the boot naming the GPU, as do the other exit statuses that say no
answer can come (gpufacts/words.py NVSMI_BROKEN: 9, 12, 15, 17, 18).

Then the reset status and the recovery action, each a query of its own (steps/cdi/recovery.py).

A remap failure fails the boot (the GPU needs replacing). A pending remap, a pending retirement or
a volatile uncorrectable ECC error fails it with "GPU reset needed", or is a warning with
``health.reset_pending_warns``. Only a value actually read fails the boot: a query that is not
answered (not supported, a tool too old, a timeout, a field it does not know) is a warning.
"""

from __future__ import annotations

from podvm_gpu.errors import CommandError, StepFailed
from podvm_gpu.gpufacts import judge, smi, words
from podvm_gpu.gpufacts.smi import ECC_FIELDS, REMAP_FIELDS, ecc_argv, remap_argv  # noqa: F401
from podvm_gpu.steps.cdi import recovery
from podvm_gpu.steps.context import BootContext

_na, _flag = words.na, smi.flag
parse_rows = words.csv_rows


class Broken(Exception):
    """nvidia-smi's answer says a GPU or the driver cannot answer (a lost GPU; an exit status of
    words.NVSMI_BROKEN): the message names it. Never an "unread" warning."""


def ask(runner, argv: list[str], width: int, timeout: float,
        parse=None) -> tuple[list[list[str]] | None, str]:
    """Run one health query with ``runner``: ``(rows, "")``, or ``(None, why it is unread)``
    (the boot gate and ``check`` judge the same answer). ``parse(stdout)`` reads the rows
    (default: ``width`` values each, words.csv_rows).

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
    ``output``), the same whether it was run now or side by side before (:func:`asked_side_by_side`).

    Raises:
        Broken: the exit status says a GPU is lost or the driver cannot answer.
    """
    broken = words.broken(done.returncode, done.output)
    if broken:
        raise Broken(broken)
    if parse is None:
        rows = parse_rows(done.stdout, width) if done.returncode == 0 else None
    else:
        rows = parse(done.stdout) if done.returncode == 0 else None
    if rows is None:
        return None, words.failed_call(argv, done.returncode, done.output)
    return rows, ""


def query(ctx: BootContext, argv: list[str], width: int, what: str,
          asker=ask) -> list[list[str]] | None:
    """Run one health query (with ``asker``, :func:`ask`'s shape); its rows, or None after
    adding a warning saying why it is unread.

    Raises:
        StepFailed: :class:`Broken` (a lost GPU, a driver that cannot answer).
    """
    try:
        rows, why = asker(ctx.runner, argv, width, ctx.harmless_timeout("nvidia-smi"))
    except Broken as err:
        raise StepFailed(f"health: {err}; spec not installed") from err
    if rows is None:
        ctx.warn(f"cdi: health: {what} not read ({why}); the boot does not fail on it")
    return rows


def judge_lost(rows: list[list[str]], verdict: Verdict) -> list[list[str]]:
    """Rows of ``[GPU is lost]`` into ``verdict.fatal`` (by their place in NVML's list), rows of
    ``[GPU requires reset]`` into ``verdict.reset`` (the recovery action GPU Reset: gpufacts/
    judge.py); the others returned."""
    kept = []
    for n, row in enumerate(rows):
        if any(v.strip() == words.GPU_LOST for v in row):
            verdict.fatal.append(f"GPU #{n} of NVML's list is lost (nvidia-smi printed "
                                 f"{words.GPU_LOST}): it fell off the bus or needs a reset")
        elif any(v.strip() == words.GPU_REQUIRES_RESET for v in row):
            verdict.reset.append(f"GPU {row[0].strip()}: GPU reset needed (nvidia-smi printed "
                                 f"{words.GPU_REQUIRES_RESET}: the recovery action GPU Reset)")
        else:
            kept.append(row)
    return kept


class Verdict:
    """What the gate found: ``fatal`` (fail whatever the config), ``reset`` (a reset needed),
    ``read`` (one line per GPU for the step's message). :meth:`outcome` is the one decision the
    boot's gate (:func:`gate`) and check's row (steps/cdi/step.py ``row_remapper_row``) act on."""

    REPLACE, RESET, RESET_WARNS, HEALTHY = "replace", "reset", "reset-warns", "healthy"

    def __init__(self):
        self.fatal: list[str] = []
        self.reset: list[str] = []
        self.read: list[str] = []
        self.unread: list[str] = []

    def outcome(self, reset_pending_warns: bool) -> str:
        """:data:`REPLACE` (a GPU needs replacing: fail, whatever the config), :data:`RESET` (a
        reset is needed: fail), :data:`RESET_WARNS` (a reset is needed, a warning by
        ``health.reset_pending_warns``) or :data:`HEALTHY`."""
        if self.fatal:
            return self.REPLACE
        if self.reset:  # the one reading of health.reset_pending_warns (gpufacts/judge.py)
            return self.RESET_WARNS if judge.reset_verdict(reset_pending_warns) == words.WARN \
                else self.RESET
        return self.HEALTHY


def judge_remapper(rows: list[list[str]], verdict: Verdict) -> None:
    """Rows of :data:`REMAP_FIELDS` into ``verdict``: ``1``/``0`` as the real program prints them
    (``Yes``/``No`` as ``-q`` and field reports do); ``[N/A]``: no remapper; ``[GPU is lost]``:
    fatal; another value is not read as one (``verdict.unread``)."""
    for bus, pending, failure in judge_lost(rows, verdict):
        if _na(pending) and _na(failure):
            verdict.read.append(f"{bus} remapper N/A")
            continue
        failed, waiting = _flag(failure), _flag(pending)
        if failed is None or waiting is None:
            verdict.unread.append(f"GPU {bus}: remapper answered pending {pending!r}, failure "
                                  f"{failure!r}")
        kind = judge.memory_kind(failed, waiting, None, None)  # the one decision on memory
        if kind == judge.FATAL:
            verdict.fatal.append(f"GPU {bus}: row remapping failed (remapped_rows.failure "
                                 f"{failure}): the GPU's memory cannot be repaired, the GPU "
                                 "needs replacing")
        if waiting:  # also beside a failure: both are said
            verdict.reset.append(f"GPU {bus}: a row remap is pending (remapped_rows.pending "
                                 f"{pending}): GPU reset needed")
        verdict.read.append(f"{bus} remap pending {pending}, failure {failure}")


def judge_ecc(rows: list[list[str]], verdict: Verdict) -> None:
    """Rows of :data:`ECC_FIELDS` into ``verdict``: a count of ASCII digits, a ``Yes``/``No``
    (``1``/``0``) pending retirement; ``[N/A]``: no counter (ECC off, or a GPU without it);
    another value is not read as one (``verdict.unread``), as :func:`judge_remapper` says it
    (a garbled count was passed as none)."""
    for bus, volatile, retire in judge_lost(rows, verdict):
        if _na(volatile) and _na(retire):
            verdict.read.append(f"{bus} ECC N/A")
            continue
        readable = _na(volatile) or (volatile.isascii() and volatile.isdigit())
        if not readable or (not _na(retire) and _flag(retire) is None):
            verdict.unread.append(f"GPU {bus}: ECC answered volatile uncorrectable "
                                  f"{volatile!r}, retirement pending {retire!r}")
        count = int(volatile) if not _na(volatile) and readable else None
        verdict.read.append(f"{bus} volatile uncorrectable ECC {volatile}, retirement pending "
                            f"{retire}")
        if judge.memory_kind(None, None, count, _flag(retire)) != judge.RESET:
            continue
        if count:
            verdict.reset.append(f"GPU {bus}: {volatile} uncorrectable ECC error(s) since the "
                                 "driver loaded (volatile counter): GPU reset needed")
        if _flag(retire):
            verdict.reset.append(f"GPU {bus}: a page retirement is pending "
                                 f"(retired_pages.pending {retire}): GPU reset needed")


def asked_side_by_side(ctx: BootContext):
    """:func:`ask` with the gate's four queries asked at once, side by side (issue 38: they do
    not depend on each other, and a real H200 answers four nvidia-smi calls at once in about
    the time of one); the gate reads their answers in its own order, so a :class:`Broken` or a
    warning comes where asking one after another put it. A query not asked here is asked when
    it is read."""
    from podvm_gpu.host.proc import side_by_side

    timeout = ctx.harmless_timeout("nvidia-smi")
    argvs = [remap_argv(), ecc_argv(), recovery.reset_argv(), recovery.action_argv()]
    done = dict(zip([tuple(argv) for argv in argvs], side_by_side(
        [lambda argv=argv: ctx.runner.run(argv, check=False, timeout=timeout)
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


def gate(ctx: BootContext) -> str:
    """Read the GPUs' memory health; return one line of what was read.

    Raises:
        StepFailed: a value read says a GPU needs replacing, or (unless
            ``health.reset_pending_warns``) a reset.
    """
    verdict = Verdict()
    asked = asked_side_by_side(ctx)
    rows = query(ctx, remap_argv(), len(REMAP_FIELDS), "the row remapper", asked)
    if rows is not None:
        judge_remapper(rows, verdict)
    rows = query(ctx, ecc_argv(), len(ECC_FIELDS), "ECC errors and page retirement", asked)
    if rows is not None:
        judge_ecc(rows, verdict)
    for line in verdict.unread:
        ctx.warn(f"cdi: health: {line}: not read as a value; the boot does not fail on it")
    try:  # issue 28: the reset status and the recovery action
        found = recovery.read(asked, ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    except Broken as err:
        raise StepFailed(f"health: {err}; spec not installed") from err
    verdict.fatal += found.fatal
    verdict.reset += found.reset
    verdict.read += found.read
    for line in found.warn:
        ctx.warn(f"cdi: health: {line}")
    for line in found.unread:
        ctx.warn(f"cdi: health: {line}; the boot does not fail on it")
    outcome = verdict.outcome(ctx.config.health.reset_pending_warns)
    if outcome == Verdict.REPLACE:
        raise StepFailed("; ".join(verdict.fatal + verdict.reset) + "; spec not installed")
    if outcome == Verdict.RESET:
        raise StepFailed("; ".join(verdict.reset) + "; spec not installed (health."
                         "reset_pending_warns: true makes this a warning)")
    for line in verdict.reset:
        ctx.warn(f"cdi: health: {line} (health.reset_pending_warns)")
    return "health: " + ("; ".join(verdict.read) or "not read")
