"""The wait for PCI devices that appear late (:func:`wait_for_pci`), woken by udev's events.

pyudev watches the real udev (or the one umockdev fakes); PCI devices are never taken under
``--root``. Discovery itself reads sysfs (:func:`podvm_gpu.host.sysfs.discover`).
"""

from __future__ import annotations

import pyudev

from podvm_gpu.host.wait import until

POLL_S = 0.25  # the re-check interval when no udev monitor can be had


class _Context(pyudev.Context):
    """pyudev's Context, except that dropping one a signal left half-built is silent.

    The boot's signals raise in the main thread wherever it is (``boot/run.py`` ``Signals``),
    and ``Context()`` spends most of its time finding libudev (``ldconfig -p``): a SIGHUP there
    left a Context with its library but no handle, whose ``__del__`` (pyudev 0.24.5) printed
    ``Exception ignored in ... ctypes.ArgumentError`` with a traceback on the boot's stderr.
    """

    def __del__(self):
        if "_as_parameter_" in vars(self):
            super().__del__()


class _Monitor(pyudev.Monitor):
    """pyudev's Monitor, except that dropping one a signal left half-built is silent (as
    :class:`_Context`: its ``__del__`` needs both the handle and the library)."""

    def __del__(self):
        if {"_as_parameter_", "_libudev"} <= vars(self).keys():
            super().__del__()


def wait_for_pci(ready, timeout_s: float, recheck_s: float = 1.0) -> tuple[bool, str]:
    """Wait until ``ready()`` is true, at most ``timeout_s`` seconds, woken by PCI uevents.

    A pyudev monitor on subsystem ``pci`` (udevd's events, which come after udev has processed
    the device) wakes the wait as soon as a PCI device is added; ``ready`` is asked again on
    every event and at least every ``recheck_s`` seconds anyway, so a missed event (udevd not
    running yet) costs at most that. Where no monitor can be had (no netlink socket allowed,
    no udev), ``ready`` is polled every :data:`POLL_S` seconds instead.

    Args:
        ready: a cheap check of sysfs, e.g. "every pass-through channel has its PCI device".
        timeout_s: the longest wait, seconds.
        recheck_s: the longest sleep between two checks while a monitor is open.

    Returns:
        ``(ready() at the end, how the wait watched)``, the second for messages:
        ``"udev events watched"`` or ``"sysfs polled every 0.25 s: no udev monitor (<error>)"``.
    """
    try:
        monitor = _Monitor.from_netlink(_Context())
        monitor.filter_by("pci")
        monitor.start()
        how = "udev events watched"
    except OSError as err:
        monitor, how = None, f"sysfs polled every {POLL_S:g} s: no udev monitor ({err})"
    # ready() is asked once after the monitor started: nothing added before is missed
    if monitor is None:
        waited = until(ready, timeout_s, POLL_S)
    else:
        waited = until(ready, timeout_s, recheck_s, sleep=lambda s: monitor.poll(timeout=s))
    return waited.held, how
