"""Who may spend a bcrypt check now: the exporter's bound on what password guesses cost.

A bcrypt check costs tens to hundreds of milliseconds of CPU by design. When every check ran in
the server's four workers, 24 clients sending wrong passwords kept them busy and 8 of 10
authorised scrapes got 503 (issue 29 item 3). So the server (``server.MetricsServer``) checks
passwords in threads of their own, and asks a :class:`ClientGate` first, on its selector
thread, before any check:

- a pair checked before is answered from ``WebConfig.cached``: a right one goes to the workers,
  a wrong one gets its 401 at once, neither costs a check;
- a client (a peer address) has at most one check running or waiting at a time, and after a
  wrong password none for :data:`FAIL_DELAY_S`: more gets 429 at once;
- at most :data:`MAX_CHECKS` checks run or wait in all: more gets 503 at once.

So wrong passwords cost at most one check per client per second and never a worker; an
authorised scraper, whose pair is checked once, is answered by the workers whatever others send.
Standard library only.
"""

from __future__ import annotations

import threading
import time

FAIL_DELAY_S = 1.0
MAX_CHECKS = 8  # running (CHECK_THREADS) and waiting
CHECK_THREADS = 2
MAX_CLIENTS = 4096  # clients remembered; an address whose delay is over is forgotten first

THROTTLED = "throttled"
BUSY = "busy"


class ClientGate:
    """The admission of password checks, per client and in all (thread-safe).

    Args:
        fail_delay_s: how long a client that sent a wrong password waits for its next check, s.
        max_checks: checks running or waiting at once, all clients together.
        max_clients: clients remembered at once (each costs a few hundred bytes).
        clock: ``time.monotonic`` (tests give their own).
    """

    def __init__(self, fail_delay_s: float = FAIL_DELAY_S, max_checks: int = MAX_CHECKS,
                 max_clients: int = MAX_CLIENTS, clock=time.monotonic):
        self.fail_delay_s = fail_delay_s
        self.max_checks = max_checks
        self.max_clients = max_clients
        self._clock = clock
        self._lock = threading.Lock()
        self._checking: set[str] = set()
        self._not_before: dict[str, float] = {}

    def admit(self, client: str) -> str | None:
        """None when ``client`` may have its password checked now (then :meth:`done` must
        follow); else why not: :data:`THROTTLED` (its check is running, or it sent a wrong
        password less than ``fail_delay_s`` ago) or :data:`BUSY` (``max_checks`` are running
        or waiting, or ``max_clients`` are remembered)."""
        with self._lock:
            now = self._clock()
            if client in self._checking or self._not_before.get(client, 0.0) > now:
                return THROTTLED
            if len(self._checking) >= self.max_checks:
                return BUSY
            self._not_before.pop(client, None)
            if len(self._checking) + len(self._not_before) >= self.max_clients:
                self._not_before = {c: t for c, t in self._not_before.items() if t > now}
                if len(self._checking) + len(self._not_before) >= self.max_clients:
                    return BUSY
            self._checking.add(client)
            return None

    def done(self, client: str, right: bool) -> None:
        """The check of ``client`` admitted by :meth:`admit` ended: ``right`` when the password
        was right (no delay), else the client waits ``fail_delay_s`` from now."""
        with self._lock:
            self._checking.discard(client)
            if not right:
                self._not_before[client] = self._clock() + self.fail_delay_s

    def checking(self) -> int:
        """Checks running or waiting now."""
        with self._lock:
            return len(self._checking)
