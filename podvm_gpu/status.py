"""The status file ``/run/podvm-gpu/status.json`` (contract sections 2 and 4) and its readers.

Standard library only: the CPU fast path writes it.
"""

from __future__ import annotations

import _thread
import errno
import os
import sys
import time

from podvm_gpu.host.fs import TMP_SUFFIX, Root, atomic_write, ensure_dir, read_bounded
from podvm_gpu.jsontext import dumps
from podvm_gpu.model import State, Status, now_iso, shown, shown_all

STATUS_PATH = "/run/podvm-gpu/status.json"
LOCK_PATH = "/run/podvm-gpu/boot.lock"  # boot's flock; readers only look it up (boot_lock_held)
_INFO = 6  # journal.py Log.INFO


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
        # steps that run at the same time write through one lock (one temporary name each);
        # _thread, not threading: the CPU fast path writes the status too
        self._lock = _thread.allocate_lock()

    def write(self, status: Status) -> None:
        """Write ``status`` (mode 0644); one writer at a time.

        Raises:
            OSError: the run directory cannot be resolved, created or written.
        """
        if not self.enabled:
            return
        with self._lock:
            self.path = write_status(self.root, status.to_dict())

    def finish(self, status: Status, state: State, reason: str | None) -> None:
        """Set the final state, reason and finish time, then write."""
        status.state = state
        status.reason = reason
        status.finished_at = now_iso()
        self.write(status)


def write_status(root: Root, doc: dict) -> str:
    """The one writer of status.json (boot's :class:`StatusFile` and the watcher's finding,
    podvm_gpu/ending.py): replace it with ``doc`` atomically (mode 0644; its folder made 0755),
    every string shown (issue 47: no reader refuses what was written); the caller holds the
    boot's lock. Returns the file's real path.

    Raises:
        OSError: the run directory cannot be resolved, made or written.
    """
    # resolved on every write: a link planted meanwhile is followed chroot-style only
    path = root.resolve(STATUS_PATH, follow_last=False)
    ensure_dir(os.path.dirname(path))
    atomic_write(path, dumps(shown_all(doc)) + "\n")
    return path


def acquire_lock(root: Root, timeout_s: float, log) -> int | None:
    """Take ``/run/podvm-gpu/boot.lock`` (flock, exclusive): one boot at a time on a root.

    A second boot waits for the first, at most ``timeout_s`` seconds, and writes nothing before
    it holds the lock. The kernel releases a flock when its holder dies, so a killed boot never
    leaves the lock held. The file descriptor is close-on-exec: no tool or daemon inherits it.

    Returns:
        The lock's file descriptor (kept open for the rest of the boot), or None when the
        other boot still holds it after ``timeout_s``.

    Raises:
        OSError: the run directory or the lock file cannot be made.
    """
    import fcntl

    path = root.resolve(LOCK_PATH, follow_last=False)
    ensure_dir(os.path.dirname(path))
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        os.unlink(path)  # a planted symlink: never lock (or create) what it names
        fd = os.open(path, flags, 0o644)
    deadline = time.monotonic() + timeout_s
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if waiting:
                log(_INFO, f"got {LOCK_PATH} after {time.monotonic() - deadline + timeout_s:.2f} s")
            return fd
        except BlockingIOError:
            pass
        if not waiting:
            waiting = True
            log(_INFO, f"another boot holds {LOCK_PATH}; waiting up to {timeout_s:g} s")
        if time.monotonic() >= deadline:
            os.close(fd)
            return None
        time.sleep(0.05)


# The files boot writes atomically in its run and spec folders (status.py, cdi/, steps/fabric.py's
# RUN_FM_CONFIG): only their temporaries are boot's to remove. The metrics exporter writes its
# textfile (/run/podvm-gpu/metrics.prom by default) in the same folder, without boot's lock.
# The kept nvattest outputs (steps/cc/attest/gate.py) and cdi.SPEC_PATH's and IMEX_SPEC_PATH's
# names (cdi is status's sibling layer; tests/test_boot_last_resort.py ties them).
# Not watch.json (podvm_gpu/watchfile.py), on purpose: the watcher writes it without the boot's
# lock (only a finding's application takes the lock), so a boot run by hand beside a live
# watcher would delete the temporary of a save in flight, and that save may be the finding
# (kept before it is applied). watch.json itself must outlive a boot run again: a standing
# finding fails that boot by name (boot/pipeline.py _standing_finding) until watch --clear; one
# of an earlier boot without a finding is harmless (the watcher takes its position only for
# the same boot_started_at). A watcher killed mid-write leaves at most one small temporary in
# /run (gone at reboot; no CDI reader looks there). tests/test_boot_start.py holds this.
OWN_FILES = {"/run/podvm-gpu": (os.path.basename(STATUS_PATH), "fabricmanager.cfg",
                                "nvattest-gpu.json", "nvattest-nvswitch.json"),
             "/var/run/cdi": ("nvidia.yaml", "nvidia-imex.yaml")}


def own_leftover(name: str, own: tuple[str, ...]) -> bool:
    """Whether ``name`` is the temporary of an atomic write of one of ``own`` (``.<name>.<pid>
    .tmp``, host/fs.py ``atomic_write``)."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return False
    target, _dot, pid = name[1:-len(TMP_SUFFIX)].rpartition(".")
    return target in own and pid.isdigit()


def remove_leftovers(root: Root) -> None:
    """Remove the temporary files of an earlier boot that was killed mid-write (``.<name>.<pid>
    .tmp`` of the files in :data:`OWN_FILES`, in the run and spec directories). Called with the
    lock held, so no other boot is writing them; another writer's temporaries (the exporter's
    textfile) are left alone."""

    for folder, own in OWN_FILES.items():
        try:
            real = root.resolve(folder)
            names = os.listdir(real)
        except OSError:
            continue
        for name in names:
            if own_leftover(name, own):
                try:
                    os.unlink(os.path.join(real, name))
                except OSError:
                    pass


class StatusUnreadable(ValueError):
    """The status file exists but is not a status document (not JSON, wrong types, a FIFO...)."""


MAX_STATUS_BYTES = 1 << 20  # the agent's own document is a few KiB


def load_status(root: Root) -> dict | None:
    """The status document under ``root``; None when there is none yet.

    The file is read as a bounded regular file, opened without blocking and without following
    a link in its last component (a FIFO or a device put there cannot hang a reader).

    Raises:
        StatusUnreadable: not a regular file, too large, not JSON (nested too deeply counts), or
            ``state``, ``reason`` or ``warnings`` do not have the types of contract section 4.
    """
    import json

    path = None
    try:
        path = root.resolve(STATUS_PATH, follow_last=False)
        data = read_bounded(path, MAX_STATUS_BYTES)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP and path is not None and os.path.islink(path):
            # O_NOFOLLOW met a link at the file itself: boot never writes one there
            raise StatusUnreadable(f"{STATUS_PATH} is a symbolic link, not the file boot "
                                   "writes (it replaces the file, never a link): someone "
                                   "else put it there") from None
        where = "" if path is not None else " (a folder on its way is a link loop)"
        raise StatusUnreadable(f"{STATUS_PATH}: {err.strerror or err}{where}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise StatusUnreadable(f"{STATUS_PATH} is not UTF-8 text (byte {err.start})") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise StatusUnreadable(f"{STATUS_PATH} is not JSON ({why})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), str) \
            or doc["state"] not in State.ALL:
        raise StatusUnreadable(f"{STATUS_PATH} has no valid state (one of "
                               f"{', '.join(State.ALL)})")
    warnings = doc.get("warnings", [])
    if not isinstance(doc.get("reason"), (str, type(None))) or not isinstance(warnings, list) \
            or not all(isinstance(w, str) for w in warnings):
        raise StatusUnreadable(f"{STATUS_PATH}: reason or warnings have the wrong type")
    for text in [doc.get("reason") or "", *warnings]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): no writer of ours makes one
            raise StatusUnreadable(f"{STATUS_PATH}: reason or warnings are not text") from None
    if doc["state"] == State.READY:
        why = not_ready_why(doc)
        if why:
            raise StatusUnreadable(f"{STATUS_PATH} says ready, but {why}")
    return doc


# The steps of a ready boot, in order, and the results each may have (contract section 4.2;
# docs/status.schema.json's rule for ready). Spelled out here: this module is standard library
# only, and jsonschema is a test-only dependency.
READY_STEPS = (("detect", ("ok",)), ("drivers", ("ok",)), ("modules", ("ok",)),
               ("versions", ("ok",)), ("device-nodes", ("ok",)), ("persistenced", ("ok",)),
               ("fabricmanager", ("ok", "skipped")),
               ("confidential-computing", ("ok", "skipped")), ("cdi", ("ok",)))
_PCI_TEXT = ("pci_address", "vendor_id", "device_id", "class_code", "name")


def not_ready_why(doc: dict) -> str | None:
    """Why a document whose ``state`` is ``ready`` breaks the rules that make ready true, or
    None when it keeps them (issue 35 item 8: a hand-edited ``{"state": "ready", "gpus":
    "lots"}`` was ready to every reader).

    The rules (contract sections 4.1 and 4.2): ``reason`` null; ``finished_at`` a string;
    ``gpus`` a non-empty list of PCI objects (``pci_address``, ``vendor_id``, ``device_id``,
    ``class_code``, ``name`` strings, ``driver`` a string or null); ``driver_version`` a
    non-empty string; ``cdi`` an object whose ``path`` and ``kind`` are strings and whose
    ``devices`` are strings that include ``0`` and ``all``; ``steps`` exactly
    :data:`READY_STEPS`, in order, each an object with a string ``message`` and ``started_at``,
    a number ``duration_s`` and a result that step may have when ready. A minimal or version-1
    document is held to the same rules (section 4.4).

    Args:
        doc: a status document whose ``state`` is ``ready``.

    Returns:
        One clause naming the first rule broken (``gpus is "lots", not a non-empty list of
        PCI objects``), or None.
    """
    def typed(key, kinds, what):
        value = doc.get(key)
        return None if isinstance(value, kinds) else f"{key} is {_brief(value)}, not {what}"

    return (_gpus_why(doc.get("gpus")) or _cdi_why(doc.get("cdi"))
            or _steps_why(doc.get("steps"))
            or typed("driver_version", str, "a version")
            or ("driver_version is empty" if not doc["driver_version"] else None)
            or typed("finished_at", str, "a time")
            or (f"reason is {_brief(doc['reason'])}, not null" if doc.get("reason") is not None
                else None))


def _brief(value) -> str:
    """A value for a reason: missing, or its JSON text cut to 40 characters."""
    import json

    if value is None:
        return "missing or null"
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (ValueError, RecursionError):  # nested as deeply as the reader takes
        return f"a {type(value).__name__} nested too deeply"
    return text if len(text) <= 40 else text[:37] + "..."


def _gpus_why(gpus) -> str | None:
    if not isinstance(gpus, list) or not gpus:
        return f"gpus is {_brief(gpus)}, not a non-empty list of PCI objects"
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not all(isinstance(gpu.get(k), str) for k in _PCI_TEXT) \
                or not isinstance(gpu.get("driver", 0), (str, type(None))):
            return f"gpus[{i}] is {_brief(gpu)}, not a PCI object"
    return None


def _cdi_why(cdi) -> str | None:
    if not isinstance(cdi, dict):
        return f"cdi is {_brief(cdi)}, not the installed spec's object"
    devices = cdi.get("devices")
    if not isinstance(cdi.get("path"), str) or not isinstance(cdi.get("kind"), str) \
            or not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        return f"cdi is {_brief(cdi)}, not {{path, kind, devices: [names]}}"
    if "0" not in devices or "all" not in devices:
        return f"cdi.devices {_brief(devices)} lack 0 or all"
    return None


def _steps_why(steps) -> str | None:
    if not isinstance(steps, list):
        return f"steps is {_brief(steps)}, not a list of steps"
    names = [step.get("name") if isinstance(step, dict) else None for step in steps]
    if names != [name for name, _ in READY_STEPS]:
        return (f"its steps are {_brief(names)}, not every GPU step once in order "
                f"({', '.join(name for name, _ in READY_STEPS)})")
    for step, (name, results) in zip(steps, READY_STEPS):
        if step.get("result") not in results:
            return f"step {name} is {_brief(step.get('result'))}, not {' or '.join(results)}"
        if not isinstance(step.get("message"), str) or not isinstance(step.get("started_at"), str) \
                or isinstance(step.get("duration_s"), bool) \
                or not isinstance(step.get("duration_s"), (int, float)):
            return f"step {name} is {_brief(step)}, not a step object"
    return None


def read_status(root: Root) -> dict | None:
    """Like :func:`load_status`, but None also when the file is unreadable."""
    try:
        return load_status(root)
    except StatusUnreadable:
        return None


ORPHANED = ("no boot holds /run/podvm-gpu/boot.lock: the boot that wrote this state ended "
            "without writing a final one (its final write failed, a full disk: the journal and "
            "the console line say so; or it was killed: SIGKILL, the OOM killer, a crash)")


def boot_lock_held(root: Root) -> bool | None:
    """Whether a process holds the boot's flock on ``/run/podvm-gpu/boot.lock``, read from
    ``/proc/locks`` (the kernel's list of every lock: ``FLOCK ADVISORY WRITE <pid>
    <major>:<minor>:<inode>``) without taking it. Boot makes the lock file before its first
    status write, never removes it and holds the lock until it exits, so a ``running`` state
    with the lock free is one no boot will finish; so is one with no lock file at all (False).
    None when it cannot tell (the lock file cannot be looked up, no ``/proc/locks``)."""
    try:
        info = os.stat(root.resolve(LOCK_PATH, follow_last=False))
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read(1 << 20)
    except OSError:
        return None
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == device
               for fields in (line.split() for line in table.splitlines()))


def orphaned(root: Root, doc: dict | None) -> bool:
    """A ``running`` status that no boot will finish: the lock is free and, read again after
    that, the file still says ``running`` (a boot that just ended has written its final state
    before it let go of the lock)."""
    if not doc or doc.get("state") != State.RUNNING or boot_lock_held(root) is not False:
        return False
    again = read_status(root)
    return bool(again) and again.get("state") == State.RUNNING


def exit_code_for(doc: dict | None) -> int:
    """``podvm-gpu status`` exit code: 0 ready/no-gpu, 1 failed, 3 running or no status (contract 1)."""
    state = (doc or {}).get("state")
    if state in (State.READY, State.NO_GPU):
        return 0
    if state == State.FAILED:
        return 1
    return 3


def _signature(path: str) -> tuple | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def wait_for_final(root: Root, timeout_s: float, poll_s: float = 0.02) -> dict | None:
    """Wait until the status file's state is final or ``timeout_s`` seconds pass.

    The file is stat()ed every ``poll_s`` seconds (20 ms: a final write is seen within that,
    at the cost of a system call, not a busy loop) and read again only when its inode, time
    or size changed (boot replaces it atomically, so each write is a new inode).

    Returns the last document read (None if none appeared).

    Raises:
        StatusUnreadable: at the timeout, the file is there but garbled.
    """
    deadline = time.monotonic() + timeout_s
    try:
        path = root.resolve(STATUS_PATH, follow_last=False)
    except OSError:
        path = None
    seen: tuple | None = ()
    checked_lock = 0.0
    while True:
        now = _signature(path) if path else None
        if now != seen:
            seen = now
            doc = read_status(root)
            if doc and doc.get("state") in State.FINAL:
                return doc
        if time.monotonic() - checked_lock >= 1.0:  # a killed boot never writes again
            checked_lock = time.monotonic()
            doc = read_status(root)
            if orphaned(root, doc):
                return doc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return load_status(root)  # raises StatusUnreadable for a garbled file
        time.sleep(min(poll_s, remaining))


def _why_none(root: Root) -> str:
    """Why there is no status file: boot refuses to write under the root (the words of check's
    status row, issue 47 item 19), or it has not run."""
    from podvm_gpu.host.fs import untrusted_dirs

    try:
        refused = untrusted_dirs(root, (os.path.dirname(STATUS_PATH), "/var/run/cdi"))
    except OSError:
        refused = None
    if refused:
        return f"boot refuses to write under {root.path}: {refused}"
    return "podvm-gpu boot has not run"


def run_status(root_dir: str, json_out: bool = False, wait: bool = False,
               timeout: float = 300.0) -> int:
    """``podvm-gpu status``: print the state (and reason, warnings) or, with ``json_out``, one
    JSON document; return 0 ready/no-gpu, 1 failed, 3 running, none yet or unreadable.

    Args:
        root_dir: the root (contract section 1).
        wait: block until the state is final, at most ``timeout`` seconds.
    """
    import json

    root = Root(root_dir)
    started = time.monotonic()
    try:
        doc = wait_for_final(root, timeout) if wait else load_status(root)
    except StatusUnreadable as err:
        if json_out:
            print(json.dumps({"state": None, "error": f"unreadable status file: {err}"}, indent=2))
        else:
            print(f"unreadable status file: {err}")
        return 3
    if json_out:
        print(json.dumps(doc if doc is not None else {"state": None}, indent=2))
    elif doc is None:
        print(f"no status yet: {_why_none(root)}")
    else:
        reason = doc.get("reason")
        if doc.get("state") == State.RUNNING and orphaned(root, doc):
            reason = ORPHANED
        print(f"{doc.get('state')}" + (f": {shown(reason)}" if reason else ""))
        cc = doc.get("confidential_computing")
        if isinstance(cc, dict):  # the CC classification (docs/interface.md 3.11)
            kind = "confidential" if cc.get("confidential") is True else "not confidential"
            print(f"confidential computing: mode {shown(str(cc.get('mode') or 'unknown'))}, {kind}")
        for warning in doc.get("warnings") or []:
            print(f"warning: {shown(warning)}")
    if wait and not (doc and (doc.get("state") in State.FINAL or orphaned(root, doc))):
        # a bare "running" read as if --wait had returned on its own (issue 35 item 18); with
        # --json stdout stays one document, so the line goes to stderr
        said = f"status --wait: timed out after {time.monotonic() - started:.1f} s " \
            f"(--timeout {timeout:g}) before a final state"
        print(said, file=sys.stderr if json_out else sys.stdout)
    return exit_code_for(doc)
