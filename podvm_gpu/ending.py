"""The one way GPUs are taken away (docs/interface.md 2.1, 3.5, 3.14, 4.1), below both boot (a
boot that ends ``failed`` or ``no-gpu``: boot/run.py) and the watcher (a fatal finding after a
ready boot: watch/act.py), which call it:

* the reason cut once (:func:`podvm_gpu.model.cut_reason`), what went wrong on the way kept
  whole at its end;
* the unavailable spec naming it, or with ``unavailable_spec: false`` no spec
  (:func:`withdraw_spec`);
* ``nvidia-smi conf-compute -srs 0`` in a confidential guest, in one wording
  (:func:`podvm_gpu.gpufacts.smi.ready_state_off`, the attestation gate's too);
* the binding's ``pass`` revoked with ``fail`` by the binding's own code (:func:`revoke`,
  steps/cc/bind.py);
* status.json through its one writer (:func:`podvm_gpu.status.write_status`, in the caller's
  ``write``), and the console line (:func:`podvm_gpu.journal.tell_console`): :func:`finish`.

Imported on every pod VM boot: standard library only; the binding and nvidia-smi are imported
where they are used.
"""

from __future__ import annotations

import os

from podvm_gpu.cdi import SPEC_PATH
from podvm_gpu.host.fs import TMP_SUFFIX, Root, untrusted_dirs
from podvm_gpu.journal import tell_console
from podvm_gpu.model import State, cut_reason
from podvm_gpu.status import STATUS_PATH


def untrusted_root(root: Root) -> str | None:
    """Why boot must not write under ``root``: :func:`podvm_gpu.host.fs.untrusted_dirs` for
    the folders of the status file and the spec (``check``'s status row asks the same)."""
    return untrusted_dirs(root, (os.path.dirname(STATUS_PATH), os.path.dirname(SPEC_PATH)))


def oserror(err: OSError) -> str:
    """An OS error in words with the file it is about: the target of a rename (an atomic
    write's), never its temporary name (``.status.json.<pid>.tmp``), which no reader knows."""
    name = getattr(err, "filename2", None) or err.filename
    if name and os.path.basename(str(name)).startswith(".") and str(name).endswith(TMP_SUFFIX):
        name = None
    return f"{err.strerror or err}" + (f" ({name})" if name else "")


def withdraw_spec(root: Root, state: str, reason: str, unavailable_spec: bool) -> None:
    """Install the unavailable spec naming ``state`` and ``reason`` (cdi/unavailable.py), or,
    with the config's ``unavailable_spec: false``, remove any spec, so nothing looks ready.

    Raises:
        OSError: the spec folder cannot be made or written, or the spec removed.
    """
    from podvm_gpu.cdi.unavailable import remove_spec, write_unavailable_spec

    if unavailable_spec:
        write_unavailable_spec(root, state, reason)
    else:
        remove_spec(root)


def revoke(root: Root, doc: dict, mode: str = "auto") -> str | None:
    """A ``pass`` this boot bound into RTMR3 (steps/cc/bind.py, issue 37) revoked with a
    ``fail`` event, as a boot that ends failed after binding ``pass`` revokes it: a relying
    party's policy (docs/trustee/podvm-gpu.rego) then refuses the VM whose GPU failed after
    attestation. The event is the binding's own (bind.py's ``settle``), made from status.json's
    document as the boot's from its status. Updates ``doc["binding"]``; returns what went
    wrong (``confidential-computing: binding broken: ...``), or None (revoked, or nothing
    bound to revoke). Never raises.

    Args:
        root: the root; doc: status.json's document; mode: ``confidential_computing.bind``.
    """
    from types import SimpleNamespace as Of

    from podvm_gpu.steps.cc import bind

    if not bind.passed(doc.get("binding")):
        return None

    def listed(key):
        return [Of(pci_address=str(g.get("pci_address") or ""), device_id=str(
            g.get("device_id") or "")) for g in doc.get(key) or () if isinstance(g, dict)]

    cc = doc.get("confidential_computing")
    cc = cc if isinstance(cc, dict) else {}
    status = Of(gpus=listed("gpus"), nvswitches=listed("nvswitches"), binding=doc["binding"],
                attestation=doc.get("attestation"), attested_gpus=doc.get("attested_gpus") or [],
                confidential_computing=Of(label=cc.get("mode"), multi_gpu=cc.get(
                    "multi_gpu_mode")))
    failure = bind.settle(root, status, mode, True)
    doc["binding"] = status.binding
    return failure


def finish(root: Root, state: str, reason: str | None, write, log, *,
           unavailable_spec: bool = True, keep_spec: bool = False, line: str = "",
           retold: bool = False) -> tuple[str, str | None, bool]:
    """End: the spec taken away (:func:`withdraw_spec`, unless ``keep_spec``: a ready boot's
    spec stays), the final status (``write``), the journal line of a failure, the console line.

    A spec that cannot be written makes the end ``failed`` with the write error named (``;
    cdi: cannot write /var/run/cdi/nvidia.yaml: <error>``), and the status is still written;
    a status that cannot be written makes it ``failed`` too (``; status: cannot write ...``),
    and the spec is written again with that reason: the spec must not say ready (or no-gpu)
    for an end that failed.

    Args:
        root: the root; state: ``failed``, ``no-gpu`` or ``ready``; reason: the reason, cut
            (None for ready).
        write: ``write(state, reason)`` writes status.json (through
            :func:`podvm_gpu.status.write_status`, the caller holding the boot's lock); it may
            return the reason it wrote, when it said more (the watcher's ``-srs 0`` and
            revocation), else None. Raises OSError.
        log: the :class:`~podvm_gpu.journal.Log` (or one with its call and ``ERR``).
        unavailable_spec: the config's ``unavailable_spec``.
        line: the console's line for a ready end (its reason is None).
        retold: a console line was told for this end already (a retry): told again only once
            the spec is written.

    Returns:
        ``(state, reason, spec_written)``: the end's state and reason as written.
    """
    written = True
    if not keep_spec:
        try:
            withdraw_spec(root, state, reason, unavailable_spec)
        except OSError as err:
            written, state = False, State.FAILED
            reason = cut_reason(reason, f"; cdi: cannot write {SPEC_PATH}: {oserror(err)}")
    try:
        reason, failure = write(state, reason) or reason, None
    except OSError as err:
        failure = f"status: cannot write {STATUS_PATH}: {oserror(err)}"
    if state == State.FAILED:  # the reason as written: the journal's one line
        log(log.ERR, f"failed: {reason}")
    if failure:
        if failure not in (reason or ""):  # the first write may have failed the same way
            log(log.ERR, f"failed: {failure}")
            reason = cut_reason(reason, f"; {failure}") if reason else failure
        state = State.FAILED
        try:
            withdraw_spec(root, state, reason, unavailable_spec)
        except OSError:
            pass
    if written or not retold:  # a retry's line only once it worked
        tell_console(root, state, reason or line)
    return state, reason, written
