"""The package's exception types, and how a failure is put into words.

One base class, :class:`PodvmGpuError`; everything the program raises on purpose derives from it,
so the CLI can turn any of them into a clean message and an exit code instead of a traceback.
A reason is one line for the console, the status file and a container's environment: what a
tool printed is quoted in bounded pieces (:func:`one_line`), and a process that a signal ended
says so (:func:`exit_text`) rather than showing a negative exit status.
"""

from __future__ import annotations

# NVIDIA's Go tools log with logrus: level=error msg="..." with \" and \n escaped inside msg.
# Compiled where used: this module is imported by every boot with a config file, and ``re``
# costs that path more than the rest of it.
_LOGRUS_ERROR = r'level=(?:error|fatal) msg="((?:[^"\\]|\\.)*)"'
_LOGRUS_WARNING = r'level=warning msg="((?:[^"\\]|\\.)*)"'


QUOTE_MAX = 300  # characters of one quoted line of a tool (its last line, its error message)


def one_line(text: object, limit: int | None = QUOTE_MAX) -> str:
    """``text`` (``str()`` of anything) with its whitespace runs folded to single spaces and cut
    to ``limit`` characters (ending in `` ...`` when cut): a tool may print anything, of any
    length. ``limit=None`` folds without cutting (the CDI reader's messages, which quote a spec's
    own words whole). The one folding of the package (cdi/unavailable.py repeats the fold inline:
    it is on the CPU fast path, which does not import this module)."""
    line = " ".join(str(text).split())
    return line if limit is None or len(line) <= limit else line[:max(limit - 4, 0)].rstrip() + " ..."


def exit_text(returncode: int) -> str:
    """How a command ended: ``exit 1``, or ``killed by SIGKILL`` for a negative status (what
    :mod:`subprocess` reports for a process a signal ended; nothing else says so)."""
    if returncode >= 0:
        return f"exit {returncode}"
    import signal  # only on this failure path: it imports enum, which the fast path avoids

    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def ended_text(returncode: int) -> str:
    """How a daemon ended, after its name: ``exited with status 1`` or ``was killed by SIGKILL``."""
    return f"exited with status {returncode}" if returncode >= 0 else f"was {exit_text(returncode)}"


def _unescape(msg: str) -> str:
    return one_line(msg.replace('\\"', '"').replace("\\n", " "))


class PodvmGpuError(Exception):
    """Base of every error podvm-gpu raises on purpose."""


class ConfigError(PodvmGpuError):
    """The config file cannot be read or does not validate; the message names the file and key."""


class CommandError(PodvmGpuError):
    """An external command failed, could not be started, or ran out of time.

    Attributes:
        argv: the argument vector as run (list of str; argv[0] as resolved).
        returncode: the exit status, ``None`` when it never ran or was killed on timeout.
        stdout, stderr: what it printed (text, possibly partial when it timed out).
        timed_out: True when the command was stopped at its timeout.
        timeout_s: the timeout that applied, in seconds.
        budget_spent: True when it timed out at the end of the boot budget (its own timeout
            was cut to what was left): the boot's time is up, whatever the call was for.
        held_open: True when the tool exited (``returncode``) but a process it started kept
            its stdout or stderr open; that process was ended (host/proc.py).
    """

    def __init__(self, argv, returncode, stdout="", stderr="", *, timed_out=False,
                 timeout_s=None, budget_spent=False, message=None, held_open=False):
        self.held_open = held_open
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout or ""
        self.stderr = stderr or ""
        self.timed_out = timed_out
        self.timeout_s = timeout_s
        self.budget_spent = budget_spent
        super().__init__(message or self._describe())

    @property
    def tool(self) -> str:
        """The program's basename, e.g. ``nvidia-ctk``."""
        return self.argv[0].rsplit("/", 1)[-1] if self.argv else "?"

    @property
    def signalled(self) -> bool:
        """True when a signal ended the command (its exit status is negative)."""
        return self.returncode is not None and self.returncode < 0

    def last_line(self) -> str:
        """The last non-empty line of stderr (else stdout), the usual place of a tool's error,
        as one bounded line (:func:`one_line`)."""
        for text in (self.stderr, self.stdout):
            for line in reversed(text.splitlines()):
                if line.strip():
                    return one_line(line)
        return ""

    def said(self) -> str:
        """What ended the command, in words: its last line, prefixed by the signal when a
        signal ended it (a killed tool's last line is not its error), else ``exit N``."""
        last = self.last_line()
        if self.signalled:
            return exit_text(self.returncode) + (f": {last}" if last else "")
        return last or (exit_text(self.returncode) if self.returncode is not None else "")

    def tool_message(self) -> str:
        """The tool's own error: the ``msg`` of its last logrus ``level=error`` line (nvidia-ctk),
        unescaped, else :meth:`last_line`, else ``no output``; for a command that never ran,
        why (not found, not executable). How it ended is the caller's to say
        (:func:`exit_text`)."""
        if self.returncode is None:
            return str(self)
        import re

        found = re.findall(_LOGRUS_ERROR, self.stderr)
        return (_unescape(found[-1]) if found else self.last_line()) or "no output"

    def warnings_about(self, pattern: str) -> list[str]:
        """The ``msg`` of the tool's logrus ``level=warning`` lines that match ``pattern`` (a
        regular expression), unescaped, without repeats: nvidia-ctk prints dozens of harmless
        ones on every run, and the cause of a failure is often one of the others."""
        import re

        wanted = re.compile(pattern)
        found = [_unescape(m) for m in re.findall(_LOGRUS_WARNING, self.stderr)]
        return list(dict.fromkeys(m for m in found if wanted.search(m)))

    def _describe(self) -> str:
        cmd = " ".join(self.argv[:4]) if self.argv else "?"
        if self.timed_out:
            return f"{cmd}: timed out after {self.timeout_s:g} s"
        if self.returncode is None:
            return f"{cmd}: could not be run"
        tail = self.last_line()
        return f"{cmd}: {exit_text(self.returncode)}" + (f": {tail}" if tail else "")


class Cancelled(PodvmGpuError):
    """A step was stopped because another one failed or the boot is ending; ``str(err)`` says
    why. Its tool call in flight was ended; no daemon is ever stopped this way."""


class StepFailed(PodvmGpuError):
    """A boot step failed; ``str(err)`` is the cause, without the step name (the runner adds it)."""


class CdiSpecError(PodvmGpuError):
    """A CDI spec does not parse or breaks a rule of contract section 8; the message names the rule."""
