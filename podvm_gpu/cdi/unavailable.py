"""The unavailable CDI spec (contract section 2).

On a VM with no GPU, or when GPU setup failed, kind ``nvidia.com/gpu`` must still exist in
``/var/run/cdi`` so that kata-agent fails a GPU request at once (it polls ``cdi_timeout``, 100 s,
only while the kind is absent). The spec holds one device, ``unavailable``, whose edits carry the
state and reason, so the pod's error names both.

Written as a YAML comment line and a JSON document, which is YAML too (the CDI readers parse the
file as YAML): the CPU fast path renders it without PyYAML or the json package
(:mod:`podvm_gpu.jsontext`), and ``check`` reads it back with the standard library.
"""

from __future__ import annotations

import os

from podvm_gpu.cdi import IMEX_SPEC_PATH, KIND, SPEC_PATH
from podvm_gpu.host.fs import Root, atomic_write, ensure_dir
from podvm_gpu.jsontext import dumps as _json

# 0.5.0: what nvidia-ctk 1.20 writes and kata-agent parses; spec annotations would need 0.6.0.
UNAVAILABLE_CDI_VERSION = "0.5.0"
UNAVAILABLE_DEVICE = "unavailable"


def render_unavailable_spec(state: str, reason: str) -> str:
    """The unavailable spec as YAML text.

    Args:
        state: ``no-gpu`` or ``failed``.
        reason: the status reason; folded to one line.
    """
    from podvm_gpu.model import shown

    # errors.one_line's fold, kept off the fast path; shown: no lone surrogate in the spec
    reason_line = shown(" ".join(str(reason).split()))
    spec = {"cdiVersion": UNAVAILABLE_CDI_VERSION, "kind": KIND,
            "devices": [{"name": UNAVAILABLE_DEVICE, "containerEdits": {
                "env": [f"PODVM_GPU_STATE={state}", f"PODVM_GPU_REASON={reason_line}"]}}]}
    return ("# Written by podvm-gpu: this VM has no usable NVIDIA GPU; see "
            "/run/podvm-gpu/status.json\n" + _json(spec) + "\n")


def write_unavailable_spec(root: Root, state: str, reason: str) -> str:
    """Install the unavailable spec atomically at ``/var/run/cdi/nvidia.yaml``, then remove
    the IMEX spec (:func:`remove_imex_spec`); return its real path.

    Raises:
        OSError: the spec directory cannot be created or written, or the IMEX spec removed.
    """
    path = root.resolve(SPEC_PATH, follow_last=False)
    ensure_dir(root.resolve("/var/run/cdi"))
    atomic_write(path, render_unavailable_spec(state, reason))
    remove_imex_spec(root)
    return path


def remove_imex_spec(root: Root) -> bool:
    """Remove ``/var/run/cdi/nvidia-imex.yaml`` (steps/cdi/imex.py): a no-gpu or failed boot
    leaves no IMEX channel a container could get. Returns whether there was one.

    Raises:
        OSError: it is there and cannot be removed (the error names the file).
    """
    try:
        os.unlink(root.resolve(IMEX_SPEC_PATH, follow_last=False))
    except FileNotFoundError:
        return False
    except OSError as err:
        raise OSError(err.errno, f"cannot remove {IMEX_SPEC_PATH}: {err.strerror}") from err
    return True


def remove_spec(root: Root) -> bool:
    """Remove ``/var/run/cdi/nvidia.yaml`` (an earlier boot's spec) when the config turned the
    unavailable spec off: a failed or no-GPU boot must leave nothing that looks ready; the IMEX
    spec goes too (:func:`remove_imex_spec`). Returns whether there was one.

    Raises:
        OSError: it is there and cannot be removed.
    """
    remove_imex_spec(root)
    try:
        os.unlink(root.resolve(SPEC_PATH, follow_last=False))
    except FileNotFoundError:
        return False
    return True
