"""The GPU boot steps, one module each (contract section 3, steps 2 to 9).

Each module has ``run(ctx) -> str`` (the step's message when it is ``ok``); it raises
:class:`~podvm_gpu.steps.Skipped` for ``skipped`` and :class:`~podvm_gpu.errors.StepFailed`
with the cause (without the step's name) for ``failed``.
"""

from __future__ import annotations


class Skipped(Exception):
    """The step does not apply on this VM (e.g. no NVSwitch, no CC); the message says why."""
