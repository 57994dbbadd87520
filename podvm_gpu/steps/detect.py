"""The detect step's diagnosis (contract section 5, the ``pci`` row). Detect itself runs in the
CPU fast path (boot/__init__.py, PCI and VMBus from host/sysfs.py, the wait for late GPUs in
boot/late.py), so that a CPU VM never imports the steps."""

from __future__ import annotations

from podvm_gpu.gpufacts import kernel
from podvm_gpu.host import kmsg
from podvm_gpu.row import FAIL, NO_GPU, PASS, SKIP, Check
from podvm_gpu.status import read_status


def _not_arrived(facts) -> Check | None:
    """A fail when a device the VM announced is not on PCI: a VMBus PCI pass-through channel
    without its PCI device, or fewer GPUs than ``detect.expected_gpus``."""
    if facts.coming:
        # a channel without a driver first: its cause is in the image, not the host
        channel = min(facts.coming, key=lambda c: c.driver is not None)
        more = f" (and {len(facts.coming) - 1} more such channel(s))" if len(facts.coming) > 1 \
            else ""
        hint = ("no driver is bound to the channel: load hv_pci (modprobe pci-hyperv; put it "
                "in the initramfs)" if channel.driver is None else
                "the host has not delivered the device: see dmesg | grep hv_pci, then "
                "restart or redeploy the VM")
        return Check("pci", FAIL, f"{channel.describe()} has no PCI device{more}: Hyper-V "
                     "announced a pass-through device (a GPU) that is not on PCI", hint)
    expected = facts.config.detect.expected_gpus
    if len(facts.gpus) < expected:
        return Check("pci", FAIL, f"{len(facts.gpus)} of the {expected} GPU(s) the image "
                     "expects (detect.expected_gpus) are on PCI",
                     "the VM has fewer GPUs than the image serves: check the VM size, or "
                     "lower detect.expected_gpus")
    return None


def pci_row(facts) -> Check:
    """The ``pci`` row (contract 5.1). A GPU that a boot found and that is gone from PCI, and a
    fatal Xid since the driver loaded, fail before "no GPU on PCI" may skip as a CPU VM: a
    single-GPU VM whose GPU fell off the bus has no GPU on PCI either (issue 47)."""
    missing = _not_arrived(facts)
    at_boot = {g.get("pci_address") for g in (read_status(facts.root) or {}).get("gpus") or []
               if isinstance(g, dict)}
    gone = sorted(str(a) for a in at_boot - {g.pci_address for g in facts.gpus} if a)
    fatal = [f for f in kernel.findings(kmsg.since_driver_load(facts.messages)) if f.fatal]
    if gone:
        seen = f"; {kernel.describe(fatal[0])}" if fatal else ""
        return Check("pci", FAIL, f"GPU(s) {', '.join(gone)} found at boot are gone from PCI"
                     f"{seen}", "the GPU fell off the bus or was hot-removed: replace the VM")
    if missing:
        return missing
    if fatal:
        from podvm_gpu.gpufacts import judge

        buses = judge.buses_in([fatal[0].evidence, fatal[0].what])
        return Check("pci", FAIL, f"{len(facts.gpus)} GPU(s) on PCI, but {kernel.describe(fatal[0])}",
                     "the GPU needs a reset or the VM a new host: " + judge.reset_advice(
                         buses, getattr(facts, "confidential", None)))
    if not facts.gpus:
        extra = f"; {len(facts.nvswitches)} NVSwitch(es)" if facts.nvswitches else ""
        return Check("pci", SKIP, f"{NO_GPU} ({facts.scanned} devices scanned{extra}): "
                     "a CPU VM, GPU requests get the unavailable spec")
    names = ", ".join(sorted({g.name for g in facts.gpus}))
    return Check("pci", PASS, f"{len(facts.gpus)} GPU(s) ({names}) at "
                 f"{', '.join(g.pci_address for g in facts.gpus)}; "
                 f"{len(facts.nvswitches)} NVSwitch(es)")


VM_ROWS = {"pci": pci_row}
