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

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import health
from podvm_gpu.gpufacts.finding import FAIL, REPLACE, RESET
from podvm_gpu.steps.context import BootContext


def query(ctx: BootContext, read, what: str, asker=health.ask) -> list:
    """Run one health query of gpufacts/health.py (``read``: ``read_remapper`` or
    ``read_ecc``, with ``asker``, ``ask``'s shape): its findings, or an empty list after adding
    a warning saying why it is unread.

    Raises:
        health.Broken: a lost GPU, a driver that cannot answer (:func:`gate` makes it its
            StepFailed).
    """
    found, why = read(ctx.runner, ctx.harmless_timeout("nvidia-smi"),
                      ctx.config.health.reset_pending_warns, asker)
    if found is None:
        ctx.warn(f"cdi: health: {what} not read ({why}); the boot does not fail on it")
    return found or []


def gate(ctx: BootContext) -> str:
    """Read the GPUs' memory health; return one line of what was read.

    Raises:
        StepFailed: a value read says a GPU needs replacing, or (unless
            ``health.reset_pending_warns``) a reset; gpufacts/health.py ``Broken`` (a lost GPU,
            a driver that cannot answer).
    """
    warns = ctx.config.health.reset_pending_warns
    asked = health.side_by_side(ctx.runner, ctx.harmless_timeout("nvidia-smi"))
    try:
        found = query(ctx, health.read_remapper, "the row remapper", asked)
        found += query(ctx, health.read_ecc, "ECC errors and page retirement", asked)
        for line in health.said(found, "unread-value"):
            ctx.warn(f"cdi: health: {line}: not read as a value; the boot does not fail on it")
        # issue 28: the reset status and the recovery action
        recovery = health.read_recovery(asked, ctx.runner, ctx.harmless_timeout("nvidia-smi"),
                                        warns)
    except health.Broken as err:
        raise StepFailed(f"health: {err}; spec not installed") from err
    for line in health.said(recovery, "note"):
        ctx.warn(f"cdi: health: {line}")
    for line in health.said(recovery, "unread"):
        ctx.warn(f"cdi: health: {line}; the boot does not fail on it")
    found += recovery
    fatal = [f.what for f in found if f.action == REPLACE]
    reset = [f for f in found if f.action == RESET]
    if fatal:
        raise StepFailed("; ".join(fatal + [f.what for f in reset]) + "; spec not installed")
    if any(f.level == FAIL for f in reset):
        raise StepFailed("; ".join(f.what for f in reset) + "; spec not installed (health."
                         "reset_pending_warns: true makes this a warning)")
    for f in reset:
        ctx.warn(f"cdi: health: {f.what} (health.reset_pending_warns)")
    return "health: " + ("; ".join(health.said(found, *health.READ)) or "not read")
