"""Step 2, ``drivers``: no GPU may be bound to another driver (nouveau, nova_core, vfio-pci...).

With another driver bound, ``modprobe nvidia`` can only say "No such device", so the boot stops
here, before any modprobe, naming the driver and the PCI address.
"""

from __future__ import annotations

from podvm_gpu.errors import StepFailed
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, WARN, Check
from podvm_gpu.steps.context import BootContext

NVIDIA_DRIVER = "nvidia"

_HINTS = {
    "nouveau": "blacklist nouveau in the image (modprobe.d: blacklist nouveau, options nouveau modeset=0)",
    "nova_core": "blacklist nova_core in the image",
    "nova-core": "blacklist nova_core in the image",
    "vfio-pci": "the GPU is reserved for passthrough (vfio-pci.ids= on the kernel command line?)",
}


def run(ctx: BootContext) -> str:
    """Fail when a GPU is bound to a driver other than ``nvidia``; else say how many are free."""
    others = [g for g in ctx.gpus if g.driver and g.driver != NVIDIA_DRIVER]
    if others:
        first = others[0]
        more = f" (and {len(others) - 1} more GPU(s))" if len(others) > 1 else ""
        hint = _HINTS.get(first.driver, "unbind it or keep that driver out of the image")
        raise StepFailed(f"GPU {first.pci_address} ({first.name}) is bound to driver "
                         f"{first.driver}, not nvidia{more}; {hint}")
    bound = sum(1 for g in ctx.gpus if g.driver == NVIDIA_DRIVER)
    return f"{len(ctx.gpus)} GPU(s): {bound} bound to nvidia, {len(ctx.gpus) - bound} unbound"

# --- podvm-gpu check ----------------------------------------------------------------------

def drivers_row(facts) -> Check:
    if not facts.gpus:
        return Check("drivers", SKIP, NO_GPU)
    other = [g for g in facts.gpus if g.driver and g.driver != "nvidia"]
    if other:
        g = other[0]
        mod = g.driver.replace("-", "_")
        return Check("drivers", FAIL, f"GPU {g.pci_address} is bound to {g.driver}, not nvidia",
                     f"blacklist {mod} in the image (modprobe.d: 'blacklist {mod}') and "
                     "rebuild it" if g.driver != "vfio-pci" else
                     "remove the vfio-pci binding (vfio-pci.ids= on the kernel command line)")
    unbound = [g.pci_address for g in facts.gpus if not g.driver]
    if unbound:
        return Check("drivers", WARN if facts.loaded else SKIP,
                     f"GPU(s) {', '.join(unbound)} bound to no driver",
                     "the nvidia module did not take them: see modules and the kernel log"
                     if facts.loaded else "")
    return Check("drivers", PASS, f"all {len(facts.gpus)} GPU(s) bound to nvidia")


VM_ROWS = {"drivers": drivers_row}
