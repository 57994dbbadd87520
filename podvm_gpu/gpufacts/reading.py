"""What a scrape learnt from NVML, as plain data (no NVML, no pynvml): the exporter builds one
of these without importing the NVML reader when NVML must not be called (the boot is not ready).
"""

from __future__ import annotations

# cc_mode values
CC_MODES = ("off", "on", "devtools", "ppcie")


class GpuReading:
    """One GPU as NVML reported it.

    Attributes:
        index: NVML's index (DCGM's ``gpu`` label, ``device="nvidia<index>"``).
        uuid, name: ``GPU-...`` and the model name; ``""`` when NVML could not say.
        pci_bus_id: NVML's form, ``00000000:04:00.0`` (8-digit domain).
        up: False when the GPU answers nothing (lost, needs a reset, no handle).
        reason, message: why it is down: a reason word (``gpu-is-lost``) and NVML's text.
        values: DCGM field name -> value in DCGM's unit (C, W, mJ, MHz, %, MiB, counts); a field
            the GPU does not support is missing.
        fabric_state: NVML's fabric state (``NVML_GPU_FABRIC_STATE_*``, 0 not supported .. 3
            completed), None when NVML gave none; fabric_status: its ``nvmlReturn_t`` status.
        recovery_action: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``'s value
            (``nvmlDeviceGpuRecoveryAction_t``: 0 none .. 4 drain and reset), None when unread.
    """

    __slots__ = ("index", "uuid", "name", "pci_bus_id", "up", "reason", "message", "values",
                 "fabric_state", "fabric_status", "recovery_action")

    def __init__(self, index: int):
        self.index = index
        self.uuid = ""
        self.name = ""
        self.pci_bus_id = ""
        self.up = False
        self.reason: str | None = None
        self.message: str | None = None
        self.values: dict[str, float] = {}
        self.fabric_state: int | None = None
        self.fabric_status: int | None = None
        self.recovery_action: int | None = None


class NvmlReading:
    """What one scrape learnt from NVML.

    Attributes:
        up: True when NVML was initialised and answered within the bound.
        reason, message: why not (a reason word such as ``library-not-found``,
            ``driver-not-loaded``, ``timeout``, ``boot-failed``, and a sentence).
        driver_version: from NVML, None when unknown.
        cc_mode: one of :data:`CC_MODES`, ``unsupported`` (a library without CC functions:
            before 535), or None when unknown.
        cc_ready: the ready state (True: GPUs accept work) when CC is on, else None.
        full: True when the full (non-CC-safe) readings were taken.
        gpu_count: ``nvmlDeviceGetCount``; None when unknown.
        gpus: one :class:`GpuReading` per index.
    """

    __slots__ = ("up", "reason", "message", "driver_version", "cc_mode", "cc_ready", "full",
                 "gpu_count", "gpus")

    def __init__(self, up: bool = False, reason: str | None = None, message: str | None = None):
        self.up = up
        self.reason = reason
        self.message = message
        self.driver_version: str | None = None
        self.cc_mode: str | None = None
        self.cc_ready: bool | None = None
        self.full = False
        self.gpu_count: int | None = None
        self.gpus: list[GpuReading] = []


def cc_safe(profile: str, cc_mode: str | None) -> bool:
    """True when the CC-safe profile applies: configured, or ``auto`` and the GPUs are in a
    confidential mode or the mode is unknown (never read unknown as off)."""
    if profile == "full":
        return False
    if profile == "cc-safe":
        return True
    return cc_mode not in ("off", "unsupported")
