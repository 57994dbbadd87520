"""The fabric state of each GPU: the fabricmanager step's readers (boot's wait and check's row).

The agent asks ``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status
--format=csv,noheader`` (:func:`fabric_argv`): NVIDIA's real 535, 550 and 555 builds all refuse
``-q -d FABRIC`` (``Failed to parse --display/-d flags``, exit 2; ../shared/nvidia-smi-real.md,
tests/test_real_nvidia_smi.py) and label the CSV values (``state  Completed``, two spaces;
``status Success``; ``[N/A]`` unlabelled without a fabric). A full ``nvidia-smi -q``'s ``Fabric``
section is read by :func:`parse_fabric`, by labels, never by column positions.
"""

from __future__ import annotations

import collections
import re

from podvm_gpu.readers import GPU_LOST, csv_rows, csv_value


class FabricState(collections.namedtuple("FabricState", "gpu state status")):
    """One GPU's NVLink fabric state: the GPU's PCI address, its fabric state and status as
    text (``Completed``/``Success``), from :func:`fabric_argv`'s rows (:func:`parse_fabric_rows`)
    or a full ``nvidia-smi -q`` (:func:`parse_fabric`). A GPU lost after NVML took its handle
    has ``GPU is lost`` in all three."""

    __slots__ = ()

    @property
    def lost(self) -> bool:
        return self.state == GPU_LOST[1:-1]

    @property
    def supported(self) -> bool:
        return self.state.strip().lower() not in ("n/a", "not supported", "", "unknown")

    @property
    def completed(self) -> bool:
        return self.state.strip().lower() == "completed"

    @property
    def success(self) -> bool:
        return self.completed and self.status.strip().lower() == "success"


def parse_fabric(text: str) -> list[FabricState]:
    """The ``Fabric`` block of each GPU in ``nvidia-smi -q`` output, by labels.

    A GPU block starts at ``GPU <pci>``; inside it, the ``State`` and ``Status`` lines after a
    ``Fabric`` heading (indented deeper than it) are read. GPUs without a Fabric block are left out.
    """
    result: list[FabricState] = []
    gpu = None
    fabric_indent = None
    state = status = None

    def flush():
        nonlocal state, status
        if gpu is not None and state is not None:
            result.append(FabricState(gpu, state, status or "N/A"))
        state = status = None

    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        m = re.match(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", stripped)
        if m and indent == 0:
            flush()
            gpu, fabric_indent = m.group(1), None
            continue
        if stripped == "Fabric":
            fabric_indent = indent
            continue
        if fabric_indent is not None:
            if indent <= fabric_indent and stripped:
                fabric_indent = None
                continue
            key, sep, value = stripped.partition(":")
            if sep and key.strip() == "State" and state is None:
                state = value.strip()
            elif sep and key.strip() == "Status" and status is None:
                status = value.strip()
    flush()
    return result


FABRIC_FIELDS = ("pci.bus_id", "fabric.state", "fabric.status")


def fabric_argv() -> list[str]:
    """``nvidia-smi --query-gpu=pci.bus_id,fabric.state,fabric.status --format=csv,noheader``:
    the fabric query every real nvidia-smi has (535 to 555)."""
    return ["nvidia-smi", f"--query-gpu={','.join(FABRIC_FIELDS)}", "--format=csv,noheader"]


def parse_fabric_rows(text: str) -> list[FabricState] | None:
    """One :class:`FabricState` per row of :func:`fabric_argv`'s answer (one row per GPU NVML
    lists, in its order), labels removed (``state  In Progress`` -> ``In Progress``; ``[N/A]``
    without a fabric -> ``N/A``); None when the text is not such an answer."""
    rows = csv_rows(text, len(FABRIC_FIELDS))
    if rows is None:
        return None
    return [FabricState(csv_value(bus), csv_value(state, "state"), csv_value(status, "status"))
            for bus, state, status in rows]
