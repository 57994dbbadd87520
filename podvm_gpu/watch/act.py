"""A fatal finding applied (docs/interface.md 2.1, 4.1): under the boot's lock, the unavailable
spec naming it, the CC ready state set back in a confidential guest, status.json ``failed``, one
journal and one console line."""

from __future__ import annotations

import os

from podvm_gpu.host.fs import Root
from podvm_gpu.model import REASON_MAX, State
from podvm_gpu.status import read_status

LOCK_WAIT_S = 30.0  # a boot run again holds the lock for its whole run: wait, then try again


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
    from podvm_gpu.boot.run import tell_console
    from podvm_gpu.status import acquire_lock

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
        problems = []
        try:
            if config.unavailable_spec:
                from podvm_gpu.cdi.unavailable import write_unavailable_spec

                write_unavailable_spec(root, State.FAILED, reason)
            else:
                from podvm_gpu.cdi.unavailable import remove_spec

                remove_spec(root)
        except OSError as err:
            # the spec still says ready: said everywhere, and the watcher fails (restarted)
            problems.append(f"the spec could not be replaced: {err.strerror or err}")
        if confidential and finding.get("ready_state") is None:  # once: never retried
            finding["ready_state"] = _ready_state_off(runner)
            if finding["ready_state"] != "set to not ready":
                problems.append(f"conf-compute -srs 0: {finding['ready_state']}")
        revoked = revoke_binding(root, doc)
        if revoked:
            problems.append(revoked)
        doc["state"], doc["cdi"] = State.FAILED, None
        # the problems first kept whole: a reason is at most REASON_MAX characters (model.py)
        said = f"; {'; '.join(problems)}" if problems else ""
        doc["reason"] = reason[:max(REASON_MAX - len(said), 200)] + said[:REASON_MAX - 200]
        doc["finished_at"] = finding["at"]
        try:
            write_status(root, doc)
        except OSError as err:
            problems.append(f"status.json not written: {err.strerror or err}")
        finding["applied"] = not any(p.startswith("the spec") for p in problems)
    finally:
        os.close(fd)
    line = doc["reason"]
    log(log.ERR, line)
    if finding["applied"] or not finding.get("told"):  # a retry's line only once it worked
        tell_console(root, State.FAILED, line)
        finding["told"] = True
    return finding["applied"]


def revoke_binding(root: Root, doc: dict) -> str | None:
    """A ``pass`` this boot bound into RTMR3 (steps/cc/bind.py, issue 37) revoked with a
    ``fail`` event, as a boot that ends failed after binding ``pass`` revokes it: a relying
    party's policy (docs/trustee/podvm-gpu.rego) then refuses the VM whose GPU failed after
    attestation. Updates ``doc["binding"]``; returns what went wrong (a broken binding), or
    None (revoked, or nothing bound to revoke)."""
    import hashlib

    from podvm_gpu.steps.cc import bind as binding

    done = doc.get("binding")
    if not (isinstance(done, dict) and done.get("state") == binding.BOUND
            and done.get("result") == binding.PASS):
        return None
    attestation = doc.get("attestation") if isinstance(doc.get("attestation"), dict) else {}
    cc = doc.get("confidential_computing") if isinstance(
        doc.get("confidential_computing"), dict) else {}
    attested = binding.attested_record(attestation)  # the record the pass named, unchanged
    digest = hashlib.sha256(binding.canonical(attested).encode("utf-8")).hexdigest() \
        if attested else None
    body = binding.content(binding.FAIL, len(doc.get("gpus") or []),
                           len(doc.get("nvswitches") or []), cc.get("mode"),
                           attestation.get("nonce"), digest)
    try:
        doc["binding"] = binding.bind(root, binding.FAIL, body)
    except binding.BindError as err:
        doc["binding"] = binding.record(binding.BROKEN, binding.FAIL, str(err))
        return f"confidential-computing: binding broken: {err}"
    except Exception as err:  # a bug must not keep the finding from its end
        doc["binding"] = binding.record(binding.BROKEN, binding.FAIL, str(err))
        return f"confidential-computing: binding broken: internal error: {err}"
    return None


def _ready_state_off(runner) -> str:
    """``nvidia-smi conf-compute -srs 0``, once (system-wide; a lost GPU makes it exit 15, which
    is reported, not retried)."""
    from podvm_gpu.errors import CommandError, one_line
    from podvm_gpu.gpufacts import words
    from podvm_gpu.gpufacts.smi import conf_compute_argv

    argv = conf_compute_argv("-srs", "0")
    try:
        done = runner.run(argv, check=False)
    except CommandError as err:
        return f"not run ({one_line(err, 200)})"
    if done.returncode == 0:
        return "set to not ready"
    return f"{words.status_text(done.returncode)}: {words.said(done.output)}"


def write_status(root: Root, doc: dict) -> None:
    """Replace status.json with ``doc`` atomically (the caller holds the boot's lock).

    Raises:
        OSError: the run directory cannot be made or written.
    """
    from podvm_gpu.status import STATUS_PATH
    from podvm_gpu.watchfile import write_json

    write_json(root, STATUS_PATH, doc)
