"""``check --image``'s ``early-gpu-clients`` row (issue 46 item 2; docs/interface.md 3.6, "The
ordering rule"): what in an image loads the NVIDIA driver or opens a GPU before the agent.

NVIDIA (nvtrust#109): nvidia-persistenced "needs to be the first entity to load the GPU kernel
driver, else it may load-and-reload"; in a confidential multi-GPU guest the driver then loses
GPUs (the boot fails naming it: podvm_gpu/gpufacts/early_client.py). NVIDIA's workaround is to
keep everything else from loading the modules (nvtrust#128). Two things in an image do it:

- a ``modules-load.d`` file that names an NVIDIA module: systemd-modules-load.service loads it
  in early boot (``sysinit.target``), before podvm-gpu.service; its folders and precedence are
  modules-load.d(5)'s (a file of the same name in an earlier folder wins, one linked to
  ``/dev/null`` or empty masks it), its lines modules names, ``#`` and ``;`` comments;
- an enabled unit that opens the GPUs (:data:`GPU_UNITS`: DCGM's host engine and exporter) and
  is not ordered after podvm-gpu.service.

In an image that serves confidential GPU VMs (``confidential_computing.image_serves``) the row
fails; elsewhere it warns (a regular guest loses no GPU, but each client re-initialises them).
"""

from __future__ import annotations

import os

from podvm_gpu import units
from podvm_gpu.check import FAIL, PASS, WARN, Check
from podvm_gpu.host.fs import Root

NAME = "early-gpu-clients"
# modules-load.d(5): the folders, earliest first (a file name found in an earlier one wins)
MODULES_LOAD_DIRS = ("/etc/modules-load.d", "/run/modules-load.d", "/usr/local/lib/modules-load.d",
                     "/usr/lib/modules-load.d", "/lib/modules-load.d")
# The NVIDIA modules; each loads nvidia (their dependency) with it. Names as kmod compares them.
NVIDIA_MODULES = ("nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem")
# Units of the image that open every GPU through NVML when they start (DCGM's host engine and
# dcgm-exporter: NVIDIA's packages and the GPU Operator's)
GPU_UNITS = ("nvidia-dcgm.service", "dcgm.service", "dcgm-exporter.service")


def modules_loaded_early(root: Root) -> list[str]:
    """``<file>: <module>[, ...]`` for each ``modules-load.d`` file in force that names an
    NVIDIA module, in file-name order (the order systemd-modules-load reads them)."""
    files: dict[str, str] = {}
    for folder in MODULES_LOAD_DIRS:
        try:
            names = sorted(os.listdir(root.resolve(folder)))
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf"):
                files.setdefault(name, f"{folder}/{name}")
    found = []
    for name in sorted(files):
        path = files[name]
        real = root.resolve(path)
        if os.path.islink(real) and os.readlink(real) == "/dev/null":
            continue  # masked
        text = root.read_text(path) or ""
        modules = [word.replace("-", "_") for word in
                   (line.split("#", 1)[0].split(";", 1)[0].strip() for line in text.splitlines())
                   if word]
        nvidia = [m for m in dict.fromkeys(modules) if m in NVIDIA_MODULES]
        if nvidia:
            found.append(f"{path} loads {', '.join(nvidia)}")
    return found


def units_opening_gpus(root: Root) -> list[str]:
    """``<unit> (enabled, not ordered after podvm-gpu.service)`` for each of :data:`GPU_UNITS`
    that would start beside the agent."""
    found = []
    for unit in GPU_UNITS:
        if units.unit_file(root, unit) is None or units.masked(root, unit) or \
                not units.enabled_by(root, unit):
            continue
        if not units.ordered_before(root, unit)[0]:
            found.append(f"{unit} is enabled and not ordered after {units.AGENT_UNIT}")
    return found


def early_clients_check(root: Root, confidential: bool) -> Check:
    """The row (module docstring).

    Args:
        root: the image's root.
        confidential: the image serves confidential GPU VMs (``confidential_computing.image_serves``).
    """
    said = modules_loaded_early(root) + units_opening_gpus(root)
    if not said:
        return Check(NAME, PASS, "nothing loads an NVIDIA module or opens a GPU before "
                     f"{units.AGENT_UNIT} (modules-load.d, {', '.join(GPU_UNITS)})")
    result, why = (FAIL, "a confidential multi-GPU guest loses GPUs (nvtrust#109)") if confidential \
        else (WARN, "each client re-initialises the GPUs; a confidential multi-GPU guest loses "
              "GPUs (nvtrust#109)")
    return Check(NAME, result, "; ".join(said[:3]) + (f" (and {len(said) - 3} more)"
                                                       if len(said) > 3 else "")
                 + f": before the agent's persistenced, {why}",
                 "remove the NVIDIA modules from modules-load.d (the agent loads them, "
                 "persistenced first), or mask the file: ln -s /dev/null "
                 "/etc/modules-load.d/<name>; order such units After=podvm-gpu.service")
