"""Running external tools: argv lists only, a timeout on every call, a record of every call.

The one seam through which boot and check reach the OS's programs (modprobe, nvidia-ctk,
nvidia-smi, ...). A killed or failed command raises :class:`CommandError` with the argv, exit
status and whatever it printed, so a failure can name the step and the cause.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from podvm_gpu.errors import Cancelled, CommandError, exit_text
from podvm_gpu.nvidia_ctk import GENERATE, TOOL_ENV_ALLOWED
from podvm_gpu.record import REQUIRED, Record

DEFAULT_TIMEOUT_S = 30.0
# After a tool exits, how long its output may stay open (a helper finishing its last write)
# before the process holding it counts as kept running by the tool.
HELD_OPEN_GRACE_S = 0.5
_POLL_S = 0.05
# How long a killed tool is waited for before it is left to a thread to reap: a process that
# SIGKILL does not end sleeps in the kernel (state D: nvidia-smi stuck in the driver on B200 open
# modules 570/580, open-gpu-kernel-modules#971), and waiting for it would block the caller for good.
REAP_BOUND_S = 2.0
# How long an NVML client's timeout refuses the next ones (they wait on the same driver lock);
# after it one call goes through, and one that exits 0 ends the refusal at once (issue 46).
NVML_RETRY_S = 300.0
STATE_D = "in the kernel (state D)"


def nvml_client(argv: list[str]) -> bool:
    """True for a call that opens NVML: nvidia-smi (every subcommand), nvidia-ctk's CDI
    generation (``--mode=nvml``) and nvattest's evidence collection. They take the same driver
    lock, so one stuck in the driver blocks the next (pop-os/pop#4073, leptonai/gpud#117)."""
    return argv[0] == "nvidia-smi" or argv[:3] == GENERATE or \
        argv[:2] == ["nvattest", "attest"]


def tool_env(tool: str, env: dict[str, str]) -> dict[str, str]:
    """The environment ``tool`` runs with: ``env`` (the runner's, ``LC_ALL=C`` in it) for most
    tools; for those in :data:`~podvm_gpu.nvidia_ctk.TOOL_ENV_ALLOWED` (nvidia-ctk's and
    nvidia-cdi-hook's) only the variables listed there, plus
    ``LC_ALL=C``.

    Args:
        tool: the tool's name (``argv[0]``, e.g. ``nvidia-ctk``, or an absolute path, whose
            basename counts).
        env: the runner's environment.
    """
    allowed = TOOL_ENV_ALLOWED.get(os.path.basename(tool))
    if allowed is None:
        return env
    return {**{k: env[k] for k in allowed if k in env}, "LC_ALL": "C"}


def _in_kernel(pid: int) -> bool:
    """True when the process sleeps uninterruptibly (state D in /proc/<pid>/stat): in the
    kernel, as a client stuck in the driver is. Our own child, so the host's /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(4096).rsplit(b")", 1)[1].split()[0] == b"D"
    except (OSError, IndexError):
        return False


class Completed(Record):
    """A finished command: argv as run, exit status, text output, wall time in seconds."""

    FIELDS = (("argv", REQUIRED), ("returncode", REQUIRED), ("stdout", REQUIRED),
              ("stderr", REQUIRED), ("duration_s", REQUIRED))

    @property
    def output(self) -> str:
        """stdout and stderr together (some NVIDIA tools print errors on stdout)."""
        return self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr


class Runner:
    """Finds and runs external tools with timeouts.

    Args:
        tool_paths: tool basename -> absolute path from the config; others are looked up on PATH.
        timeouts: tool basename -> timeout in seconds for one call.
        deadline: a ``time.monotonic()`` value no call may run past (the boot budget), or None.
        env: the environment for the tools (default: ours, plus ``LC_ALL=C`` for parsable output);
            nvidia-ctk gets only part of it (:func:`tool_env`).
        read_only: when True (``check``), :meth:`spawn` is refused: only queries may run.
        trust_tool_paths: check that a tool, configured or found on PATH, and every directory
            above it, only root can change before running it (boot, which runs them as root);
            :func:`podvm_gpu.host.fs.untrusted_because`.
    """

    def __init__(self, tool_paths: dict[str, str] | None = None,
                 timeouts: dict[str, float] | None = None, deadline: float | None = None,
                 env: dict[str, str] | None = None, read_only: bool = False,
                 trust_tool_paths: bool = False):
        self.tool_paths = dict(tool_paths or {})
        self.timeouts = dict(timeouts or {})
        self.deadline = deadline
        self.env = dict(os.environ if env is None else env)
        self.env["LC_ALL"] = "C"
        self.read_only = read_only
        self.trust_tool_paths = trust_tool_paths
        self.calls: list[list[str]] = []
        self.cancelled = ""  # why calls are refused and the ones in flight were ended
        # the NVML client that timed out: no further one is started for NVML_RETRY_S seconds
        # (nvml_hung_at, monotonic), or until one exits 0
        self.nvml_hung = ""
        self.nvml_hung_at = 0.0
        self.unreaped = 0  # killed tools that did not exit within REAP_BOUND_S (left to threads)
        self._live: set[subprocess.Popen] = set()
        self.spawns = 0  # tool calls started so far (:meth:`wait_for_spawn`)
        self._spawned = threading.Condition()
        # called once each, with no argument, right after the next tool call's process
        # started, in the caller's thread, then cleared: what may run while the boot waits on
        # that tool (boot/pipeline.py: the later steps' imports, nvidia-ctk's version; issue 38);
        # see _run_next_spawn_hooks
        self.at_next_spawn: list = []

    def wait_for_spawn(self, seen: int, done, timeout: float) -> None:
        """Wait until a tool call has started since :attr:`spawns` was ``seen``, ``done()``
        is true (checked whenever :meth:`wake` is called), or ``timeout`` seconds passed.
        The boot starts its parallel steps one after another this way, each once the one before
        has its first call in flight, the longest first (boot/pipeline.py ``run_all``): a
        process start holds the interpreter, and starts that compete delay the longest lane's
        (issue 38)."""
        with self._spawned:
            self._spawned.wait_for(lambda: self.spawns > seen or done(), timeout)

    def wake(self) -> None:
        """Wake :meth:`wait_for_spawn` to look at its ``done()`` again."""
        with self._spawned:
            self._spawned.notify_all()

    def cancel(self, why: str) -> None:
        """End every call in flight (its process group is killed) and refuse new ones with
        :class:`Cancelled`: another step failed, or the boot is ending. The daemons started
        with :meth:`spawn` are not calls and are never touched."""
        self.cancelled = self.cancelled or why
        for proc in list(self._live):
            _kill_group(proc)

    def which(self, tool: str) -> str | None:
        """The path of ``tool``: the configured absolute path if it is an executable, else a
        PATH lookup; with ``trust_tool_paths`` only one that root alone can change (see
        :meth:`why_missing`)."""
        configured = self.tool_paths.get(tool)
        if configured:
            if not os.access(configured, os.X_OK) or self._untrusted(configured):
                return None
            return configured
        found = self._on_path(tool)
        return None if found and self._untrusted(found) else found

    def _on_path(self, tool: str) -> str | None:
        for folder in self.env.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or ".", tool)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate  # as shutil.which does (whose import costs the GPU path)
        return None

    def _untrusted(self, path: str) -> str | None:
        from podvm_gpu.host.fs import untrusted_because

        return untrusted_because(path) if self.trust_tool_paths else None

    def why_missing(self, tool: str) -> str:
        """Why :meth:`which` found no usable ``tool``: not on PATH, not an executable, refused."""
        configured = self.tool_paths.get(tool)
        if configured:
            why = self._untrusted(configured) if os.access(configured, os.X_OK) else None
            if why:  # boot runs it as root: someone else must not be able to replace it
                return f"{tool}: {configured} (set in the config) is refused: {why}"
            return f"{tool}: {configured} (set in the config) is not an executable"
        found = self._on_path(tool)
        why = self._untrusted(found) if found else None
        if why:
            return f"{tool}: {found} (on PATH) is refused: {why}"
        for folder in self.env.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or ".", tool)
            if os.path.isfile(candidate):  # there, but PATH lookup skips what cannot run
                return f"{tool}: {candidate} is not executable"
        return f"{tool}: not found on PATH"

    def timeout_for(self, tool: str, requested: float | None = None) -> float:
        """The timeout of one call: the request or the tool's configured value, cut to the budget."""
        timeout = requested if requested is not None else self.timeouts.get(tool, DEFAULT_TIMEOUT_S)
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        return timeout

    def run(self, argv: list[str], *, timeout: float | None = None, check: bool = True,
            on_start=None) -> Completed:
        """Run ``argv`` (``argv[0]`` a tool basename) and wait for it, at most the timeout.

        Args:
            argv: program basename and arguments; never a shell string.
            timeout: seconds; default the tool's configured timeout; always cut to the budget.
            check: raise on a non-zero exit status.
            on_start: called with no argument, in the caller's thread, once the tool's process
                has started (never when it could not start): what may wait for the call to be
                in flight (the cdi step's health gate waits for the generation, issue 38). What
                it raises is raised here, the tool's process group killed first.

        Returns:
            The :class:`Completed` call.

        Raises:
            CommandError: the tool is missing, cannot start, ran out of time (the whole process
                group is killed; ``timed_out`` is set and partial output kept), or exited non-zero
                with ``check``.
            Cancelled: the runner was cancelled before or during the call.
        """
        tool = argv[0]
        if self.cancelled:
            raise Cancelled(self.cancelled)
        if self.nvml_refusing() and nvml_client(argv):
            raise CommandError(argv, None, message=f"{' '.join(argv[:3])}: not run: an earlier "
                               f"NVML client {self.nvml_hung}, and every NVML client waits on "
                               f"the same driver lock (tried again {NVML_RETRY_S:g} s after it)")
        limit = self.timeout_for(tool, timeout)
        wanted = timeout if timeout is not None else self.timeouts.get(tool, DEFAULT_TIMEOUT_S)
        self.calls.append(list(argv))
        path = self.which(tool)
        if path is None:
            raise CommandError(argv, None, message=self.why_missing(tool))
        if limit <= 0:
            raise CommandError(argv, None, timed_out=True, timeout_s=0.0, budget_spent=True,
                               message=f"{tool}: not run, the boot budget is spent (timed out)")
        started = time.monotonic()
        proc = self._start(argv, path)
        try:
            self._run_next_spawn_hooks()
            if on_start is not None:
                on_start()
            out, err, held = self._wait(proc, started + limit)
        except subprocess.TimeoutExpired:
            raise self._timed_out(argv, proc, limit, wanted) from None
        except BaseException:  # the budget's timer, or a signal: leave no client behind
            _kill_group(proc)
            _reap(proc)
            raise
        finally:
            self._live.discard(proc)
        if self.cancelled:
            raise Cancelled(self.cancelled)
        return self._completed(argv, proc, (out, err), held, started, check)

    def _completed(self, argv: list[str], proc: subprocess.Popen, output: tuple[str, str],
                   held: float, started: float, check: bool) -> Completed:
        """The :class:`Completed` call of a tool that exited (``output``: stdout and stderr;
        ``held``: the seconds its output stayed open after it exited, 0 for none; ``started``: a
        monotonic time). A zero exit of an NVML client started after the hung-driver mark clears it.

        Raises:
            CommandError: the output was held open, or a non-zero exit with ``check``.
        """
        out, err = output
        if held:
            raise CommandError(argv, proc.returncode, out, err, held_open=True, message=(
                f"{' '.join(argv[:3])} {_exited(proc.returncode)}, but a process it started "
                f"kept its output open (ended after {held:.1f} s)"))
        done = Completed(list(argv), proc.returncode, out, err, time.monotonic() - started)
        if self.nvml_hung and nvml_client(argv) and proc.returncode == 0 \
                and started >= self.nvml_hung_at:
            # the driver answers again: NVML clients run again. Only a client started after the
            # hang was marked says so: one already in flight beside the hung client (a parallel
            # step's poll) may end 0 just after the mark, and clearing it then let the fabric
            # wait poll on for its whole timeout in 3 of 10 loaded runs of S35 (2026-12-06)
            self.nvml_hung = ""
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, out, err)
        return done

    def _start(self, argv: list[str], path: str) -> subprocess.Popen:
        """Start ``argv`` from ``path`` in its own session (stdin /dev/null, output piped, the
        tool's environment), counted and tracked as live (killed at once when the runner was
        cancelled meanwhile).

        Raises:
            CommandError: the tool cannot start (the OS error's words).
        """
        tool = argv[0]
        try:
            proc = subprocess.Popen([path, *argv[1:]], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", env=tool_env(tool, self.env),
                                    start_new_session=True)
        except OSError as err:
            raise CommandError(argv, None, message=f"{tool}: cannot run: {err.strerror}") from err
        self._live.add(proc)
        with self._spawned:
            self.spawns += 1
            self._spawned.notify_all()
        if self.cancelled:  # cancelled while it started: cancel() did not see it
            _kill_group(proc)
        return proc

    def _timed_out(self, argv: list[str], proc: subprocess.Popen, limit: float,
                   wanted: float) -> Exception:
        """What a call that ran past its ``limit`` (seconds; ``wanted`` the timeout asked for,
        before the budget's cut) raises, its process group killed and its output drained: a
        timed-out :class:`CommandError` (saying when the tool was stuck in the kernel or not
        reaped), or :class:`Cancelled` when the runner was cancelled meanwhile. An NVML client
        that timed out with its whole timeout marks the driver hung for later clients."""
        stuck = _in_kernel(proc.pid)
        _kill_group(proc)
        out, err, reaped = _drain(proc)
        if not reaped:
            self.unreaped += 1
        if self.cancelled:
            return Cancelled(self.cancelled)
        where = f" {STATE_D}" if stuck or not reaped else ""
        if not reaped:
            where += f", not ended by SIGKILL within {REAP_BOUND_S:g} s (reaped on a thread)"
        if nvml_client(argv) and limit >= wanted:
            self.nvml_hung = f"({' '.join(argv[:3])}) timed out after {limit:g} s{where}"
            self.nvml_hung_at = time.monotonic()
        return CommandError(argv, None, out, err, timed_out=True, timeout_s=limit,
                            budget_spent=limit < wanted, message=(
                                f"{' '.join(argv[:4])}: timed out after {limit:g} s{where}"
                                if where else None))

    @staticmethod
    def _wait(proc: subprocess.Popen, end: float) -> tuple[str, str, float]:
        """stdout, stderr and, when the tool exited but its output stayed open more than
        :data:`HELD_OPEN_GRACE_S`, the seconds it was held (its process group is then killed,
        which ends the holder unless it left the group); else 0.

        Raises:
            subprocess.TimeoutExpired: ``end`` (monotonic) passed with the tool still running.
        """
        exited_at = None
        while True:
            now = time.monotonic()
            try:
                out, err = proc.communicate(timeout=max(min(_POLL_S, end - now), 0.001))
                return out, err, 0.0
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at >= HELD_OPEN_GRACE_S:
                    _kill_group(proc)
                    out, err, _reaped = _drain(proc)
                    return out, err, now - exited_at
                if now >= end and exited_at is None:
                    raise

    def nvml_refusing(self) -> bool:
        """Whether NVML clients are refused now: one timed out less than :data:`NVML_RETRY_S`
        seconds ago and none exited 0 since."""
        return bool(self.nvml_hung) and time.monotonic() - self.nvml_hung_at < NVML_RETRY_S

    def spawn(self, argv: list[str], log_path: str) -> subprocess.Popen:
        """Start a daemon (``nvidia-persistenced``, ``nv-fabricmanager``) and return at once.

        The process gets its own session and is never killed by us: a process that is
        initialising GPUs must not be interrupted (contract section 3). Its output goes to
        ``log_path`` (made anew, 0644, never through a symlink) so its last message can be quoted
        if it exits.

        Raises:
            CommandError: the tool is missing or cannot start, or this runner is read-only.
            OSError: the log file cannot be created.
        """
        tool = argv[0]
        self.calls.append(list(argv))
        if self.read_only:
            raise CommandError(argv, None, message=f"{tool}: not started (read-only run)")
        path = self.which(tool)
        if path is None:
            raise CommandError(argv, None, message=self.why_missing(tool))
        try:
            os.unlink(log_path)  # a new file: never truncate whatever a planted link names
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(log_path, flags, 0o644)
        os.fchmod(fd, 0o644)
        try:
            proc = subprocess.Popen([path, *argv[1:]], stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=fd, env=tool_env(tool, self.env),
                                    start_new_session=True)
        except OSError as err:
            raise CommandError(argv, None, message=f"{tool}: cannot run: {err.strerror}") from err
        finally:
            os.close(fd)
        self._run_next_spawn_hooks()  # a daemon's start is a start too
        return proc

    def _run_next_spawn_hooks(self) -> None:
        """Run and clear :attr:`at_next_spawn`. What waits there only saves time (the step
        that needs its result does the work itself when it is missing), so an ``Exception`` it
        raises (a thread that cannot start) is dropped rather than failing the call it rode
        on; a signal's exception is not an ``Exception`` and goes on."""
        hooks, self.at_next_spawn = self.at_next_spawn, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # the docstring says why
                pass


def _exited(returncode: int) -> str:
    """``exited 0`` / ``killed by SIGKILL``."""
    return f"exited {returncode}" if returncode >= 0 else exit_text(returncode)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _drain(proc: subprocess.Popen) -> tuple[str, str, bool]:
    """Collect what a killed process printed, without hanging on a grandchild holding the pipe
    nor on a process SIGKILL does not end: ``(stdout, stderr, reaped)``, ``reaped`` False when
    it had not exited after :data:`REAP_BOUND_S` (it is in the kernel, state D; a thread of its
    own reaps it when it leaves)."""
    try:
        out, err = proc.communicate(timeout=1)
        return out, err, True
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
        return "", "", _reap(proc)


def _reap(proc: subprocess.Popen) -> bool:
    """Wait for a killed ``proc`` at most :data:`REAP_BOUND_S`; True when it exited, else False
    and a daemon thread waits for it (no zombie is left when it ends, and no caller blocks)."""
    try:
        proc.wait(timeout=REAP_BOUND_S)
        return True
    except subprocess.TimeoutExpired:
        Background(proc.wait, f"reap-{proc.pid}")
        return False


class Background:
    """The boot's one way to run something on a thread of its own (issue 44 item 5): ``call``
    (a function of no argument) on a daemon thread named ``name``, started at once unless
    ``start`` is False (then :meth:`start`, e.g. handed on as a callback). What the call
    returned or raised is kept for the thread that asks (:meth:`outcome`, :meth:`result`), so
    nothing raised is ever lost in, or raised from, a helper thread. Nothing here waits without
    a bound beyond the call's own: every tool call has its timeout (:meth:`Runner.run`), and a
    cancelled runner ends the calls in flight.

    Attributes:
        thread: the ``threading.Thread`` (its ``ident`` is None until started).
    """

    def __init__(self, call, name: str, start: bool = True):
        self._out: tuple[object, BaseException | None] = (None, None)
        self.thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        if start:
            self.thread.start()

    def _run(self, call) -> None:
        try:
            self._out = (call(), None)
        except BaseException as err:  # handed to the asker, which decides what it means
            self._out = (None, err)

    def start(self) -> None:
        """Start the thread (once; for ``start=False``)."""
        self.thread.start()

    def outcome(self, timeout: float | None = None) -> tuple[object, BaseException | None]:
        """Wait for the call (at most ``timeout`` seconds when given; a thread never started
        is not waited for): ``(result, None)`` or ``(None, what it raised)``; ``(None, None)``
        when it has not ended."""
        if self.thread.ident is not None:
            self.thread.join(timeout)
        return self._out

    def result(self):
        """Wait for the call and return what it returned, or raise what it raised, here."""
        value, err = self.outcome()
        if err is not None:
            raise err
        return value


def side_by_side(calls: list) -> list[tuple[object, BaseException | None]]:
    """Run each of ``calls`` (functions of no argument, each making its own bounded tool calls)
    on a thread of its own and wait for all of them: ``(result, None)`` or ``(None, what it
    raised)`` for each, in the order given. Nothing here waits without a bound: every tool call
    has its timeout (:meth:`Runner.run`), and a cancelled runner ends the calls in flight.
    NVML clients side by side are what a real H200 answers fastest (4 nvidia-smi queries at
    once 27 ms, one after another 94 ms: tests/data/real/h200-580/README.md, issue 38)."""
    running = [Background(call, f"side-by-side-{i}") for i, call in enumerate(calls)]
    return [job.outcome() for job in running]
