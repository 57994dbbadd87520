"""The fabric state of each GPU from ``nvidia-smi -q`` (its ``Fabric`` section), parsed by labels,
never by column positions: the fabricmanager step's reader (boot's wait and check's row).
"""

from __future__ import annotations

import collections
import re


class FabricState(collections.namedtuple("FabricState", "gpu state status")):
    """One GPU's NVLink fabric state from ``nvidia-smi -q`` (``Fabric`` section): the GPU's PCI
    address, the ``State`` and the ``Status`` line, as text."""

    __slots__ = ()

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
