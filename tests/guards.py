"""A guard for tests of code that must never block (FIFOs, devices given as files)."""

import contextlib
import signal


class Blocked(Exception):
    """Raised by :func:`must_finish_within`; not an OSError (as TimeoutError is), so product code
    that catches OSError around a blocking open() cannot swallow it."""


@contextlib.contextmanager
def must_finish_within(seconds: float):
    """Fail (instead of hanging the suite) when the block blocks longer than ``seconds``."""
    def expired(signum, frame):
        raise Blocked(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
