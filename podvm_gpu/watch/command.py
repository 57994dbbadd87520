"""``podvm-gpu watch``: the watcher's loop, the finding applied, ``--clear`` (the package's
docstring, podvm_gpu/watch/__init__.py, says what it does and why)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time

from podvm_gpu import watchfile as watch_state
from podvm_gpu.gpufacts.finding import RESET
from podvm_gpu.host.fs import Root
from podvm_gpu.host.kmsg_follow import BOOT_READY, KernelLog, drain_events, wait_readable
from podvm_gpu.model import State, now_iso, shown
from podvm_gpu.status import read_status
from podvm_gpu.watch import daemons, verdicts
from podvm_gpu.watch.act import apply_finding, watched
from podvm_gpu.watch.once import apply_pending, clear_finding, read_config, refused_root, say

SAVE_EVERY_S = 10.0  # the position in watch.json: at most this old while records arrive
RETRY_S = 5.0  # a finding not applied yet (the lock held by a boot, a spec write refused)


class Stop(Exception):
    """SIGTERM or SIGINT: stop watching, keep the position."""


def nothing_to_watch(root: Root, doc: dict | None) -> str | None:
    """Why there is nothing to watch under ``root`` (the boot did not end ``ready`` with GPUs,
    or a finding stands), or None when there is."""
    if doc is None:
        return "no status: podvm-gpu boot has not run (or its status is unreadable)"
    if doc.get("state") != State.READY:
        reason = doc.get("reason")
        return f"the boot ended {doc.get('state')}" + (f": {shown(reason)}" if reason else "")
    if not doc.get("gpus"):
        return "the boot found no GPU"
    finding = watch_state.standing_finding(root)
    if finding:
        return f"a finding stands: {shown(finding['reason'])} (clear it with {watch_state.CLEAR_COMMAND})"
    return None


BAD_CONFIG = 2  # exit status of a bad config, as metrics' (podvm-gpu-watch.service does not
# restart on it: RestartPreventExitStatus=2; a restart every RestartSec would fail the same way)


def run_watch(root_dir: str, config: str | None = None, json_out: bool = False,
              clear: bool = False) -> int:
    """``podvm-gpu watch``: watch until a fatal finding (exit 0 once it is applied), a signal
    (exit 0, position kept) or an error that stops the watcher (exit 1: systemd restarts it).
    With ``clear``: remove a standing finding (:func:`clear_finding`; it reads no config).
    Nothing to watch (a CPU VM, a boot that did not end ready): one line, exit 0 at once.

    A bad config (invalid, a named one missing, one boot would not trust) is the error every
    other command makes of it: ``podvm-gpu: error: <file>: <what is wrong>`` on stderr (the
    journal, at priority error), exit :data:`BAD_CONFIG` (2, as ``metrics``), nothing watched
    or written; before issue 35's leftovers the watcher took the defaults with a warning. One
    exception, failing closed: a finding kept but not applied yet is applied with the
    defaults (and the config's error said as well), since the spec must not keep a GPU that
    failed because the config broke since.

    Args:
        root_dir: the root (contract section 1); config: ``--config`` or None.
    """
    from podvm_gpu.journal import Log

    root = Root(root_dir)
    log = Log()
    if clear:
        return clear_finding(root, log, json_out)
    doc = read_status(root)
    pending = watch_state.load(root)
    cfg, config_error = read_config(root, config)
    if pending and pending.get("finding") and not pending["finding"].get("applied") \
            and watched(doc, pending.get("boot_started_at")):
        if config_error:
            log(log.ERR, f"{config_error}; the finding kept in {watch_state.WATCH_PATH} is "
                         "applied with the defaults")
        return 1 if refused_root(root, log) else apply_pending(root, cfg, doc, pending, log,
                                                            json_out)
    if config_error:
        log(log.ERR, f"{config_error}; not watching: fix it (podvm-gpu config says what is "
                     f"wrong), then start {watch_state.WATCH_UNIT} again")
        if json_out:
            say(True, {"watching": False, "error": config_error}, "")
        return BAD_CONFIG
    why = nothing_to_watch(root, doc)
    if why:
        say(json_out, {"watching": False, "why": why}, f"nothing to watch: {why}")
        return 0
    if refused_root(root, log):
        return 1
    watcher = Watcher(root, cfg, doc, log)
    code = watcher.run()
    if watcher.finding:
        say(json_out, {"watching": False, "finding": watcher.finding},
             f"failed: {watcher.finding['reason']}")
    return code


class Watcher:
    """One run of the watcher over the boot whose status document is ``doc``."""

    def __init__(self, root: Root, config, doc: dict, log):
        from podvm_gpu.config.model import timeouts_for
        from podvm_gpu.host.proc import Runner

        self.root, self.config, self.doc, self.log = root, config, doc, log
        self.gpus = [g["pci_address"] for g in doc.get("gpus") or []]
        cc = doc.get("confidential_computing") or {}
        self.confidential = cc.get("confidential") is True
        self.runner = Runner(config.tools, timeouts_for(config), trust_tool_paths=True)
        self.interval = config.watch.interval_s
        self.finding: dict | None = None
        self.polls = queue.Queue()
        self.stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.state = watch_state.new_state(doc.get("started_at"))
        self.klog: KernelLog | None = None
        self._saved_seq, self._saved_at = None, 0.0
        self._signalled = 0
        self.xids_seen: set[int] = set()  # Xid codes read so far: their follow-ons are no news
        self.fabric_health: list | None = None  # a poll's new fabric.health, for watch.json

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        old = {s: signal.signal(s, self._stop) for s in (signal.SIGTERM, signal.SIGINT)}
        poller = threading.Thread(target=self._poll_loop, name="watch-poll", daemon=True)
        try:
            self._start()
            poller.start()
            while self.finding is None:
                self._check_signal()
                if self.klog is not None:
                    unsaved = self.state["kmsg_seq"] != self._saved_seq
                    self.klog.wait(SAVE_EVERY_S if unsaved else 3600.0, self._wake_r)
                    self._records(self.klog.read())
                    if self.state["kmsg_seq"] != self._saved_seq and \
                            time.monotonic() - self._saved_at >= SAVE_EVERY_S:
                        self._save()  # a restart after a crash reads little again
                else:
                    wait_readable([self._wake_r], 3600.0)  # the polls wake it
                drain_events(self._wake_r)
                while self.finding is None:
                    try:
                        self._verdicts(*self.polls.get_nowait())
                    except queue.Empty:
                        break
                    self._note_nvml()
                health, self.fabric_health = self.fabric_health, None
                if health is not None:  # the exporter's DCGM_FI_DEV_FABRIC_HEALTH_* (issue 44)
                    self.state["fabric_health"] = health
                    self._save()
            return self._apply()
        except Stop:
            self.log(self.log.INFO, "watch: stopped by a signal; position kept")
            self._save()
            return 0
        except Exception as err:  # a bug: said in one line; systemd starts it again
            self.log(self.log.ERR, f"watch: internal error: {type(err).__name__}: {err}")
            return 1
        finally:
            self.stopping.set()
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            for s, handler in old.items():
                signal.signal(s, handler)
            if self.klog is not None:
                self.klog.close()
            poller.join(timeout=1)  # a poll in flight ends with its query's timeout
            if not poller.is_alive():  # else it may still write: the process ends soon anyway
                for fd in (self._wake_r, self._wake_w):
                    os.close(fd)

    def _stop(self, signum, frame):
        # noted, not raised here: a write in progress (watch.json, the spec, status.json)
        # finishes; the loop's waits wake on the pipe and raise Stop between writes
        self._signalled = signum
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"s")

    def _check_signal(self) -> None:
        if self._signalled:
            raise Stop()

    def _start(self) -> None:
        saved = watch_state.load(self.root)
        position = None
        if saved and saved.get("boot_started_at") == self.doc.get("started_at") \
                and isinstance(saved.get("kmsg_seq"), int):
            self.state, position = saved, saved["kmsg_seq"]
            self.state.setdefault("warnings", [])
            self.state.setdefault("warnings_dropped", 0)
        self.state["started_at"] = now_iso()
        after, last = self._first_read(position)
        if position is None:
            # the boot's own final "ready" line is the position it reached; without it (a file
            # log, a line that could not be written) everything already there counts as before
            position = after[0] if after[0] is not None else last
        self.state["kmsg_seq"] = position
        self._records([r for r in after[1] if r.seq > position])
        self._pids = daemons.running(self.root)
        self._save()
        self._daemons_missing_at_start()
        how = "" if self.klog is None or self.klog.event_driven else \
            " (no inotify: the file is looked at once a second)"
        # -1: the log held no record when the watcher started (a position, not a record)
        where = "kernel log not read" if self.klog is None else \
            "kernel log from its start (no record in it yet)" if position < 0 else \
            f"kernel log after record {position}"
        self.log(self.log.INFO, f"watch: watching {len(self.gpus)} GPU(s): {where}{how}, polls "
                                f"every {self.interval:g} s")

    def _first_read(self, position: int | None) -> tuple[tuple[int | None, list], int]:
        """Read the log up to now, 10,000 records at a time, keeping only those that may be
        judged: after ``position`` (a restart), else after the boot's last ``ready`` line (at
        most 10,000 of them: memory stays bounded whatever the log holds). Returns ``((the
        ready line's seq or None, the records kept), the last seq read or -1)``."""
        try:
            self.klog = KernelLog(self.root)
        except OSError as err:
            self.klog = None
            self._warn(f"the kernel log cannot be read ({err.strerror or err}): Xid records "
                       "are not watched; the polls go on")
            return (None, []), -1
        mark, kept, last = None, [], -1
        while True:
            batch = self.klog.read()
            if not batch:
                return (mark, kept[-10000:]), last
            for record in batch:
                last = record.seq
                if position is None and not record.kernel and BOOT_READY.search(record.message):
                    mark, kept = record.seq, []
                elif (position is not None and record.seq > position) or mark is not None:
                    kept.append(record)
            del kept[:-10000]

    def _save(self) -> None:
        self._saved_seq, self._saved_at = self.state["kmsg_seq"], time.monotonic()
        self.state["updated_at"] = now_iso()
        try:
            watch_state.save(self.root, self.state)
        except OSError as err:
            self.log(self.log.WARNING, f"watch: cannot write {watch_state.WATCH_PATH}: "
                                       f"{err.strerror or err}")

    # --- judging ----------------------------------------------------------------------------

    def _records(self, records) -> None:
        for record in records:
            if self.finding is not None:
                return
            if self.state["kmsg_seq"] is not None and record.seq <= self.state["kmsg_seq"]:
                continue  # read already (a restarted watcher), or before the boot
            self.state["kmsg_seq"] = record.seq
            if not record.kernel:
                continue
            found = verdicts.judge_record(record.message, self.xids_seen,
                                          self.config.health.reset_pending_warns)
            if found:
                self._verdicts(found, [], source=f"kernel log record {record.seq}",
                               quote=record.message)

    def _verdicts(self, found, unread, source: str = "poll", quote: str = "") -> None:
        for line in unread:
            self._warn(f"a poll could not read a fact ({line}): nothing was judged from it "
                       "this time; the next poll reads it again")
        for v in found:
            if self.finding is not None:
                return
            if v.gpu is not None and not any(verdicts.same_gpu(v.gpu, g) for g in self.gpus):
                self._warn(f"{v.what} (GPU {v.gpu} is not one the spec holds)")
                continue
            if not v.fatal:  # a warning; a reset needed is one with health.reset_pending_warns
                self._warn(v.what + (" (health.reset_pending_warns)" if v.action == RESET else ""))
                continue
            self._found(v, source, quote)

    def _found(self, v, source: str, quote: str) -> None:
        gpu = next((g for g in self.gpus if v.gpu and verdicts.same_gpu(v.gpu, g)), None)
        at = now_iso()
        named = f"GPU {gpu}" if gpu else "a GPU"
        what = v.what if not quote else f'{v.what} (kernel: "{" ".join(quote.split())[:300]}")'
        reason = f"watch: {named}: {what}; found at {at} ({source})"
        self.finding = {"gpu": gpu, "what": v.what, "source": source, "at": at,
                        "kmsg_seq": self.state["kmsg_seq"], "reason": reason[:900],
                        "applied": False, "ready_state": None}
        self.state["finding"] = self.finding
        self._save()  # kept first: a watcher killed now applies it at its restart

    def _warn(self, text: str) -> None:
        text = " ".join(text.split())[:400]
        if watch_state.add_warning(self.state, text, now_iso()):
            self.log(self.log.WARNING, f"watch: {text}")
            self._save()
            self._status_warning(f"watch: {text}")
            return
        flood = watch_state.flood_note(self.state, text)  # at 10, 100, 1000, ... repeats
        if flood:
            self.log(self.log.WARNING, f"watch: {flood}")

    def _status_warning(self, text: str) -> None:
        """Add ``text`` to status.json's warnings, under the boot's lock (a boot running again
        owns the file meanwhile: then the warning stays in watch.json only)."""
        from podvm_gpu.status import acquire_lock, write_status

        try:
            fd = acquire_lock(self.root, 0.5, lambda *a: None)
        except OSError:
            return
        if fd is None:
            return
        try:
            doc = read_status(self.root)
            if not doc or doc.get("state") != State.READY or doc.get("started_at") != \
                    self.doc.get("started_at"):
                return
            kept = [w for w in doc.get("warnings") or [] if w.startswith("watch: ")]
            if text in kept or len(kept) >= watch_state.MAX_WARNINGS:
                return
            doc["warnings"] = [*(doc.get("warnings") or []), text]
            write_status(self.root, doc)
        except OSError:
            pass
        finally:
            os.close(fd)

    # --- polls (on their own thread, one at a time) -----------------------------------------

    def _poll_loop(self) -> None:
        from podvm_gpu.steps.context import harmless_timeout

        timeout = harmless_timeout(self.runner, "nvidia-smi")
        fabric = any(s.get("name") == "fabricmanager" and s.get("result") == "ok"
                     for s in self.doc.get("steps") or [])
        health_read = bool((self.doc.get("fabric") or {}).get("health"))  # 580's (issue 44)
        while not self.stopping.wait(self.interval):
            seen: dict | None = {} if health_read else None
            try:
                found, unread = verdicts.poll_health(self.runner, timeout,
                                                     self.config.health.reset_pending_warns)
                if fabric:
                    more, why = verdicts.poll_fabric(self.runner, timeout, self.gpus, seen)
                    found, unread = found + more, unread + why
                found += daemons.gone(self.root, self._pids, self.confidential, self.runner,
                                      self.config, self.stopping)
            except Exception as err:  # a poll that breaks is a warning, never a verdict
                found, unread = [], [f"a poll failed: {type(err).__name__}: {err}"]
            health = (seen or {}).get("fabric_health")
            if health is not None and health != self.state.get("fabric_health"):
                self.fabric_health = health  # watch.json's, written by the main thread
            if found or unread or self.runner.nvml_hung or self.state.get("nvml_hung") or \
                    self.fabric_health is not None:
                self.polls.put((found, unread))  # (a hang's end too: _note_nvml)
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"p")

    def _note_nvml(self) -> None:
        """watch.json's ``nvml_hung`` (check's watch row, ``podvm_gpu_watch_nvml_hung``): the
        runner's refusal of NVML clients since one hung (host/proc.py: it ends when a later
        one exits 0, tried every NVML_RETRY_S), or None. A hang is a warning, never a finding."""
        from podvm_gpu.host.proc import NVML_RETRY_S

        hung = self.runner.nvml_hung or None
        if (self.state.get("nvml_hung") or {}).get("what") != hung:
            self.state["nvml_hung"] = {"what": hung, "since": now_iso(),
                                       "retry_after_s": NVML_RETRY_S} if hung else None
            self._save()

    def _daemons_missing_at_start(self) -> None:
        """Warn when the boot's nvidia-persistenced is not running as the watcher starts: only
        the daemons that run at its start are watched (4.5), so it would go unsaid (issue 47)."""
        steps = [s for s in self.doc.get("steps") or [] if isinstance(s, dict)]
        if "nvidia-persistenced" not in self._pids and any(
                s.get("name") == "persistenced" and s.get("result") == "ok" for s in steps):
            self._warn("nvidia-persistenced, which the boot started, is not running at the "
                       "watcher's start: it is not watched nor started again; see its log "
                       "/run/podvm-gpu/nvidia-persistenced.log, then systemctl restart "
                       "podvm-gpu podvm-gpu-watch")

    # --- the finding ------------------------------------------------------------------------

    def _apply(self) -> int:
        """Apply :attr:`finding` (0 once applied): while the boot's lock cannot be had or the
        spec cannot be replaced, the watcher keeps running, says so once, and tries again every
        :data:`RETRY_S` seconds (a signal stops it; the finding kept in watch.json is applied
        by the next start)."""
        said = False
        while True:
            applied = apply_finding(self.root, self.config, self.runner, self.finding,
                                    self.confidential, self.doc.get("started_at"),
                                    self.log if not said else _quiet(self.log))
            self._save()
            if applied:
                return 0
            if not said:
                self.log(self.log.ERR, f"watch: the finding is not applied yet; trying again "
                                       f"every {RETRY_S:g} s")
                said = True
            wait_readable([self._wake_r], RETRY_S)
            drain_events(self._wake_r)
            self._check_signal()


def _quiet(log):
    """``log`` without its lines (a retry says nothing the first try did not)."""
    def quiet(priority: int, text: str) -> None:
        pass
    quiet.ERR, quiet.WARNING, quiet.INFO = log.ERR, log.WARNING, log.INFO
    return quiet
