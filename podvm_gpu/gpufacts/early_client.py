"""A driver an early client re-initialised fails the boot, named (issue 46 item 2; docs/interface.md
3.6, "The ordering rule").

NVIDIA (nvtrust#109): nvidia-persistenced "needs to be the first entity to load the GPU kernel
driver, else it may load-and-reload"; in a confidential multi-GPU guest the kernel then logs
``NVRM: nvAssertFailedNoLog: Assertion failed: pVGpu != NULL @ objvgpu.c:148`` and NVML lists
fewer GPUs than ``/proc/driver/nvidia/gpus`` ("only 1 GPU shows up in nvidia-smi, while all have
entries in /proc/driver/nvidia/gpus/*/information"). The agent's own order never does it (the
scenario worlds' call logs hold it: tests/scenarios/order.py); a client outside the agent can (a
unit of the image, ``/etc/modules-load.d`` loading nvidia-drm: ``check --image`` flags those).

Two signs, each failing the boot with :data:`podvm_gpu.gpufacts.kernel.EARLY_CLIENT`'s words:

- the kernel's line (host/kmsg.py kind ``early-client``, fatal): read when the modules step ends
  (its fatal findings), once persistenced is ready (:func:`after_persistenced`,
  steps/persistenced.py) and at the boot's end (boot/pipeline.py);
- NVML listing fewer GPUs than the driver attached (:func:`fewer_in_nvml`): where the boot reads
  NVML's GPU list (the confidential-computing step's identity read, the fabric step's count).
"""

from __future__ import annotations

import os

from podvm_gpu.errors import StepFailed
from podvm_gpu.gpufacts import kernel
from podvm_gpu.gpufacts.finding import Finding
from podvm_gpu.gpufacts.words import bus_id
from podvm_gpu.host import kmsg

DRIVER_GPUS = "/proc/driver/nvidia/gpus"
KIND = "early-client"


def driver_gpus(root) -> list[str]:
    """The GPUs the driver attached: the entries of ``/proc/driver/nvidia/gpus`` (one folder per
    GPU, named by its PCI address) in NVML's bus-id form, sorted; [] when it cannot be read."""
    try:
        names = os.listdir(root.resolve(DRIVER_GPUS))
    except OSError:
        return []
    return sorted(bus_id(name) for name in names)


def kernel_line(root) -> Finding | None:
    """The kernel's ``objvgpu.c`` assertion since the driver last loaded, as a finding, or None."""
    found = kernel.findings(kmsg.since_driver_load(kmsg.read_kernel_log(root)))
    return next((f for f in found if f.kind == KIND), None)


def after_persistenced(root) -> None:
    """Once persistenced is ready: fail when the kernel says an early client re-initialised the
    driver (the line is logged when the driver reloads, which persistenced's own open starts).

    Raises:
        StepFailed: the reason quotes the kernel's line.
    """
    finding = kernel_line(root)
    if finding is not None:
        raise StepFailed(kernel.describe(finding))


def fewer_in_nvml(root, nvml_bus_ids, what: str) -> str | None:
    """How NVML's GPU list falls short of the driver's, naming the re-initialisation, or None.

    Args:
        root: the boot's root (``/proc/driver/nvidia/gpus`` under it).
        nvml_bus_ids: the bus ids an NVML client listed (any form :func:`bus_id` reads).
        what: the client, for the reason (``nvidia-smi --query-gpu=index,pci.bus_id,uuid``).

    Returns:
        ``NVML lists N of the M GPU(s) in /proc/driver/nvidia/gpus (<what>; not listed: ...):
        <EARLY_CLIENT>`` plus the kernel's line when it is there; None when NVML lists every
        GPU the driver has (or the driver lists none: nothing to compare).
    """
    listed = driver_gpus(root)
    seen = {bus_id(b) for b in nvml_bus_ids}
    missing = [gpu for gpu in listed if gpu not in seen]
    if not missing:
        return None
    few = ", ".join(missing[:6]) + (", ..." if len(missing) > 6 else "")
    line = kernel_line(root)
    said = f'; kernel: "{line.evidence}"' if line is not None else ""
    return (f"NVML lists {len(listed) - len(missing)} of the {len(listed)} GPU(s) in "
            f"{DRIVER_GPUS} ({what}; not listed: {few}): {kernel.EARLY_CLIENT}{said}")
