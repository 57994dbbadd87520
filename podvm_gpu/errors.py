"""The package's exception types.

One base class, :class:`PodvmGpuError`; everything the program raises on purpose derives from it,
so the CLI can turn any of them into a clean message and an exit code instead of a traceback.
"""

from __future__ import annotations

# NVIDIA's Go tools log with logrus: level=error msg="..." with \" and \n escaped inside msg.
# Compiled where used: this module is imported by every boot with a config file, and ``re``
# costs that path more than the rest of it.
_LOGRUS_ERROR = r'level=(?:error|fatal) msg="((?:[^"\\]|\\.)*)"'
_LOGRUS_WARNING = r'level=warning msg="((?:[^"\\]|\\.)*)"'


def _unescape(msg: str) -> str:
    return " ".join(msg.replace('\\"', '"').replace("\\n", " ").split())


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
    """

    def __init__(self, argv, returncode, stdout="", stderr="", *, timed_out=False,
                 timeout_s=None, budget_spent=False, message=None):
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

    def last_line(self) -> str:
        """The last non-empty line of stderr (else stdout), the usual place of a tool's error."""
        for text in (self.stderr, self.stdout):
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if lines:
                return lines[-1]
        return ""

    def tool_message(self) -> str:
        """The tool's own error: the ``msg`` of its last logrus ``level=error`` line (nvidia-ctk),
        unescaped, else :meth:`last_line`, else ``exit N``."""
        import re

        found = re.findall(_LOGRUS_ERROR, self.stderr)
        if found:
            return _unescape(found[-1])
        if self.returncode is None:  # it never ran: the message says why (not found, ...)
            return str(self)
        return self.last_line() or f"exit {self.returncode} with no output"

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
        return f"{cmd}: exit {self.returncode}" + (f": {tail}" if tail else "")


class Cancelled(PodvmGpuError):
    """A step was stopped because another one failed or the boot is ending; ``str(err)`` says
    why. Its tool call in flight was ended; no daemon is ever stopped this way."""


class StepFailed(PodvmGpuError):
    """A boot step failed; ``str(err)`` is the cause, without the step name (the runner adds it)."""


class CdiSpecError(PodvmGpuError):
    """A CDI spec does not parse or breaks a rule of contract section 8; the message names the rule."""
