"""Several confidential GPUs in one confidential VM only in a mode NVIDIA supports (issue 45).

NVIDIA supports, in one confidential VM (NVIDIA Confidential Containers v1.1.0, supported
platforms): one GPU; several Hopper GPUs only in Protected PCIe mode (HGX with NVSwitches);
several Blackwell B200 or B300 GPUs in multi-GPU passthrough (CC on, ``Multi-GPU Mode: None``;
the RTX PRO 6000 only as a single GPU). The architecture comes from the PCI ids
(podvm_gpu/pci_ids.py); the mode from ``nvidia-smi conf-compute -mgm``, whose only known words are
``None`` and ``Protected PCIe`` (../shared/nvidia-smi-real.md). In a TDX or SEV-SNP guest any
other set-up with several GPUs fails closed before nvattest, unless
``confidential_computing.allow_unsupported_multi_gpu`` accepts it (a warning on every boot); a
mode word the agent does not know (NVLink encryption's wording is captured nowhere) is "not
understood" and fails closed in such a guest, whatever the key says.
"""

from __future__ import annotations

from podvm_gpu import pci_ids
from podvm_gpu.gpufacts import judge

SUPPORTED = ("NVIDIA supports one GPU per confidential VM, several only as Hopper GPUs in "
             "Protected PCIe mode (HGX with NVSwitches) or Blackwell B200/B300 GPUs in multi-GPU "
             "passthrough (CC on, Multi-GPU Mode: None)")
PASSTHROUGH = {"2901": "B200", "3182": "B300"}  # Blackwell multi-GPU passthrough (not the RTX PRO 6000)
KEY = "confidential_computing.allow_unsupported_multi_gpu"


def mode_words(multi_gpu: str | None) -> str:
    """``Multi-GPU Mode: None`` in nvidia-smi's words (``unreadable``, ``not offered``)."""
    word = {judge.MGM_NONE: "None", judge.MGM_PPCIE: "Protected PCIe",
            judge.MGM_NOT_OFFERED: "not offered by this nvidia-smi (535)",
            None: "unreadable"}.get(multi_gpu, multi_gpu)
    return f"Multi-GPU Mode: {word}"


def judge_set(multi_gpu: str | None, device_ids: list[str], guest: str | None,
              allow: bool) -> tuple[str | None, str | None]:
    """``(failure, warning)`` for the GPUs of a confidential classification.

    Args:
        multi_gpu: the finding's ``multi_gpu`` (judge.MGM_*, another word, or None).
        device_ids: each GPU's PCI device id (4 hex digits).
        guest: the confidential guest as host/tee.py describes it, or None (no rule then).
        allow: :data:`KEY`.

    Returns:
        A failure reason (the step fails), a warning (accepted by the key), or both None.
    """
    if guest is None:
        return None, None
    known = (judge.MGM_NONE, judge.MGM_PPCIE, judge.MGM_NOT_OFFERED, None)
    if multi_gpu not in known:
        return (f"Multi-GPU Mode {multi_gpu!r} (nvidia-smi conf-compute -mgm) is not understood "
                f"in a confidential guest, {guest}: fails closed; {SUPPORTED}"), None
    if len(device_ids) <= 1:
        return None, None
    archs = [pci_ids.architecture(d) or f"unknown architecture (10de:{d})" for d in device_ids]
    if multi_gpu == judge.MGM_PPCIE and all(a == "Hopper" for a in archs):
        return None, None
    if multi_gpu == judge.MGM_NONE and all(d.lower() in PASSTHROUGH for d in device_ids):
        return None, None
    names = ", ".join(sorted(set(archs)))
    what = (f"{len(device_ids)} confidential GPUs ({names}) with {mode_words(multi_gpu)} in a "
            f"confidential guest, {guest}: not a multi-GPU mode NVIDIA supports ({SUPPORTED})")
    if allow:
        return None, f"{what}; accepted by {KEY}"
    return what, None


def judge_gpus(finding, gpus, guest: str | None, cfg) -> tuple[str | None, str | None]:
    """The one rule boot's step (steps/cc/step.py) and check's ``confidential-computing`` row
    (steps/cc/rows.py) apply, so that both judge a set of GPUs alike: :func:`judge_set` for
    the discovered GPUs.

    Args:
        finding: classify.py's CC finding (its ``multi_gpu``).
        gpus: the discovered GPUs (host/sysfs.py's ``discover``; each a ``device_id``).
        guest: the confidential guest (query.guest), or None.
        cfg: the config's ``confidential_computing`` section (its :data:`KEY`).

    Returns:
        ``(failure, warning)`` as :func:`judge_set`.
    """
    return judge_set(finding.multi_gpu, [g.device_id for g in gpus], guest,
                     cfg.allow_unsupported_multi_gpu)


FIX = ("pass one GPU to the VM, use Protected PCIe on an HGX Hopper host, or accept the set-up "
       f"with {KEY}: true")
