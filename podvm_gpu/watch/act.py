"""A fatal finding applied (docs/interface.md 2.1, 4.1): under the boot's lock, the GPUs taken
away by the one ending (podvm_gpu/ending.py): the unavailable spec naming it, the CC ready state
set back in a confidential guest, the binding's pass revoked, status.json ``failed``, one
journal and one console line."""

from __future__ import annotations

import os

from podvm_gpu.gpufacts.smi import ready_state_off
from podvm_gpu.host.fs import Root
from podvm_gpu.model import State, cut_reason
from podvm_gpu.status import read_status

LOCK_WAIT_S = 30.0  # a boot run again holds the lock for its whole run: wait, then try again
NOT_READY = "set to not ready"  # the finding's ready_state when -srs 0 did it


def watched(doc: dict | None, boot_started_at: str | None) -> bool:
    """Whether ``doc`` (status.json) is still the watched boot's: ``ready``, or ``failed`` by a
    finding of the watcher (a spec write that failed is tried again), with its start time."""
    if not doc or doc.get("started_at") != boot_started_at:
        return False
    return doc.get("state") == State.READY or (
        doc.get("state") == State.FAILED and (doc.get("reason") or "").startswith("watch: "))


def apply_finding(root: Root, config, runner, finding: dict, confidential: bool,
                  boot_started_at: str | None, log) -> bool:
    """Take the GPUs out of the spec for ``finding`` (``reason`` one line starting ``watch:``),
    under the boot's lock; update ``finding`` in place (``applied``, ``ready_state``).

    Returns True when it was applied, or is moot (a boot ran again meanwhile and its status is
    no longer the one watched); False when the lock could not be had or the spec could not be
    replaced (status.json then says so, ``failed`` all the same: the caller tries again).
    """
    from podvm_gpu import ending
    from podvm_gpu.status import acquire_lock, write_status

    reason = finding["reason"]
    try:
        fd = acquire_lock(root, LOCK_WAIT_S, lambda *a: None)
    except OSError as err:
        log(log.ERR, f"{reason}; cannot take /run/podvm-gpu/boot.lock: {err.strerror or err}")
        return False
    if fd is None:
        log(log.ERR, f"{reason}; a boot holds /run/podvm-gpu/boot.lock: not applied yet")
        return False
    try:
        doc = read_status(root)
        if not watched(doc, boot_started_at):
            finding["applied"] = True
            log(log.WARNING, f"{reason}; the watched boot's ready status is gone (a boot ran "
                             "again): the spec is that boot's")
            return True

        def write(state: str, said: str) -> str:
            # after the spec: -srs 0 in a confidential guest once (never retried), the
            # binding's pass revoked; what went wrong kept whole at the reason's end
            if confidential and finding.get("ready_state") is None:
                finding["ready_state"] = ready_state_off(runner) or NOT_READY
            tail = "".join(f"; {p}" for p in (finding.get("ready_state"), ending.revoke(
                root, doc, config.confidential_computing.bind)) if p and p != NOT_READY)
            doc.update(state=state, cdi=None, finished_at=finding["at"],
                       reason=cut_reason(said, tail))
            write_status(root, doc)
            return doc["reason"]

        _state, _said, finding["applied"] = ending.finish(
            root, State.FAILED, cut_reason(reason), write, log,
            unavailable_spec=config.unavailable_spec, retold=bool(finding.get("told")))
        finding["told"] = True
    finally:
        os.close(fd)
    return finding["applied"]
