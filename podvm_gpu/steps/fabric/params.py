"""The nvidia module's ``ModifyDeviceFiles`` parameter against the fabric manager, part of step
7, ``fabricmanager`` (issue 36).

``NVreg_ModifyDeviceFiles=0`` keeps the driver (and NVML in containers) from making or changing
``/dev/nvidia*`` nodes. Images set it on the host as the alternative to nvidia-ctk's
``disable-device-node-modification`` hook, which bind-mounts a tmpfs file over
``/proc/driver/nvidia/params`` in each container and breaks nested procfs mounts
(NVIDIA/nvidia-container-toolkit#1833). But the fabric manager cannot run with it: on NVSwitch
systems it fails with ``NV_ERR_INVALID_STATE`` (``request to acquire required privileges to
access NVSwitch devices failed``; ../shared/nvidia-ctk-real.md). The loaded module says its
value in ``/proc/driver/nvidia/params`` (``ModifyDeviceFiles: 0``), so a fabric kind that runs
the fabric manager fails before it is started, naming the parameter and the way instead.
"""

from __future__ import annotations

import re

from podvm_gpu.errors import StepFailed
from podvm_gpu.host.fs import Root

PARAMS_PATH = "/proc/driver/nvidia/params"
_LINE = re.compile(r"^ModifyDeviceFiles:\s*(\d+)\s*$", re.M)


def modify_device_files(root: Root) -> int | None:
    """``ModifyDeviceFiles`` of ``/proc/driver/nvidia/params`` under ``root`` (``1`` is the
    driver's default), or None when the file or the line is not there (an older driver, no
    module loaded): nothing is assumed then."""
    m = _LINE.search(root.read_text(PARAMS_PATH) or "")
    return int(m.group(1)) if m else None


def refuse_without_device_files(root: Root, what: str) -> None:
    """Fail when the loaded module has ``ModifyDeviceFiles: 0`` and the VM's fabric (``what``,
    e.g. ``4 NVSwitch(es)``) needs the fabric manager.

    Raises:
        StepFailed: ``ModifyDeviceFiles: 0 in /proc/driver/nvidia/params ...``, what to do.
    """
    if modify_device_files(root) != 0:
        return
    raise StepFailed(f"ModifyDeviceFiles: 0 in {PARAMS_PATH} (the nvidia module was loaded with "
                     f"NVreg_ModifyDeviceFiles=0), and this VM's fabric ({what}) needs the "
                     "fabric manager, which fails with it (NV_ERR_INVALID_STATE: it cannot "
                     "acquire the NVSwitch devices); the fabric manager was not started: load "
                     "nvidia without NVreg_ModifyDeviceFiles=0 (modprobe.d, "
                     "modules.parameters), and if it was set to keep containers from changing "
                     "device nodes without nvidia-ctk's hook, set cdi.disable_hooks: "
                     "[disable-device-node-modification] instead")
