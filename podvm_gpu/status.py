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
        self.root = root
        self.path = STATUS_PATH
        self.enabled = enabled

    def write(self, status: Status) -> None:
        """Write ``status`` (mode 0644).

        Raises:
            OSError: the run directory cannot be resolved, created or written.
        """
        if not self.enabled:
            return
        # resolved on every write: a link planted meanwhile is followed chroot-style only
        self.path = self.root.resolve(STATUS_PATH, follow_last=False)
        ensure_dir(os.path.dirname(self.path))
        atomic_write(self.path, json.dumps(status.to_dict(), indent=2) + "\n")

    def finish(self, status: Status, state: State, reason: str | None) -> None:
        """Set the final state, reason and finish time, then write."""
        status.state = state
        status.reason = reason
        status.finished_at = now_iso()
        self.write(status)


class StatusUnreadable(ValueError):
    """The status file exists but is not a status document (not JSON, wrong types)."""


def load_status(root: Root) -> dict | None:
    """The status document under ``root``; None when there is none yet.

    Raises:
        StatusUnreadable: the file is not JSON, or ``state``, ``reason`` or ``warnings`` do not
            have the types of contract section 4.
    """
    text = root.read_text(STATUS_PATH)
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise StatusUnreadable(f"{STATUS_PATH} is not JSON ({err})") from err
    states = {s.value for s in State}
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), str) \
            or doc["state"] not in states:
        raise StatusUnreadable(f"{STATUS_PATH} has no valid state (one of {sorted(states)})")
    if not isinstance(doc.get("reason"), (str, type(None))) or not isinstance(
            doc.get("warnings", []), list):
        raise StatusUnreadable(f"{STATUS_PATH}: reason or warnings have the wrong type")
    return doc


def read_status(root: Root) -> dict | None:
    """Like :func:`load_status`, but None also when the file is unreadable."""
    try:
        return load_status(root)
    except StatusUnreadable:
        return None


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

    Raises:
        StatusUnreadable: at the timeout, the file is there but garbled.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        doc = read_status(root)
        if doc and doc.get("state") in {s.value for s in State if s.final}:
            return doc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return load_status(root)  # raises StatusUnreadable for a garbled file
        time.sleep(min(poll_s, remaining))
