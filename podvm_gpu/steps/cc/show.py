"""``podvm-gpu binding [--repair] [--json]``: the RTMR event log's podvm-gpu records and the
replay against RTMR3 (issue 47 item 5), and the crash window's repair (issue 43 item 5;
docs/interface.md 1.1, 3.14; operating.md, "Binding the GPUs' verdict to the TEE").

Read-only without ``--repair``: the register, the firmware's log and AA's log, each under
``--root``. Exit 0 when the logs replay to the register (or there is no register), 1 when they
do not or cannot be read; ``--repair`` exits 0 when nothing needed it or it repaired, 1 when it
could not (named).
"""

from __future__ import annotations

from podvm_gpu.host import rtmr

LOCK_WAIT_S = 30.0  # a boot holds the lock for its whole run


def report(root) -> dict:
    """What the register and the logs say now: ``{"register": hex or None, "replay": hex or
    None, "matches": bool or None, "records": [...], "other_records": int, "error": str or
    None}``; each record ``{"offset", "digest", "digest_matches_event", "result", "text"}``
    (its byte offset in the log, its SHA-384 hex, whether that is SHA-384 of its event, the
    content's ``result``, the AAEL text). Never raises: what cannot be read is ``error``."""
    import json

    from podvm_gpu.steps.cc.bind import BindError, _read_log
    from podvm_gpu.steps.cc.bind import is_ours as _ours

    out = {"register": None, "replay": None, "matches": None, "records": [],
           "other_records": 0, "error": None}
    try:
        ours = _read_log(root, rtmr.EVENTLOG_PATH, False)
        for entry in ours:
            if not _ours(entry):
                out["other_records"] += 1
                continue
            text = entry.text()
            try:
                said = json.loads(text.split(" ", 2)[2])
            except (ValueError, IndexError):
                said = None
            out["records"].append({
                "offset": entry.offset, "digest": entry.digest.hex() if entry.digest else None,
                "digest_matches_event": entry.digest == rtmr.digest(entry.event),
                "result": said.get("result") if isinstance(said, dict) else None,
                "text": text})
        if not rtmr.present(root):
            out["error"] = rtmr.UNBOUND_REASON
            return out
        out["register"] = rtmr.Register(root.resolve(rtmr.RTMR3_PATH)).read().hex()
        out["replay"] = rtmr.replay(_read_log(root, rtmr.CCEL_PATH, True) + ours).hex()
        out["matches"] = out["replay"] == out["register"]
    except OSError as err:
        out["error"] = f"{err.filename or rtmr.RTMR3_PATH}: {err.strerror or err}"
    except (BindError, rtmr.LogError) as err:
        out["error"] = str(err)
    return out


def run_binding(root_dir: str, json_out: bool, repair: bool) -> int:
    """The command (module docstring); returns its exit code."""
    from podvm_gpu.host.fs import Root
    from podvm_gpu.jsontext import dumps

    root = Root(root_dir)
    repaired = problem = None
    if repair:
        repaired, problem = _repair(root)
    said = report(root)
    if repair:
        said["repaired"], said["repair_error"] = repaired, problem
    if json_out:
        print(dumps(said))
    else:
        print(_text(said))
    if repair:
        return 1 if problem else 0
    return 1 if said["matches"] is False or (said["error"] and rtmr.present(root)) else 0


def _repair(root) -> tuple[str | None, str | None]:
    """The repair under the boot's lock: ``(what was repaired or None, why not or None)``."""
    import os

    from podvm_gpu.status import acquire_lock
    from podvm_gpu.steps.cc.bind import _read_log, is_ours
    from podvm_gpu.steps.cc.writer import RepairError, repair

    if not rtmr.present(root):
        return None, None
    try:
        fd = acquire_lock(root, LOCK_WAIT_S, lambda *a: None)
    except OSError as err:
        return None, f"cannot take /run/podvm-gpu/boot.lock: {err.strerror or err}"
    if fd is None:
        return None, "a boot holds /run/podvm-gpu/boot.lock: not repaired"
    try:
        return repair(root, _read_log, is_ours), None
    except RepairError as err:
        return None, str(err)
    finally:
        os.close(fd)


def _text(said: dict) -> str:
    """The report as lines; text from the log with its control characters escaped."""
    from podvm_gpu.model import shown

    lines = []
    if said.get("repaired"):
        lines.append(said["repaired"])
    if said.get("repair_error"):
        lines.append(f"not repaired: {said['repair_error']}")
    lines.append(f"{len(said['records'])} podvm-gpu record(s) in {rtmr.EVENTLOG_PATH}"
                 f" ({said['other_records']} of other domains):")
    for r in said["records"]:
        mark = "" if r["digest_matches_event"] else "  DIGEST DOES NOT MATCH ITS EVENT"
        lines.append(f"  byte {r['offset']}: {r['result']}  sha384 {r['digest']}{mark}")
        lines.append(f"    {shown(r['text'])}")
    if said["register"] is not None:
        lines.append(f"RTMR3  {said['register']}")
    if said["replay"] is not None:
        lines.append(f"replay {said['replay']}  (CCEL index-4 records, then "
                     f"{rtmr.EVENTLOG_PATH})")
    if said["matches"] is not None:
        lines.append("the logs replay to RTMR3" if said["matches"] else
                     "MISMATCH: the logs do not replay to RTMR3 (every attestation of the VM "
                     "fails)")
    if said["error"]:
        lines.append(shown(said["error"]))
    return "\n".join(lines)
