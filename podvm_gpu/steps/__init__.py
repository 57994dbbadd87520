"""The boot steps, one module each (contract section 3): the step list is here, and only here.

A step is a module ``steps/<name>.py``, or, when it has helpers of its own, a package
``steps/<name>/`` (a room) whose ``step.py`` is the step and whose other modules are its helpers
(``steps/fabric/``, ``steps/modules/``, ``steps/cdi/``); its ``__init__.py`` holds no code, so a
helper imported elsewhere (the fabric kind by the pipeline and the modules step) never imports
the step. ``steps/context.py`` is the steps' shared context, no step.

Each GPU step's module has ``run(ctx)`` (its message when it is ``ok``; it raises
:class:`Skipped` for ``skipped`` and :class:`~podvm_gpu.errors.StepFailed` with the cause,
without the step's name, for ``failed``), ``plan(ctx)`` (the commands ``boot --dry-run`` says it
would run) and its diagnosis beside them: ``VM_ROWS``, the rows of ``podvm-gpu check`` on a
running VM (row name -> function of :class:`podvm_gpu.check.vm.Facts`), and, where an image can
be judged, ``IMAGE_ROWS`` (row name -> function of :class:`podvm_gpu.check.image.Image`). A step
whose work ends after the parallel steps (the spec's install) also has ``finish(ctx, result)``.
The pipeline (boot/pipeline.py), the dry-run plan (boot/plan.py) and both check runners take
the steps from :data:`STEPS`; removing a step is removing its line here and its module.
"""

from __future__ import annotations

import importlib

# (step name, module under podvm_gpu.steps), in the boot's order. ``detect`` runs in the CPU
# fast path (boot/__init__.py, host/sysfs.py, boot/late.py), so that a CPU VM never imports the
# steps; its module holds its diagnosis.
STEPS = (
    ("detect", "detect"),
    ("drivers", "drivers"),
    ("modules", "modules.step"),
    ("versions", "versions"),
    ("device-nodes", "nodes"),
    ("persistenced", "persistenced"),
    ("fabricmanager", "fabric.step"),
    ("confidential-computing", "cc.step"),
    ("cdi", "cdi.step"),
)
# The steps after persistenced, which run at the same time (boot/pipeline.py says why).
PARALLEL = ("fabricmanager", "confidential-computing", "cdi")
# The steps the pipeline runs once detect found a GPU.
GPU_STEPS = tuple(name for name, _ in STEPS[1:])


class Skipped(Exception):
    """The step does not apply on this VM (e.g. no NVSwitch, no CC); the message says why."""


def module(name: str):
    """The module that owns step ``name`` (a name of :data:`STEPS`).

    Raises:
        KeyError: no such step.
    """
    return importlib.import_module(f"podvm_gpu.steps.{dict(STEPS)[name]}")


def step_modules() -> list:
    """Every step's module, in the step order."""
    return [module(name) for name, _ in STEPS]
