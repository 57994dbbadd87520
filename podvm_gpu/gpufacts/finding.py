"""The one finding type (issue 44 item 1): what every judge of GPU facts returns, and what boot,
check, the watcher and the exporter only map (a boot step's failure or warning, a check row, a
watch verdict, a health score).

A finding has a level on the one scale (gpufacts/words.py: ok/warn/fail = 0/10/20, DCGM's
``DCGM_HEALTH_RESULT_*``) and an action: :data:`NONE`, :data:`RESET` (a GPU reset, or in a
confidential guest a new VM: gpufacts/judge.py ``reset_advice``) or :data:`REPLACE` (the GPU or
its host: nothing inside the VM helps). A reset needed is a failure, or a warning with
``health.reset_pending_warns``: the judge resolves that (:func:`reset_needed`), so its callers
never read the option again.
"""

from __future__ import annotations

import collections

from podvm_gpu.gpufacts.words import FAIL, OK, WARN, bus_id

NONE, RESET, REPLACE = "none", "reset", "replace"


# A named tuple rather than a frozen dataclass: ``import dataclasses`` pulls in ``inspect``,
# several milliseconds of start-up for ``podvm-gpu metrics`` and ``check`` (host/kmsg.py's note).
class Finding(collections.namedtuple("Finding", "level action gpu what fix kind evidence code",
                                     defaults=(NONE, None, "", "", "", "", None))):
    """One thing found about the GPUs.

    Attributes:
        level: :data:`~podvm_gpu.gpufacts.words.OK`, ``WARN`` or ``FAIL``.
        action: :data:`NONE`, :data:`RESET` or :data:`REPLACE`.
        gpu: the GPU's PCI address in NVML's form (words.bus_id), or None when the source names
            none (a daemon, the driver as a whole).
        what: one line naming the facts (the GPU, the value as it was read, what it means).
        fix: what an operator does about it, or ``""``.
        kind: a short key of the source's own (``remap-failed``, ``xid``, ``fabric``, ...).
        evidence: the source's own words (a kernel record, nvidia-smi's values), or ``""``.
        code: a number the source gave (an Xid code), or None.
    """

    __slots__ = ()

    @property
    def fatal(self) -> bool:
        """True when the GPU is not to be used: the level is ``FAIL``."""
        return self.level == FAIL


def finding(level: str, what: str, *, action: str = NONE, gpu: str | None = None, fix: str = "",
            kind: str = "", evidence: str = "", code: int | None = None) -> Finding:
    """A :class:`Finding`, its ``gpu`` (any form words.bus_id reads) normalised.

    Raises:
        ValueError: ``level`` or ``action`` is not one of the scale's words.
    """
    if level not in (OK, WARN, FAIL) or action not in (NONE, RESET, REPLACE):
        raise ValueError(f"finding: level {level!r}, action {action!r}")
    return Finding(level, action, bus_id(gpu) if gpu else None, what, fix, kind, evidence, code)


def reset_needed(what: str, gpu: str | None, reset_pending_warns: bool, **more) -> Finding:
    """A GPU reset needed: ``FAIL``, or ``WARN`` with ``health.reset_pending_warns`` (the one
    place the option becomes a level; gpufacts/judge.py ``reset_verdict``)."""
    return finding(WARN if reset_pending_warns else FAIL, what, action=RESET, gpu=gpu, **more)


def worst(findings) -> str:
    """The worst level of ``findings`` (``OK`` for none)."""
    from podvm_gpu.gpufacts.words import worst as worst_of

    return worst_of(*(f.level for f in findings))
