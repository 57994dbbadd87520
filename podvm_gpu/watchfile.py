"""``/run/podvm-gpu/watch.json`` (issue 34, podvm_gpu/watch/): what the watcher found and how far it read the kernel log
(docs/interface.md 2.1 and 4.5).

Written atomically (host/fs.py ``atomic_write``, 0644) at the watcher's start, when it warns,
when it finds a fatal fault and when it stops; read by a restarted watcher (its kernel log
position), by ``boot`` (a finding that stands fails a boot run again), by ``check`` and the
metrics. Read as status.json is: a bounded regular file, no link followed.
"""

from __future__ import annotations

import os

from podvm_gpu.host.fs import Root, atomic_write, ensure_dir, read_bounded

WATCH_PATH = "/run/podvm-gpu/watch.json"
WATCH_UNIT = "podvm-gpu-watch.service"
CLEAR_COMMAND = "podvm-gpu watch --clear"
VERSION = 1
MAX_BYTES = 1 << 20
MAX_WARNINGS = 20  # distinct warnings kept (each with its count); the rest only counted


def new_state(boot_started_at: str | None) -> dict:
    """An empty document for the boot that started at ``boot_started_at`` (status.json's)."""
    return {"version": VERSION, "boot_started_at": boot_started_at, "kmsg_seq": None,
            "started_at": None, "updated_at": None, "finding": None, "warnings": [],
            "warnings_dropped": 0, "nvml_hung": None}


def load(root: Root) -> dict | None:
    """The document under ``root``; None when there is none, or it is not one of ours (a
    garbled file is never read as a finding: the boot's own rerun then decides)."""
    try:
        data = read_bounded(root.resolve(WATCH_PATH, follow_last=False), MAX_BYTES)
        import json  # only with a file to read: every GPU boot asks, few have one (issue 38)

        doc = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None
    finding = doc.get("finding")
    if finding is not None and not (isinstance(finding, dict)
                                    and isinstance(finding.get("reason"), str)):
        return None
    warnings = doc.get("warnings")
    if not isinstance(warnings, list) or not all(
            isinstance(w, dict) and isinstance(w.get("text"), str)
            and isinstance(w.get("count"), int) for w in warnings):
        doc["warnings"] = []  # counts of ours only: anything else starts again from none
    if not (isinstance(doc.get("nvml_hung"), dict)
            and isinstance(doc["nvml_hung"].get("what"), str)):
        doc["nvml_hung"] = None  # the NVML refusal the watcher's runner holds (issue 46)
    if not isinstance(doc.get("warnings_dropped"), int):
        doc["warnings_dropped"] = 0
    if not isinstance(doc.get("kmsg_seq"), int) or isinstance(doc.get("kmsg_seq"), bool):
        doc["kmsg_seq"] = None
    return doc


def standing_finding(root: Root) -> dict | None:
    """The finding recorded in watch.json, or None."""
    doc = load(root)
    return doc.get("finding") if doc else None


def save(root: Root, doc: dict) -> None:
    """Write ``doc`` as watch.json atomically (mode 0644).

    Raises:
        OSError: the run directory cannot be made or written.
    """
    from podvm_gpu.jsontext import dumps

    path = root.resolve(WATCH_PATH, follow_last=False)
    ensure_dir(os.path.dirname(path))
    atomic_write(path, dumps(doc) + "\n")


def add_warning(doc: dict, text: str, at: str | None = None) -> bool:
    """Count ``text`` among the document's warnings; True when it is new (and kept).

    Identical warnings (a flood of one kernel record: Blackwell's Xid 62/45 -> 119 -> 154 loop
    repeats a line every 5 s, up to 16,879 times a boot) are one entry with its ``count`` and
    its ``first_at`` and ``last_at`` (``at``, UTC ISO times; issue 46), so the document stays
    bounded whatever the log holds."""
    for entry in doc["warnings"]:
        if entry["text"] == text:
            entry["count"] += 1
            entry["last_at"] = at
            entry.setdefault("first_at", None)
            return False
    if len(doc["warnings"]) >= MAX_WARNINGS:
        doc["warnings_dropped"] += 1
        return False
    doc["warnings"].append({"text": text, "count": 1, "first_at": at, "last_at": at})
    return True


def flood_note(doc: dict, text: str) -> str | None:
    """The watcher's log line for a repeated warning ``text`` when its count is 10, 100, 1000,
    ...: ``<text> (repeated: N times since <first>, last at <last>)``; else None (a flood is
    said a few times, not once a record)."""
    entry = next((w for w in doc["warnings"] if w["text"] == text), None)
    count = entry["count"] if entry else 0
    if count < 10 or str(count).rstrip("0") != "1":
        return None
    return (f"{text} (repeated: {count} times since {entry.get('first_at')}, last at "
            f"{entry.get('last_at')})")


def repeated(doc: dict | None) -> int:
    """How many warnings were coalesced into an earlier identical one (each entry's count
    beyond its first), 0 without a document."""
    return sum(max(w.get("count", 1) - 1, 0) for w in (doc or {}).get("warnings") or []
               if isinstance(w, dict) and isinstance(w.get("count"), int))


def remove(root: Root) -> bool:
    """Remove watch.json; True when there was one."""
    try:
        os.unlink(root.resolve(WATCH_PATH, follow_last=False))
        return True
    except FileNotFoundError:
        return False
