"""``boot --dry-run``: the commands boot would run on this VM now, without running any.

Each step says its own (``plan(ctx)`` in its module, podvm_gpu/steps), built from the same facts
the step reads (loaded modules, existing nodes, running daemons), so the plan skips what a real
boot would skip. Commands whose arguments depend on results of earlier commands (a GPU's minor
before the driver is loaded) use the GPU's index; values known only at boot are placeholders in
angle brackets (``<port GUID>``, ``<fresh nonce: ...>``). What a step can only decide at run
time (a call that depends on an earlier call's answer) it says in a note (``plan_notes(ctx)``).
"""

from __future__ import annotations

from podvm_gpu import steps
from podvm_gpu.steps.context import BootContext


def plan(ctx: BootContext) -> list[list[str]]:
    """The argv lists a boot would run, in the step order."""
    return [argv for name in steps.GPU_STEPS
            for argv in getattr(steps.module(name), "plan", lambda ctx: [])(ctx)]


def notes(ctx: BootContext) -> list[str]:
    """The steps' notes on their plans (``plan_notes(ctx)``), in the step order, then what the
    boot's end would bind into RTMR3 (issue 37; not a step: boot/run.py ``bind_end``)."""
    from podvm_gpu.steps.cc.bind import plan_note

    return [note for name in steps.GPU_STEPS
            for note in getattr(steps.module(name), "plan_notes", lambda ctx: [])(ctx)] + \
        [plan_note(ctx.root, ctx.config.confidential_computing.bind)]
