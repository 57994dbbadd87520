"""The value types of what the agent knows of one GPU (issue 33): each value is read, or says
why it was not. The NVML back end gives them from a reading (:func:`nvml_facts`; the tests build
the same from nvidia-smi's queries, tests/smi_facts.py, to hold both back ends to one truth); the
decisions (gpufacts/judge.py :func:`~podvm_gpu.gpufacts.judge.facts_verdicts`) take them, never
text.

Plain named tuples, no ``dataclasses`` (its import costs the exporter's start-up).
"""

from __future__ import annotations

import collections


class Read(collections.namedtuple("Read", "value why")):
    """One value: ``value`` when read (``why`` ``""``), else None and ``why`` it was not
    (``not offered by this nvidia-smi``, ``N/A``, the failed call's words)."""

    __slots__ = ()

    @property
    def ok(self) -> bool:
        return not self.why


def read(value) -> Read:
    return Read(value, "")


def unread(why: str) -> Read:
    return Read(None, why or "not read")


NOT_READ = unread("not read")
FIELDS = ("bus", "lost", "remap_pending", "remap_failure", "ecc_volatile", "retired_pending",
          "recovery_action", "fabric_state", "fabric_success", "fabric_summary")


class GpuFacts(collections.namedtuple("GpuFacts", FIELDS)):
    """What the agent knows of one GPU, every field a :class:`Read` but ``bus``.

    Attributes:
        bus: NVML's form of its PCI address (words.bus_id).
        lost: True when the GPU answers nothing (lost, needs a reset).
        remap_pending, remap_failure: the row remapper (bool).
        ecc_volatile: uncorrectable ECC errors since the driver loaded (int).
        retired_pending: a page retirement waits for a reset (bool).
        recovery_action: NVML's number (0-7, judge.ACTIONS) or a word no table knows (str).
        fabric_state: ``Not Started``, ``In Progress``, ``Completed``; fabric_success: the
            status is success (bool); fabric_summary: ``Healthy``, ``Unhealthy``, ``Limited
            Capacity`` (580's health summary).
    """

    __slots__ = ()


def gpu_facts(bus: str, **values) -> GpuFacts:
    """A :class:`GpuFacts` whose fields not given are :data:`NOT_READ` (``lost`` False)."""
    fields = {name: NOT_READ for name in FIELDS[2:]}
    fields.update(values)
    fields.setdefault("lost", read(False))
    return GpuFacts(bus, **fields)


_FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}


def nvml_facts(gpu) -> GpuFacts:
    """The facts of one GPU of an NVML reading (gpufacts/reading.py ``GpuReading``); a field
    NVML did not give is "not given by NVML"; the fabric health summary is never read through
    NVML (the v3 struct that carries it crashed Python on a real H200: compatibility.md)."""
    from podvm_gpu.gpufacts.words import bus_id

    v = gpu.values
    missing = unread("not given by NVML")

    def flag(key):
        return read(bool(v[key])) if key in v else missing

    state = _FABRIC_STATES.get(gpu.fabric_state) if gpu.fabric_state else None
    return gpu_facts(
        bus_id(gpu.pci_bus_id), lost=read(not gpu.up),
        remap_pending=flag("DCGM_FI_DEV_ROW_REMAP_PENDING"),
        remap_failure=flag("DCGM_FI_DEV_ROW_REMAP_FAILURE"),
        ecc_volatile=read(int(v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]))
        if "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in v else missing,
        retired_pending=flag("DCGM_FI_DEV_RETIRED_PENDING"),
        recovery_action=read(gpu.recovery_action) if gpu.recovery_action is not None else missing,
        fabric_state=read(state) if state else unread("N/A"),
        fabric_success=read(gpu.fabric_state == 3 and gpu.fabric_status == 0)
        if state else unread("N/A"),
        fabric_summary=unread("not read through NVML"))
