"""The GPUs' verdict bound into the TEE's measurement: one AAEL event in CoCo's attestation-agent
log and the same digest extended into TDX RTMR3 (issue 37; docs/interface.md 3.14).

A relying party (Trustee's attestation service) replays the CC event log against the RTMRs
and lets its policy read each event; docs/trustee/podvm-gpu.rego requires every RTMR3 event
before this agent's first to come from a listed domain, that first event to be its ``pass``,
no event of it to say ``fail``, and every tagged RTMR3 event's text to match its digest.

The event: domain :data:`DOMAIN` (a URI, as the AAEL specification recommends), operation
:data:`OPERATION`, content one canonical JSON line (RFC 8785 for these values: sorted keys, no
spaces, ASCII only), version :data:`CONTENT_VERSION`: ``{"architecture", "cc_mode", "devices",
"gpus", "multi_gpu_mode", "nonce", "nvswitches", "record_sha256", "result", "version"}``
(:func:`content`); ``result`` is ``pass`` (written by the confidential-computing step
between the attestation's verdict and ``-srs 1``), ``fail`` (a boot that ends failed) or
``none`` (a boot that ends ready or no-gpu without an attestation that passed: a TDX CPU VM).
Version 1 (issue 37) had domain ``podvm-gpu`` and neither ``architecture``, ``devices`` nor
``multi_gpu_mode``: the policy accepts neither that domain nor anything but these events.

Exactly, or not at all (:func:`bind`): the register's value must replay from the firmware's
index-4 records and AA's log before anything is written (else ``broken``); the entry is appended
and fsynced, then the register is extended by one 48-byte write; a failed write takes the entry
back (the log is truncated to its old size); a write that returned 48 cannot be undone, so the
register is read again and must hold SHA-384(old || digest), else the entry stays and the
binding is ``broken``. A boot run again appends only when its result differs from the last
event of this agent.

States (the status' ``binding.state``): ``bound`` (this boot's result is the log's last
podvm-gpu event and in RTMR3), ``unbound`` (no ``rtmr3:sha384``: a kernel before 6.16, an
SEV-SNP guest, a TDX guest under a paravisor, a regular VM), ``broken`` (the log and the
register disagree, or a write failed), ``off`` (``confidential_computing.bind: off``).
"""

from __future__ import annotations

import errno
import os

from podvm_gpu.host import rtmr

# The AAEL domain of this agent's events (docs/interface.md 3.14): a UUID URN (RFC 9562), the
# one URN form that needs no registration and names nothing it does not own; fixed for every
# VM and version. Version 1's domain was "podvm-gpu" (not a URI; no policy accepts it now).
DOMAIN = "urn:uuid:393acf0b-2e7d-4084-a54e-933012df6af5"
OPERATION = "GpuAttestation"
CONTENT_VERSION = 2
RECORD_PATH = "/run/podvm-gpu/attested.json"  # the preimage of record_sha256
PASS, FAIL, NONE = "pass", "fail", "none"
BOUND, UNBOUND, BROKEN, OFF = "bound", "unbound", "broken", "off"


class BindError(Exception):
    """The binding is broken; the message names the file and the cause."""


class AgentRefused(BindError):
    """The attestation-agent was reached and did not extend (writer.py): nothing written, the
    logs still replay, an earlier event stands; fails a boot only with ``bind: required``."""


def is_ours(entry) -> bool:
    """Whether a log record is one of this agent's events (its domain and operation)."""
    text = entry.text()
    return bool(text) and text.split(" ", 2)[:2] == [DOMAIN, OPERATION]


def canonical(value) -> str:
    """One canonical JSON line: sorted keys, no spaces, non-ASCII escaped (the AAEL
    specification allows printable characters only; for ASCII strings, integers, null and
    lists this is RFC 8785's form)."""
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def content(result: str, gpus: int, nvswitches: int, cc_mode: str | None, nonce: str | None,
            record_sha256: str | None, *, devices: list[dict] | None = None,
            architecture: str | None = None, multi_gpu_mode: str | None = None) -> str:
    """The event's content, version :data:`CONTENT_VERSION` (docs/interface.md 3.14).

    Args:
        result: ``pass``, ``fail`` or ``none``.
        gpus, nvswitches: how many the boot found on PCI.
        cc_mode: status.json's ``confidential_computing.mode`` (``on``, ``ppcie``, ...) or None.
        nonce: the attestation's nonce (64 hex) or None.
        record_sha256: SHA-256 (64 hex) of :data:`RECORD_PATH`, or None.
        devices: the GPUs the verdict is about, ``[{"bus_id": <nvidia-smi's form>, "uuid":
            <GPU-...> or None}]`` (:func:`gpu_identities`); kept sorted by bus id.
        architecture: the GPUs' one architecture (podvm_gpu/pci_ids.py), or None.
        multi_gpu_mode: ``conf-compute -mgm``'s word (``none``, ``protected-pcie``,
            ``not-offered``, another lower-cased as printed) or None.

    Returns:
        One canonical JSON line (:func:`canonical`).
    """
    listed = sorted(({"bus_id": d.get("bus_id"), "uuid": d.get("uuid")} for d in devices or ()),
                    key=lambda d: str(d["bus_id"]))
    return canonical({"architecture": architecture, "cc_mode": cc_mode, "devices": listed,
                      "gpus": gpus, "multi_gpu_mode": multi_gpu_mode, "nonce": nonce,
                      "nvswitches": nvswitches, "record_sha256": record_sha256,
                      "result": result, "version": CONTENT_VERSION})


def gpu_identities(status) -> tuple[list[dict], str | None]:
    """What the event names of the GPUs (issue 45 item 2): their identities and their one
    architecture.

    Identities: the boot's ``attested_gpus`` where the attestation recorded them (issue 45
    item 1: objects or dicts with ``bus_id`` and ``uuid``, on the status or its attestation
    record), else the GPUs on PCI by bus id (nvidia-smi's form, gpufacts/words.py) with no UUID
    (the CC step reads none). The architecture is :func:`podvm_gpu.pci_ids.architecture` of
    every GPU's device id when they all have the same one, else None (an unlisted id or a mixed
    set: a policy that requires an architecture refuses it).

    Args:
        status: the boot's :class:`~podvm_gpu.model.Status` (``gpus``, and ``attested_gpus``
            or ``attestation["attested_gpus"]`` when there).

    Returns:
        ``([{"bus_id", "uuid"}], architecture or None)``.
    """
    from podvm_gpu.gpufacts.words import bus_id
    from podvm_gpu.pci_ids import architecture

    attestation = status.attestation if isinstance(status.attestation, dict) else {}
    found = getattr(status, "attested_gpus", None) or attestation.get("attested_gpus")
    if found:
        devices = [{"bus_id": bus_id(b) if isinstance(b := _field(g, "bus_id"), str) else None,
                    "uuid": _field(g, "uuid")} for g in found]
    else:
        devices = [{"bus_id": bus_id(g.pci_address), "uuid": None} for g in status.gpus]
    kinds = {architecture(g.device_id) for g in status.gpus}
    return devices, (kinds.pop() if len(kinds) == 1 else None)


def _field(item, name: str):
    """An attribute of an object, or a key of a dict."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def attested_record(attestation: dict | None, gpus: list | None = None) -> dict | None:
    """The canonical record of what was attested (its SHA-256 goes into the event, the record
    into :data:`RECORD_PATH`): the nonce, nvattest's version, each device's claims as the
    status records them, each run's code and claims' SHA-256, and the GPUs' identities the
    verdict covers (``attested_gpus``: status.json's, ``{index, bus_id, uuid, ueid}`` each,
    issue 45). None without an attestation that ran."""
    if not isinstance(attestation, dict) or not attestation.get("runs"):
        return None
    return {"attested_gpus": list(gpus or []), "nonce": attestation.get("nonce"),
            "nvattest_version": attestation.get("nvattest_version"),
            "devices": attestation.get("devices", []),
            "runs": [{"device": r.get("device"), "code": r.get("code"),
                      "claims_sha256": r.get("claims_sha256")} for r in attestation["runs"]]}


present = rtmr.present
record = rtmr.binding_record


def last_result(records: list) -> str | None:
    """The ``result`` of the last podvm-gpu event among AA's records, or None."""
    import json

    for entry in reversed(records):
        text = entry.text()
        if not text:
            continue
        domain, _, rest = text.partition(" ")
        operation, _, body = rest.partition(" ")
        if domain != DOMAIN or operation != OPERATION:
            continue
        try:
            said = json.loads(body)
        except ValueError:
            continue
        if isinstance(said, dict) and isinstance(said.get("result"), str):
            return said["result"]
    return None


def bind(root, result: str, body: str, register=None) -> dict:
    """Append the event to AA's log and extend RTMR3 with its digest (module docstring).

    Args:
        root: the :class:`~podvm_gpu.host.fs.Root`.
        result: ``pass``, ``fail`` or ``none`` (the same as in ``body``).
        body: the content, from :func:`content`.
        register: the register (:class:`~podvm_gpu.host.rtmr.Register` by default; tests give
            a fake with the same ``read`` and ``extend``).

    Returns:
        The status record: ``unbound`` without the register, else ``bound``.

    Raises:
        BindError: the binding is broken (named: the log, the register, which write).
    """
    if register is None:
        if not present(root):
            return record(UNBOUND, reason=rtmr.UNBOUND_REASON)
        register = rtmr.Register(root.resolve(rtmr.RTMR3_PATH))
    try:
        old = register.read()
    except OSError as err:
        raise BindError(f"cannot read {rtmr.RTMR3_PATH}: {err.strerror or err}") from None
    firmware = _read_log(root, rtmr.CCEL_PATH, True)
    log_path = root.resolve(rtmr.EVENTLOG_PATH)
    ours = _read_log(root, rtmr.EVENTLOG_PATH, False)
    try:
        replayed = rtmr.replay(firmware + ours)
    except rtmr.LogError as err:
        raise BindError(f"cannot replay RTMR3: {err}") from None
    if replayed != old:
        raise BindError(f"{rtmr.RTMR3_PATH} ({old.hex()[:16]}...) does not replay from "
                        f"{rtmr.CCEL_PATH} and {rtmr.EVENTLOG_PATH} ({replayed.hex()[:16]}...): "
                        "something extended RTMR3 without logging it; nothing written")
    if last_result(ours) == result:  # a rerun with the same result: already bound
        return record(BOUND, result, "the log's last podvm-gpu event already says " + result)
    event = rtmr.tagged_event(DOMAIN, OPERATION, body)
    digest = rtmr.digest(event)
    from podvm_gpu.steps.cc import writer

    try:  # the agent runs: it writes (3.14)
        if writer.through_agent(root, DOMAIN, OPERATION, body):
            return record(BOUND, result, "extended and logged by the attestation-agent "
                          "(ExtendRuntimeMeasurement)", True, digest.hex())
    except writer.AgentRefused as err:
        raise AgentRefused(str(err)) from None
    size = _append(root, log_path, rtmr.entry(event))
    try:
        wrote = register.extend(digest)
    except OSError as err:
        back = _truncate(log_path, size)
        raise BindError(f"extending {rtmr.RTMR3_PATH} failed ({err.strerror or err}); "
                        f"{back}") from None
    if wrote != len(digest):
        back = _truncate(log_path, size)
        raise BindError(f"extending {rtmr.RTMR3_PATH} wrote {wrote} bytes, not 48; {back}")
    try:
        now = register.read()
    except OSError as err:
        now, why = None, f"cannot read it back: {err.strerror or err}"
    else:
        why = ""
    want = rtmr.extended(old, digest)
    if now != want:
        raise BindError(f"{rtmr.RTMR3_PATH} after the extend " +
                        (why or f"is {now.hex()[:16]}..., not SHA-384(old || digest) "
                                f"{want.hex()[:16]}...") +
                        f"; the entry stays in {rtmr.EVENTLOG_PATH} (an extend cannot be undone)")
    return record(BOUND, result, None, True, digest.hex())


def _read_log(root, host_path: str, firmware: bool) -> list:
    """The records of a log; a missing one has none (the CCEL of firmware that keeps no log,
    AA's before anything logged). AA's log must be a regular file only root can change."""
    from podvm_gpu.host.fs import read_bounded, untrusted_because

    path = root.resolve(host_path)
    try:
        data = read_bounded(path, rtmr.LOG_LIMIT)
    except FileNotFoundError:
        return []
    except OSError as err:
        raise BindError(f"cannot read {host_path}: {err.strerror or err}") from None
    if not firmware:
        why = untrusted_because(path)
        if why:
            raise BindError(f"{host_path} cannot be trusted: {why}")
    try:
        return rtmr.parse_records(data, firmware, host_path)
    except rtmr.LogError as err:
        raise BindError(str(err)) from None


def _append(root, path: str, data: bytes) -> int:
    """Append ``data`` to AA's log (made 0644 in a 0755 folder when missing) and fsync it;
    the log's size before (what a failed extend truncates back to). Never AA's
    ``.wal_event_entry``.

    Raises:
        BindError: the log cannot be written (what was written of it is taken back).
    """
    from podvm_gpu.host.fs import ensure_dir

    host = rtmr.EVENTLOG_PATH
    try:
        ensure_dir(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError as err:
        raise BindError(f"cannot open {host} to append: {err.strerror or err}") from None
    size = None
    try:
        info = os.fstat(fd)
        if (info.st_mode & 0o170000) != 0o100000:
            raise BindError(f"{host} is not a regular file")
        size = info.st_size
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as err:
        if size is not None:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
        raise BindError(f"cannot append to {host}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    return size


def _truncate(path: str, size: int) -> str:
    """Take an appended entry back; what the reason says of it."""
    try:
        rtmr.cut_log(path, size)
    except OSError as err:
        return (f"the entry could NOT be taken back from {rtmr.EVENTLOG_PATH} "
                f"({err.strerror or errno.errorcode.get(err.errno, err)}): the log no longer "
                "replays")
    return f"the entry was taken back from {rtmr.EVENTLOG_PATH}"


def for_boot(root, status, mode: str, result: str, register=None) -> tuple[dict, str | None]:
    """Bind a boot's result as the config says; the status record and, when the boot must
    fail for it, the reason (``confidential-computing: binding ...``).

    Args:
        root: the :class:`~podvm_gpu.host.fs.Root`.
        status: the boot's :class:`~podvm_gpu.model.Status` (its GPUs, NVSwitches, CC finding
            and attestation record make the content).
        mode: ``confidential_computing.bind``: ``auto``, ``required`` or ``off``.
        result: ``pass``, ``fail`` or ``none``.
        register: the register seam (:func:`bind`).

    A broken binding fails the boot in ``auto`` too: every attestation of the VM fails then;
    but the attestation-agent refusing the event (writer.py's ``AgentRefused``: nothing
    written, the logs still replay) and ``unbound`` fail it only with ``required``.
    """
    if mode == OFF:
        return record(OFF, reason="confidential_computing.bind: off"), None
    if register is None and not present(root):
        why = rtmr.UNBOUND_REASON
        failure = (f"binding required (confidential_computing.bind: required) but {why}"
                   if mode == "required" else None)
        return record(UNBOUND, reason=why), failure
    finding = getattr(status, "confidential_computing", None)
    attestation = status.attestation if isinstance(status.attestation, dict) else {}
    try:
        digest = _keep_record(root, attested_record(attestation, getattr(status, "attested_gpus",
                                                                          None))
                              if result != NONE else None)
        devices, arch = gpu_identities(status)
        body = content(result, len(status.gpus), len(status.nvswitches),
                       getattr(finding, "label", None), attestation.get("nonce")
                       if result != NONE else None, digest, devices=devices,
                       architecture=arch, multi_gpu_mode=getattr(finding, "multi_gpu", None))
        return bind(root, result, body, register), None
    except BindError as err:  # AA refusing fails the boot only when required (3.14)
        fails = mode == "required" or not isinstance(err, AgentRefused)
        return record(BROKEN, result, str(err)), f"binding broken: {err}" if fails else None


def plan_note(root, mode: str) -> str:
    """``boot --dry-run``'s note on the binding a real boot would make at its end (3.9, 3.14):
    off by the config, nothing to bind into (no register: one ``stat``, as the boot's), or
    the event and the register it would write, by their paths. Nothing is read or written.

    Args:
        root: the :class:`~podvm_gpu.host.fs.Root`; mode: ``confidential_computing.bind``.
    """
    if mode == OFF:
        return "binding: off (confidential_computing.bind: off): the boot's result is not " \
            "bound into RTMR3"
    if not present(root):
        return f"binding: nothing is bound: {rtmr.UNBOUND_REASON}" + (
            "; confidential_computing.bind: required: a boot here ends failed for it"
            if mode == "required" else "")
    return (f"binding: at its end the boot binds its result into RTMR3: one podvm-gpu "
            f"{OPERATION} event (result pass after an attestation that passed, fail when the "
            f"boot ends failed, else none) appended to {rtmr.EVENTLOG_PATH}, its digest "
            f"extended into {rtmr.RTMR3_PATH}")


def at_end(run, state: str, reason: str | None) -> tuple[str, str | None]:
    """The binding at a boot's end (boot/run.py's ``Run.bind_end``): a boot that bound nothing
    yet binds ``fail`` when it ends ``failed``, else ``none``; a failed boot whose ``pass`` is
    bound revokes it with ``fail``; otherwise nothing changes. Sets ``run.status.binding``.

    Args:
        run: the boot's Run (its root, status, ``bind_mode`` and log).
        state: the end's state; reason: its reason (None for ready).

    Returns:
        The end's state and reason: ``failed`` and ``confidential-computing: binding ...``
        (appended to a failed boot's reason) when the binding broke or ``bind: required``
        cannot bind. Never raises: an error is a broken binding.
    """
    status, failed = run.status, state == "failed"
    from podvm_gpu.steps.cc.writer import repair_said

    said = repair_said(run.root, _read_log, is_ours)  # a record this run appended but never extended (3.14)
    if said:
        run.log(4, said)
        status.warnings.append(said)
    done = status.binding
    if done is not None and not (failed and passed(done)):
        return state, reason
    failure = settle(run.root, status, run.bind_mode, failed)
    if failure is None:
        return state, reason
    run.log(3, failure)
    return "failed", (f"{reason}; {failure}" if failed and reason else failure)


def passed(done) -> bool:
    """Whether a binding record is a bound ``pass`` (what a failed end revokes)."""
    return isinstance(done, dict) and done.get("state") == BOUND and done.get("result") == PASS


def settle(root, status, mode: str, failed: bool) -> str | None:
    """:func:`for_boot` with ``fail`` (``failed``) or ``none`` at an end (:func:`at_end`, and
    the watcher's revocation, podvm_gpu/ending.py ``revoke``); sets ``status.binding``.
    Returns the reason's clause (``confidential-computing: binding ...``) when the end must
    fail for it, else None. Never raises: an error is a broken binding."""
    try:
        status.binding, failure = for_boot(root, status, mode, FAIL if failed else NONE)
    except Exception as err:  # a bug must not keep the end from its end
        failure = f"binding broken: internal error: {type(err).__name__}: {err}"
        status.binding = record(BROKEN, reason=failure)
    return f"confidential-computing: {failure}" if failure else None


def _keep_record(root, attested: dict | None) -> str | None:
    """Write the attested record to :data:`RECORD_PATH` (atomic, 0644); its SHA-256, or None.

    Raises:
        BindError: it cannot be written (the event would name a record nobody can read).
    """
    if attested is None:
        return None
    import hashlib

    from podvm_gpu.host.fs import atomic_write, ensure_dir

    text = canonical(attested)
    try:
        path = root.resolve(RECORD_PATH)
        ensure_dir(os.path.dirname(path))
        atomic_write(path, text, 0o644)
    except OSError as err:
        raise BindError(f"cannot write {RECORD_PATH}: {err.strerror or err}") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


ROW = "binding"


def binding_row(facts):
    """``check``'s ``binding`` row (docs/interface.md 5.1): status.json's ``binding`` record,
    and, where the register exists, the logs replayed against it now (read-only): an extend
    nobody logged since the boot fails the row, as it fails every attestation of the VM."""
    from podvm_gpu.row import FAIL, PASS, SKIP, WARN, Check, doc_ref
    from podvm_gpu.status import read_status

    record = (read_status(facts.root) or {}).get("binding")
    if not isinstance(record, dict):
        return Check(ROW, SKIP, "no binding in status.json (no boot has ended, or one from "
                     "before issue 37)")
    state = record.get("state")
    if state == BROKEN:
        return Check(ROW, FAIL, f"broken: {record.get('reason')}", "reboot the VM: its "
                     "event log no longer explains RTMR3 (" +
                     doc_ref("operating.md", "Binding the GPUs' verdict to the TEE") + ")")
    if state != BOUND:
        reason = record.get("reason")
        return Check(ROW, SKIP, f"{state}: {reason}" if reason else str(state))
    try:
        try:
            now = rtmr.Register(facts.root.resolve(rtmr.RTMR3_PATH)).read()
        except OSError as err:  # its strerror alone named no file: the register is named
            raise BindError(f"cannot read {rtmr.RTMR3_PATH}: {err.strerror or err}") from None
        replayed = rtmr.replay(_read_log(facts.root, rtmr.CCEL_PATH, True) +
                               _read_log(facts.root, rtmr.EVENTLOG_PATH, False))
    except (OSError, BindError, rtmr.LogError) as err:  # each names the file it could not read
        said = str(err) if not isinstance(err, OSError) else \
            f"{err.filename or 'a log'}: {err.strerror or err}"
        return Check(ROW, WARN, f"bound {record.get('result')} at boot, but RTMR3 cannot be "
                     f"checked now: {said}")
    if replayed != now:
        return Check(ROW, FAIL, f"bound {record.get('result')} at boot, but {rtmr.RTMR3_PATH} "
                     f"no longer replays from {rtmr.CCEL_PATH} and {rtmr.EVENTLOG_PATH}: "
                     "something extended it without logging", "reboot the VM")
    return Check(ROW, PASS, f"bound: {record.get('result')} in {rtmr.EVENTLOG_PATH} and RTMR3 "
                 "(the logs replay to it)")
