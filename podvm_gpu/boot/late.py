"""GPUs that appear late: what detect waits for, the wait, and how it is told.

Boot's first scan can come before a GPU is on PCI: on Hyper-V (Azure) a GPU reaches PCI through a
VMBus pass-through channel, and its PCI function appears only when hv_pci and the host are done
(:mod:`podvm_gpu.host.sysfs`); a hot-plugged GPU appears whenever the host adds it. Detect waits,
bounded, when the VM shows that a GPU is coming: a PCI pass-through channel without its PCI
function, or fewer GPUs on PCI than the config's ``detect.expected_gpus``. Without either it
never waits and this module is not imported.

A wait that ends with a channel still empty, or with fewer GPUs than expected, ends the boot
``failed`` (not ``no-gpu``: a GPU was announced), naming the channel or the count and the wait.
"""

from __future__ import annotations

import time

from podvm_gpu.host import sysfs
from podvm_gpu.host.sysfs import nvidia_gpus, scan_nvidia


class LateWait:
    """One wait for late GPUs and its outcome.

    Args:
        channels: the pass-through channels without a PCI function at the first scan.
        expected_gpus: the GPUs the config expects (0: none expected).
        limit_s: the longest wait, seconds (``detect.late_gpu_wait_s`` cut to the budget left).
        limit_why: what set the limit, for messages (``detect.late_gpu_wait_s``).
    """

    def __init__(self, channels: list[sysfs.PciChannel], expected_gpus: int, limit_s: float,
                 limit_why: str):
        self.channels = channels
        self.expected_gpus = expected_gpus
        self.limit_s, self.limit_why = max(limit_s, 0.0), limit_why
        self.waited_s = 0.0
        self.how = ""
        self.arrived: dict[str, list[str]] = {}  # channel instance -> its PCI addresses
        self.gpus_seen = 0
        # who expects the GPUs, for messages: the image's config, or the pod's initdata
        self.who = ("the image expects", "detect.expected_gpus")

    def _look(self) -> bool:
        """Read sysfs once (stdlib only): the channels' functions and the GPU count; True when
        nothing is missing any more."""
        links = sysfs.pci_links()
        self.arrived = {c.instance: found for c in self.channels
                        if (found := sysfs.functions_below(c, links))}
        if self.expected_gpus:
            self.gpus_seen = len(nvidia_gpus(scan_nvidia()[1]))
        return not self.missing_parts()

    def missing_parts(self) -> list[str]:
        """What has not arrived, one phrase each (empty when nothing is missing)."""
        parts = [f"{c.describe()} announced a PCI device that did not appear"
                 for c in self.channels if c.instance not in self.arrived]
        if self.gpus_seen < self.expected_gpus:
            parts.append(f"only {self.gpus_seen} of the {self.expected_gpus} GPU(s) "
                         f"{self.who[0]} ({self.who[1]}) appeared on PCI")
        return parts

    def awaited(self) -> str:
        """What the wait is for, as a phrase: ``the PCI device of VMBus PCI pass-through channel
        <instance> (hv_pci, PCI domain 0001 asked for)``, ``1 GPU(s) on PCI
        (detect.expected_gpus)``."""
        parts = [f"the PCI device of {c.describe()}" for c in self.channels]
        if self.expected_gpus:
            parts.append(f"{self.expected_gpus} GPU(s) on PCI ({self.who[1]})")
        return " and ".join(parts)

    def limit(self) -> str:
        """``60 s (detect.late_gpu_wait_s)``."""
        return f"{_seconds(self.limit_s)} ({self.limit_why})"

    def run(self, wait_for_pci) -> None:
        """Wait with ``wait_for_pci(ready, timeout_s)`` (:func:`podvm_gpu.host.udev.wait_for_pci`);
        afterwards :meth:`missing_parts` says what did not come."""
        started = time.monotonic()
        _, self.how = wait_for_pci(self._look, self.limit_s)
        self.waited_s = time.monotonic() - started

    def outcome(self) -> str:
        """The wait as detect's message tells it: what was waited for, how long, what came."""
        came = [f"{instance}: {', '.join(addresses)}" for instance, addresses
                in sorted(self.arrived.items())]
        text = f"waited {_seconds(self.waited_s)} of at most {self.limit()} for {self.awaited()}"
        return text + (f"; arrived: {'; '.join(came)}" if came else "") + f" ({self.how})"

    def failure(self) -> str:
        """Why the boot fails after a wait that ended with something missing: each missing
        thing, the limit and what set it, how the wait watched; "timed out" first, as every
        wait that ran out of time says."""
        return f"timed out after {_seconds(self.limit_s)}: {'; '.join(self.missing_parts())} " \
               f"({self.limit_why}; {self.how})"


def _seconds(value: float) -> str:
    return f"{round(value, 1):g} s"


def plan_wait(channels: list[sysfs.PciChannel], expected_gpus: int, gpus_now: int,
              wait_s: float, budget_left_s: float) -> LateWait | None:
    """The wait detect needs, or None when nothing is coming.

    Args:
        channels: pass-through channels without a PCI function (:func:`sysfs.channels_without_pci`).
        expected_gpus: ``detect.expected_gpus`` (0: no expectation).
        gpus_now: NVIDIA GPUs on PCI at the first scan.
        wait_s: ``detect.late_gpu_wait_s``.
        budget_left_s: what the boot budget has left; the wait never goes past it.
    """
    expected = expected_gpus if gpus_now < expected_gpus else 0
    if not channels and not expected:
        return None
    if budget_left_s < wait_s:
        return LateWait(channels, expected, budget_left_s, "what the boot budget had left")
    return LateWait(channels, expected, wait_s, "detect.late_gpu_wait_s")
