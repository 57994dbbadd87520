"""The status file ``/run/podvm-gpu/status.json`` (contract sections 2 and 4) and its readers.

Standard library only: the CPU fast path writes it.
"""

from __future__ import annotations

import json
import os
import time

from podvm_gpu.host.fs import Root, atomic_write, ensure_dir
from podvm_gpu.model import State, Status, now_iso

STATUS_PATH = "/run/podvm-gpu/status.json"
CDI_SPEC_PATH = "/var/run/cdi/nvidia.yaml"
CDI_KIND = "nvidia.com/gpu"


class StatusFile:
    """Writes a :class:`Status` atomically under a root, at start, after every step and at the end.

    Args:
        root: the :class:`Root` to write under.
        enabled: False for ``boot --dry-run``, which changes nothing.
    """

    def __init__(self, root: Root, enabled: bool = True):
        self.path = root.resolve(STATUS_PATH, follow_last=False)
        self.enabled = enabled

    def write(self, status: Status) -> None:
        """Write ``status`` (mode 0644).

        Raises:
            OSError: the run directory cannot be created or written.
        """
        if not self.enabled:
            return
        ensure_dir(os.path.dirname(self.path))
        atomic_write(self.path, json.dumps(status.to_dict(), indent=2) + "\n")

    def finish(self, status: Status, state: State, reason: str | None) -> None:
        """Set the final state, reason and finish time, then write."""
        status.state = state
        status.reason = reason
        status.finished_at = now_iso()
        self.write(status)


def read_status(root: Root) -> dict | None:
    """The status document under ``root``, or None when there is none yet (or it is unreadable)."""
    text = root.read_text(STATUS_PATH)
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def exit_code_for(doc: dict | None) -> int:
    """``podvm-gpu status`` exit code: 0 ready/no-gpu, 1 failed, 3 running or no status (contract 1)."""
    state = (doc or {}).get("state")
    if state in (State.READY, State.NO_GPU):
        return 0
    if state == State.FAILED:
        return 1
    return 3


def wait_for_final(root: Root, timeout_s: float, poll_s: float = 0.2) -> dict | None:
    """Poll the status file until its state is final or ``timeout_s`` seconds pass.

    Returns the last document read (None if none appeared).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        doc = read_status(root)
        if doc and doc.get("state") in {s.value for s in State if s.final}:
            return doc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return doc
        time.sleep(min(poll_s, remaining))
