"""The one bounded wait of the package: poll a condition until it holds or a limit passes.

Every wait of a boot is one of these (docs/design.md, "Waits"): persistenced's socket
(steps/persistenced.py), the NVLink 5 management port and NVLSM (steps/fabric/nvl5.py), the
fabric state (steps/fabric/step.py), the late GPUs on PCI (host/udev.py for boot/late.py). A
step's wait goes through :meth:`podvm_gpu.steps.context.BootContext.wait`, which cuts the limit
to the boot budget and stops when the boot's stop event is set; this module is below it (the
late-GPU wait runs before any step). Standard library only.
"""

from __future__ import annotations

import time


class Waited:
    """How a wait ended.

    Attributes:
        value: what the condition returned last (truthy: the wait ended because it held).
        limit_s: the longest the wait could take, seconds.
        waited_s: how long it took, seconds.
    """

    __slots__ = ("value", "limit_s", "waited_s")

    def __init__(self, value, limit_s: float, waited_s: float):
        self.value, self.limit_s, self.waited_s = value, limit_s, waited_s

    @property
    def held(self) -> bool:
        """True when the condition held before the limit (else the wait timed out)."""
        return bool(self.value)


def until(look, limit_s: float, poll_s: float, check_stop=None, sleep=None) -> Waited:
    """Call ``look()`` until it returns something truthy, at most ``limit_s`` seconds.

    ``look`` is called at once, then after every pause, and once more when the limit is reached
    (so a condition that holds at the last moment is seen); it may raise to end the wait early
    (a daemon that exited). The pause is ``min(poll_s, time left)``.

    Args:
        look: a callable of no arguments; its truthy result ends the wait.
        limit_s: the longest wait, seconds (0 or less: ``look`` is called once).
        poll_s: the pause between two calls, seconds.
        check_stop: called before every ``look``; raises to end the wait (the boot's stop
            event: :meth:`podvm_gpu.steps.context.BootContext.check_stop`), or None.
        sleep: ``sleep(seconds)`` for a pause that can be woken early (a udev monitor's poll),
            or None for :func:`time.sleep`.

    Returns:
        :class:`Waited`, ``held`` false when the limit passed first.
    """
    pause = sleep or time.sleep
    started = time.monotonic()
    end = started + max(limit_s, 0.0)
    while True:
        if check_stop is not None:
            check_stop()
        value = look()
        now = time.monotonic()
        if value or now >= end:
            return Waited(value, max(limit_s, 0.0), now - started)
        pause(min(poll_s, max(end - now, 0.0)))
