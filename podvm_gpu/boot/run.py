"""What one boot run is, below both the CPU fast path (:mod:`podvm_gpu.boot`) and the GPU
pipeline (:mod:`podvm_gpu.boot.pipeline`): its log, its signals, its lock, the console line and
the one way it ends (the ending itself, the spec, the status and the console line, is
:mod:`podvm_gpu.ending`'s, which the watcher's finding calls too).

Every boot that gets its lock ends in a final state written to status.json, whatever happens:
a step's failure, the budget, a bug, SIGTERM or SIGINT (systemd's stop, shutdown,
``TimeoutStartSec=``), or a spec or status file that cannot be written. The final state line
also goes to the kernel log, which the serial console prints: in a confidential VM nobody can
log in, and the cloud's console log is where an operator looks.

Imported on every pod VM boot: the standard library's cheapest modules and the package's
stdlib-only modules only.
"""

from __future__ import annotations

import _signal
import os
import time

from podvm_gpu import ending
from podvm_gpu.cdi import SPEC_PATH as CDI_SPEC_PATH
from podvm_gpu.host import rtmr
from podvm_gpu.host.fs import Root
from podvm_gpu.journal import Log, tell_console
from podvm_gpu.model import State, Status, Step, StepResult, cut_reason
from podvm_gpu.status import STATUS_PATH, StatusFile

# The signals that end a boot `failed` (3.5): systemd's stop and Ctrl-C, and those whose default
# action would kill it mid-write, leaving `running` and temporary files (a hang-up, a stray
# kill -USR1, a SIGALRM from outside; the GPU path's budget timer tells its own SIGALRM apart)
_SIGNAL_NAMES = {_signal.SIGTERM: "SIGTERM", _signal.SIGINT: "SIGINT", _signal.SIGHUP: "SIGHUP",
                 _signal.SIGUSR1: "SIGUSR1", _signal.SIGUSR2: "SIGUSR2",
                 _signal.SIGALRM: "SIGALRM"}
_SIGNAL_WHY = {_signal.SIGINT: "Ctrl-C, or kill -INT",
               _signal.SIGTERM: "the unit was stopped, the VM is shutting down, or "
                                "TimeoutStartSec= passed",
               _signal.SIGHUP: "the terminal hung up, or kill -HUP"}


class Interrupted(BaseException):
    """SIGTERM, SIGINT or another signal of :data:`_SIGNAL_NAMES` arrived during the boot; a
    BaseException so that no step eats it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = _SIGNAL_NAMES.get(signum, f"signal {signum}")
        self.steps: list = []  # the steps in flight when it arrived, where the pipeline knows


class BudgetExpired(BaseException):
    """Raised by the budget's interval timer (:meth:`Signals.arm`) when the budget is spent; a
    BaseException so no step eats it."""


_ALARM_EARLY_S = 0.25  # a SIGALRM this long before the timer is due is one from outside


class Signals:
    """SIGTERM, SIGINT and the other signals of :data:`_SIGNAL_NAMES` raise :class:`Interrupted`
    in the boot, and the budget's timer (SIGALRM at its due time) :class:`BudgetExpired`, until
    :meth:`finishing`; after that the timer is cancelled and every signal is only noted, so the
    ending's spec and status writes always complete.

    ``_signal`` is the C module under ``signal``; the Python module imports ``enum``, which costs
    the fast path more than the rest of its imports.
    """

    def __init__(self) -> None:
        self.late: list[str] = []
        self.ending = False
        self._due = 0.0  # when the budget's timer is due (time.monotonic()); 0: not armed
        self._previous = {s: _signal.signal(s, self._raise) for s in _SIGNAL_NAMES}

    def _raise(self, signum, frame):
        # the first signal (the budget's timer too) starts the ending: any later one (systemd's
        # again, a second Ctrl-C, the timer) is only noted, so it cannot cut the ending short
        # before its final status is written
        budget = signum == _signal.SIGALRM and self._due and \
            time.monotonic() >= self._due - _ALARM_EARLY_S
        self.finishing()
        if budget:
            raise BudgetExpired()
        raise Interrupted(signum)

    def _note(self, signum, frame):
        self.late.append(_SIGNAL_NAMES.get(signum, str(signum)))

    def arm(self, seconds: float) -> None:
        """Start the budget's timer: SIGALRM in ``seconds`` (> 0) raises :class:`BudgetExpired`
        in the main thread, unless the ending has begun. A SIGALRM that comes before it is due
        is one from outside (``kill -ALRM``) and ends the boot as any stray signal does."""
        if self.ending:
            return
        self._due = time.monotonic() + seconds
        _signal.setitimer(_signal.ITIMER_REAL, seconds)

    def disarm(self) -> None:
        """Cancel the budget's timer (nothing when it is not armed)."""
        if self._due:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            self._due = 0.0

    def finishing(self) -> None:
        """The ending begins: the timer cancelled, every later signal only noted."""
        self.ending = True
        for signum in _SIGNAL_NAMES:
            _signal.signal(signum, self._note)
        self.disarm()

    def restore(self) -> None:
        self.disarm()
        for signum, handler in self._previous.items():
            _signal.signal(signum, handler)


class Run:
    """One boot run: the root it works under, its status document and how it ends.

    Args:
        root: the root every host path is taken under.
        json_out: print the final status document on stdout instead of a summary line.
        dry_run: detect and plan only; nothing is written.
        log: where the log lines go.
    """

    def __init__(self, root: Root, json_out: bool, dry_run: bool, log: Log):
        self.started = time.monotonic()
        self.root, self.json_out, self.dry_run, self.log = root, json_out, dry_run, log
        self.status = Status()
        self.status_file = StatusFile(root, enabled=not dry_run)
        self.signals: Signals | None = None
        self.write_spec = True  # the config's unavailable_spec
        self.metrics = None  # the config's metrics settings, when there is a config
        self.budget_s = 240.0  # the config's budget_s once read (boot/__init__.py)
        self.locked = False  # boot.lock is held (boot/__init__.py)
        self.lock_wait_s = 0.0  # how long it waited for the lock: not detect's time (issue 47)
        self.bind_mode, self._bind_tried = "auto", False  # confidential_computing.bind; ran
        # the ending under way (:meth:`end`, :meth:`end_ready`): its state and reason, for
        # :meth:`last_resort` should the ending itself raise; None before it begins
        self.ending: tuple[str, str | None] | None = None

    def finishing(self) -> None:
        """The ending begins: the budget's timer cancelled and later signals only noted
        (:meth:`Signals.finishing`). Called first by every way a boot ends."""
        if self.signals:
            self.signals.finishing()

    def running_step(self) -> Step:
        """The step in flight (the earliest one still ``running``: several run at once after
        persistenced), else the last step."""
        return next((s for s in self.status.steps if s.result == StepResult.RUNNING),
                    self.status.steps[-1])

    def end(self, state: str, reason: str) -> int:
        """End a boot without a usable GPU (``no-gpu`` or ``failed``): the unavailable spec
        (unless the config turned it off: then any earlier spec is removed, so nothing looks
        ready), other ``nvidia.com/gpu`` specs renamed aside, the final status, the console
        line, the report. A spec that cannot be written makes the end ``failed`` with the write
        error named, and the status is still written. Returns 0 for no-gpu, else 1."""
        state, reason = self.bind_end(state, reason)
        # one line, and no control character (ESC, NUL) for the console, the journal, the
        # spec's environment or a terminal: escaped as \xNN
        reason = cut_reason(reason)
        if self.dry_run:
            return self._dry_run_end(state, reason)
        self.finishing()
        self.ending = (state, reason)
        from podvm_gpu import cdi

        self.status.warnings.extend(cdi.disable_duplicates(self.root))
        self.status.cdi = None  # the ready spec, if one was installed, is replaced or removed
        return self._final(state, reason)

    def end_ready(self) -> int:
        """End a ``ready`` boot (the pipeline has installed the spec): final status, console
        line, report. A status that cannot be written ends the boot ``failed`` instead, with
        the unavailable spec: a boot nobody can read the outcome of is not ready."""
        self.finishing()
        state, reason = self.bind_end(State.READY, None)
        if reason:  # the binding broke: failed, named (3.14)
            return self.end(state, reason)
        self.ending = (State.READY, None)
        gpus = self.status.gpus
        names = ", ".join(sorted({g.name for g in gpus}))
        self.log(Log.INFO, f"ready in {time.monotonic() - self.started:.3f} s: "
                           f"{len(gpus)} GPU(s) ({names})")
        return self._final(State.READY, None, keep_spec=True)

    def bind_end(self, state: str, reason: str | None) -> tuple[str, str | None]:
        """The end's binding once (bind.py's ``at_end``; no register: one ``stat``)."""
        if self.dry_run or self._bind_tried or not self.locked:  # the log is the lock's too
            return state, reason
        self._bind_tried = True
        if self.status.binding is None and self.bind_mode == "auto" and not rtmr.present(self.root):
            self.status.binding = rtmr.binding_record("unbound", reason=rtmr.UNBOUND_REASON)
            return state, reason
        from podvm_gpu.steps.cc.bind import at_end
        return at_end(self, state, reason)

    def _final(self, state: str, reason: str | None, keep_spec: bool = False) -> int:
        state, reason, _written = ending.finish(
            self.root, state, reason, self._write_final, self.log, keep_spec=keep_spec,
            unavailable_spec=self.write_spec, line=self._ready_line())
        if state == State.FAILED:
            self.status.state, self.status.reason, self.status.cdi = state, reason, None
        if self.metrics is not None and self.metrics.textfile:
            self._write_metrics_textfile()
        report(self.status, self.json_out)
        return 0 if state in (State.READY, State.NO_GPU) else 1

    def _write_final(self, state: str, reason: str | None) -> None:
        if state == State.FAILED:
            for step in self.status.steps:  # a final document has no running step (4.3)
                if step.result == StepResult.RUNNING:
                    step.result, step.message = StepResult.FAILED, reason or ""
                    step.duration_s = time.monotonic() - step.started
        if not self.status.steps:  # ended before its first step (no lock, a bug): the
            # document still has its detect step (4.1: steps start with detect)
            self.status.steps.append(Step("detect", StepResult.SKIPPED,
                                          "not run: the boot ended before its first step"))
        self.status_file.finish(self.status, state, reason)

    def _write_metrics_textfile(self) -> None:
        """The boot's metrics for node-exporter's textfile collector (config metrics.textfile),
        after the status: they are read from it. A failure is a log line, not a failed boot."""
        from podvm_gpu.metrics.command import in_words, write_boot_textfile

        try:
            write_boot_textfile(self.root, self.metrics)
        except (OSError, ImportError) as err:  # in words, naming the textfile, not its temporary
            self.log(Log.WARNING, f"metrics: cannot write {self.metrics.textfile_path}: "
                                  f"{in_words(err)}")
        except Exception as err:  # anything else (a bug, a path the settings let by) too:
            # the boot's outcome is written already and must not change for the textfile
            self.log(Log.WARNING, f"metrics: cannot write {self.metrics.textfile_path}: "
                                  f"internal error: {type(err).__name__}: {err}")

    def _ready_line(self) -> str:
        gpus = self.status.gpus
        return f"{len(gpus)} GPU(s) ({', '.join(sorted({g.name for g in gpus}))}), CDI spec " \
               f"{CDI_SPEC_PATH}"

    def dry_run_refusal(self, refusal: str) -> int:
        """What ``boot --dry-run`` says where a boot would refuse to write anything (an untrusted
        root): the refusal, no commands, exit 1 as the boot's."""
        if self.json_out:
            from podvm_gpu.jsontext import dumps

            print(dumps({"dry_run": True, "state": None, "reason": refusal, "commands": []}))
        else:
            print(f"dry run: boot would write nothing: {refusal}")
        return 1

    def unwritable(self) -> str | None:
        """Why a boot run by this user could not write its files under the root (the deepest
        existing folder of the status file's and the spec's is not writable: ``os.access``), or
        None. ``boot --dry-run`` says it rather than promise the writes (issue 47 item 22)."""
        for host_dir in (os.path.dirname(STATUS_PATH), os.path.dirname(CDI_SPEC_PATH)):
            try:
                folder = self.root.resolve(host_dir)
            except OSError as err:
                return f"{host_dir}: {err}"
            while not os.path.isdir(folder) and folder != os.path.dirname(folder):
                folder = os.path.dirname(folder)
            if not os.access(folder, os.W_OK | os.X_OK):
                return f"cannot write under {folder} (for {host_dir}) as uid {os.getuid()}"
        return None

    def _dry_run_end(self, state: str, reason: str) -> int:
        cannot = self.unwritable()
        if cannot:
            return self.dry_run_refusal(f"{state}: {reason}; but {cannot}")
        if self.json_out:
            from podvm_gpu.jsontext import dumps

            print(dumps({"dry_run": True, "state": state, "reason": reason, "commands": []}))
        else:
            print(f"dry run: {state}: {reason}; would write the unavailable spec and the status")
        return 0 if state == State.NO_GPU else 1

    def fail(self, reason: str) -> int:
        """End the boot ``failed`` with ``reason`` (the step and its cause): see :meth:`end`."""
        return self.end(State.FAILED, reason)

    def interrupted(self, signal: Interrupted) -> int:
        """End the boot ``failed`` after SIGTERM/SIGINT, naming the signal and the step in
        flight (the earliest, when several ran at once; the others are named too and fail
        alike); the daemons the boot started are left alone (they are not its children)."""
        steps = signal.steps or [self.running_step()]
        why = _SIGNAL_WHY.get(signal.signum, f"kill -{signal.name[3:]} from outside: boot "
                                             "takes no such signal")
        message = f"interrupted by {signal.name} ({why})"
        for step in steps:
            step.result, step.message = StepResult.FAILED, message
            step.duration_s = time.monotonic() - step.started
        also = f"; also in flight: {', '.join(s.name for s in steps[1:])}" if steps[1:] else ""
        return self.fail(f"{steps[0].name}: {message}{also}")

    def last_resort(self, err: BaseException) -> int:
        """End the boot ``failed`` when an ending raised (a bug or a broken install in the spec,
        status or console writes; a signal that came before the ending took over): the
        unavailable spec (or none, as the config says) and the final status, each written on its
        own whatever the other does, then the console line. The reason is the ending's, with
        ``ending: internal error: <Type>: <message>`` (or ``interrupted by SIGTERM``, ``the boot
        budget is spent``) appended. Never raises; writes only where the ending itself would
        have (not in a dry run, not before the boot's first step unless the ending had begun).
        Returns 1."""
        try:
            self.finishing()
        except BaseException:  # cannot make it worse: the writes still come
            pass
        try:
            what = f"interrupted by {err.name}" if isinstance(err, Interrupted) else \
                "the boot budget is spent" if isinstance(err, BudgetExpired) else \
                f"internal error: {type(err).__name__}: {err}"
            if self.ending is not None and self.ending[1]:
                reason = f"{self.ending[1]}; ending: {what}"
            elif self.ending is not None:
                reason = f"status: cannot end ready: {what}"
            else:
                reason = f"{self.running_step().name}: {what}" if self.status.steps \
                    else f"detect: {what}"
            reason = self.bind_end(State.FAILED, reason)[1] or reason  # a fail event (3.14)
            reason = cut_reason(reason)
        except BaseException:
            reason = "status: the boot's ending failed"
        try:
            self.log(Log.ERR, f"failed: {reason}")
        except BaseException:
            pass
        if self.dry_run or (self.ending is None and not self.status.steps):
            return 1
        try:
            ending.withdraw_spec(self.root, State.FAILED, reason, self.write_spec)
        except BaseException as spec_err:  # the status must still be written
            self.log(Log.ERR, f"cdi: cannot write {CDI_SPEC_PATH}: {type(spec_err).__name__}: "
                              f"{spec_err}")
        try:
            self.status.cdi = None
            self._write_final(State.FAILED, reason)
        except BaseException as status_err:
            self.log(Log.ERR, f"status: cannot write {STATUS_PATH}: "
                              f"{type(status_err).__name__}: {status_err}")
        try:
            tell_console(self.root, State.FAILED, reason)
        except BaseException:
            pass
        return 1

    def fail_unexpectedly(self, err: Exception) -> int:
        """End the boot ``failed`` after an error no step handled (a broken install, a bug),
        naming the step that was running."""
        step = self.running_step()
        step.result = StepResult.FAILED
        step.message = f"internal error: {type(err).__name__}: {err}"
        return self.fail(f"{step.name}: {step.message}")


def report(status: Status, json_out: bool) -> None:
    """Print the outcome on stdout: the status document with ``--json``, else one line."""
    try:
        if json_out:
            from podvm_gpu.jsontext import dumps
            from podvm_gpu.model import shown_all

            print(dumps(shown_all(status.to_dict())), flush=True)
            return
        if status.state == State.READY and status.cdi:
            detail = f"{len(status.gpus)} GPU(s), CDI spec {status.cdi['path']}"
        else:
            detail = status.reason
        print(f"{status.state}: {detail}" if detail else status.state, flush=True)
    except (OSError, ValueError):
        pass  # a closed stdout must not change the outcome
