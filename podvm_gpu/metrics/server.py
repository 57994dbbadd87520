"""The exporter's HTTP server: one selector thread holds every connection until its whole request
has arrived, and only then does a bounded pool of workers answer it.

Why not ``http.server.ThreadingHTTPServer``: it starts a thread per connection, and an idle
or slow client holds that thread (30 s, or for ever for one that sends a byte now and then);
under the unit's ``TasksMax=32`` forty idle connections made every scrape fail, and each
refused connection printed a traceback. Here:

- a connection costs a socket and a small buffer, no thread, until its request is complete;
- a request (request line and headers, TLS handshake included) must arrive within
  ``request_timeout_s`` of the accept and fit in ``max_request_bytes``; else it is closed
  (408/431 when it can still be told);
- at most ``max_connections`` wait at once: one more closes the oldest waiting one, so a crowd
  of idle clients cannot lock the scraper out;
- ``workers`` threads answer (each write bounded by ``write_timeout_s``); requests beyond
  ``4 * workers`` waiting for one get 503 at once;
- what can be refused without the handler (a malformed request, a missing or known-wrong
  password, a client throttled by :class:`auth.ClientGate`) is answered at once by the selector
  thread, never by a worker; bcrypt checks run in threads of their own (``auth.py``), so
  password guesses cannot starve authorised scrapes;
- a client that resets, times out or speaks something else costs nothing in the journal: no
  line at all. Only the server's own trouble (out of file descriptors, a bug answering) prints
  one line, at most once a minute for the same kind (``journal.Journal``).

Every answer closes its connection (``Connection: close``): Prometheus opens a new one for the
next scrape. TLS and basic auth come from a :class:`webconfig.WebConfig`.
"""

from __future__ import annotations

import base64
import binascii
import collections
import concurrent.futures
import errno
import re
import selectors
import socket
import threading
import time
from contextlib import suppress
from http import HTTPStatus

from podvm_gpu.metrics.auth import CHECK_THREADS, THROTTLED, ClientGate
from podvm_gpu.metrics.journal import Journal

_REASONS = {status.value: status.phrase for status in HTTPStatus}
_MAX_HEADERS = 100
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")  # the blank line, CRLF or bare LF


# Records as named tuples, as readers.Library (no ``import dataclasses``: its start-up cost)
class Request(collections.namedtuple("Request", "method path headers")):
    """A parsed request: ``method`` (``GET``), ``path`` (``/metrics?x``), ``headers`` (lower-case
    name -> value; a repeated header keeps its last value)."""

    __slots__ = ()


class Response(collections.namedtuple("Response", "status body headers", defaults=(b"", ()))):
    """An answer: ``status`` (an HTTP code), ``headers`` (list of ``(name, value)``), ``body``
    (bytes)."""

    __slots__ = ()


def parse_request(data: bytes) -> Request | Response:
    """The request in ``data`` (everything up to and including the blank line), or the
    :class:`Response` (400, 405) that refuses it.

    A line may end with a bare LF as well as CRLF: RFC 9112 section 2.2 lets a recipient take LF
    as the line terminator and ignore a CR before it, and a hand-typed ``printf 'GET /metrics
    HTTP/1.1\n\n' | nc`` then gets its answer (before, it got nothing until the request's time
    ran out). A CR anywhere else in a line is refused with 400 (section 2.2: a bare CR is
    invalid), never taken as a line end.
    """
    text = data.decode("iso-8859-1")  # every byte is a character: never fails
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    if any("\r" in line for line in lines):
        return Response(400, b"bare CR in the request\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return Response(400, b"not an HTTP/1 request\n")
    method, path, _ = parts
    headers: dict[str, str] = {}
    for count, line in enumerate(lines[1:]):
        if not line:
            break
        if count >= _MAX_HEADERS:
            return Response(431, b"too many headers\n")
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            return Response(400, b"bad header line\n")
        headers[name.lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        return Response(405, b"only GET\n", [("Allow", "GET, HEAD")])
    return Request(method, path, headers)


def basic_auth(header: str | None) -> tuple[str, bytes] | None:
    """``(user, password)`` from an ``Authorization: Basic ...`` value; None when absent or
    malformed."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = raw.partition(b":")
    if not colon:
        return None
    return user.decode("utf-8", "replace"), password


def encode(response: Response, head_only: bool = False, extra: dict | None = None) -> bytes:
    """The bytes of ``response`` on the wire (HTTP/1.1, ``Connection: close``)."""
    lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Error')}"]
    names = {name.lower() for name, _ in response.headers}
    headers = list(response.headers)
    if "content-type" not in names:
        headers.append(("Content-Type", "text/plain; charset=utf-8"))
    headers += [("Content-Length", str(len(response.body))), ("Connection", "close")]
    headers += list((extra or {}).items())
    lines += [f"{name}: {value}" for name, value in headers]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1")
    return head if head_only else head + response.body


class _Conn:
    __slots__ = ("sock", "peer", "deadline", "buf", "handshaken")

    def __init__(self, sock, peer, deadline: float, handshaken: bool):
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.buf = bytearray()
        self.handshaken = handshaken


class MetricsServer:
    """A bound, listening server; :meth:`serve_forever` runs it until :meth:`shutdown`.

    Args:
        host, port: an IP address (IPv6 without brackets) and a port (0: any free one).
        handler: called by a worker with each :class:`Request` (authenticated already),
            returns a :class:`Response`; an exception becomes a 500 and one line on stderr.
        web: a :class:`webconfig.WebConfig` for TLS and basic auth, or None.
        workers: threads answering requests.
        max_connections: connections waiting for their request at once.
        request_timeout_s: seconds from accept to the end of the request's headers.
        max_request_bytes: the largest request line and headers.
        write_timeout_s: the longest a worker waits on one send to a slow reader, seconds.
        journal: the :class:`journal.Journal` its lines go to (a new one by default).

    Raises:
        OSError: the address cannot be bound (in use, not an address of this machine).
    """

    def __init__(self, host: str, port: int, handler, web=None, *, workers: int = 4,
                 max_connections: int = 512, request_timeout_s: float = 10.0,
                 max_request_bytes: int = 8192, write_timeout_s: float = 10.0,
                 journal: Journal | None = None):
        self.handler = handler
        self.web = web
        self.workers = workers
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.max_request_bytes = max_request_bytes
        self.write_timeout_s = write_timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            # the kernel's queue holds as many as the server lets wait: with 128, a burst of
            # connects overflowed it while the selector thread was busy, and the 129th
            # waited a 1 s SYN retransmit (ListenOverflows, bench/metrics.py)
            self.socket.listen(max(128, max_connections))
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._waiting: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self._queued = 0  # requests handed to the pool and not answered yet
        self._queued_lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.journal = journal or Journal()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "podvm-gpu-http")
        self._gate = self._checks = None
        if web is not None and web.users:
            self._gate = ClientGate()
            self._checks = concurrent.futures.ThreadPoolExecutor(CHECK_THREADS, "podvm-gpu-auth")

    # --- the selector thread -------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept and read until :meth:`shutdown`; then close every waiting connection."""
        self._started = True
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        paused_until = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if paused_until and now >= paused_until:
                    sel.register(self.socket, selectors.EVENT_READ, "listen")
                    paused_until = 0.0
                timeout = 1.0
                if self._waiting:
                    first = next(iter(self._waiting.values()))
                    timeout = min(timeout, max(0.0, first.deadline - now))
                for key, _ in sel.select(timeout):
                    if key.data == "listen":
                        if not self._accept(sel):
                            sel.unregister(self.socket)  # out of descriptors: pause accepting
                            paused_until = time.monotonic() + 0.5
                    elif key.data == "wake":
                        with suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._readable(sel, key.data)
                self._expire(sel)
        finally:
            for conn in list(self._waiting.values()):
                self._drop(sel, conn)
            sel.close()
            self._stopped.set()

    def _accept(self, sel) -> bool:
        for _ in range(64):  # then let the others read
            try:
                sock, peer = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.journal.say("accept", f"cannot accept a connection: {err.strerror}; pausing "
                                        "0.5 s")
                    return False
                return True  # ECONNABORTED and the like: the client is gone
            if len(self._waiting) >= self.max_connections:
                self._drop(sel, next(iter(self._waiting.values())))  # the oldest waiting one
            sock.setblocking(False)
            handshaken = True
            if self.web is not None and self.web.ssl_context is not None:
                try:
                    sock = self.web.ssl_context.wrap_socket(sock, server_side=True,
                                                            do_handshake_on_connect=False)
                except OSError:
                    sock.close()
                    continue
                handshaken = False
            conn = _Conn(sock, peer, time.monotonic() + self.request_timeout_s, handshaken)
            self._waiting[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)
        return True

    def _readable(self, sel, conn: _Conn) -> None:
        import ssl

        try:
            if not conn.handshaken:
                try:
                    conn.sock.do_handshake()
                except ssl.SSLWantReadError:
                    sel.modify(conn.sock, selectors.EVENT_READ, conn)
                    return
                except ssl.SSLWantWriteError:
                    sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                    return
                conn.handshaken = True
                sel.modify(conn.sock, selectors.EVENT_READ, conn)
            while True:
                try:
                    chunk = conn.sock.recv(4096)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    return
                if not chunk:
                    self._drop(sel, conn)
                    return
                conn.buf += chunk
                found = _END_OF_HEAD.search(conn.buf)  # CRLF or bare LF (parse_request)
                if found and found.end() <= self.max_request_bytes:
                    self._hand_over(sel, conn, bytes(conn.buf[:found.end()]))
                    return
                if len(conn.buf) > self.max_request_bytes:
                    self._refuse(sel, conn, Response(431, b"request headers too large\n"))
                    return
        except (OSError, ValueError):  # reset, TLS alert, garbage instead of a handshake
            self._drop(sel, conn)

    def _expire(self, sel) -> None:
        now = time.monotonic()
        while self._waiting:
            conn = next(iter(self._waiting.values()))
            if conn.deadline > now:
                return
            if conn.handshaken and conn.buf:
                self._refuse(sel, conn, Response(408, b"the request did not arrive in time\n"))
            else:
                self._drop(sel, conn)

    def _forget(self, sel, conn: _Conn) -> None:
        self._waiting.pop(conn.sock.fileno(), None)
        with suppress(KeyError, ValueError):
            sel.unregister(conn.sock)

    def _drop(self, sel, conn: _Conn) -> None:
        self._forget(sel, conn)
        with suppress(OSError):
            conn.sock.close()

    def _refuse(self, sel, conn: _Conn, response: Response, request=None) -> None:
        """Tell the client why, if its socket takes it at once, and close."""
        self._forget(sel, conn)
        self._send_and_close(conn, response, request)

    def _send_and_close(self, conn: _Conn, response: Response, request=None) -> None:
        """One send that does not wait (a short answer fits the socket's buffer; a client that
        does not take it gets nothing), then close: how refusals are answered without a
        worker."""
        head_only = isinstance(request, Request) and request.method == "HEAD"
        extra = self.web.headers if self.web is not None else None
        with suppress(OSError, ValueError):
            conn.sock.setblocking(False)
            conn.sock.send(encode(response, head_only, extra))
        with suppress(OSError):
            conn.sock.close()

    def _hand_over(self, sel, conn: _Conn, data: bytes) -> None:
        request = parse_request(data)
        if isinstance(request, Response):
            self._refuse(sel, conn, request)
            return
        if self._gate is not None:
            given = basic_auth(request.headers.get("authorization"))
            known = self.web.cached(*given) if given is not None else False
            if known is False:  # no password, or one checked and found wrong before
                self._refuse(sel, conn, _unauthorised(), request)
                return
            if known is None:
                why = self._gate.admit(conn.peer[0])
                if why is not None:
                    self._refuse(sel, conn, _THROTTLED if why == THROTTLED else _NO_CHECKS,
                                 request)
                    return
                self._forget(sel, conn)
                self._checks.submit(self._check, conn, request, given)
                return
        self._forget(sel, conn)
        self._queue(conn, request)

    def _queue(self, conn: _Conn, request: Request) -> None:
        """Hand an authorised request to the workers, or 503 when ``4 * workers`` wait."""
        with self._queued_lock:
            busy = self._queued >= 4 * self.workers
            if not busy:
                self._queued += 1
        if busy:
            self._send_and_close(conn, Response(503, b"busy: too many scrapes at once\n"),
                                 request)
            return
        self._pool.submit(self._answer, conn, request)

    # --- the password checks ---------------------------------------------------------------------

    def _check(self, conn: _Conn, request: Request, given: tuple[str, bytes]) -> None:
        """In a check thread: bcrypt the pair the gate admitted; the workers answer a right one,
        a wrong one gets its 401 here."""
        right = False
        try:
            right = self.web.check_password(*given)
        except Exception as err:  # one line, not a traceback per request
            self.journal.say("auth", f"error checking a password: {type(err).__name__}: {err}")
        finally:
            self._gate.done(conn.peer[0], right)
        if right:
            self._queue(conn, request)
        else:
            self._send_and_close(conn, _unauthorised(), request)

    # --- the workers -----------------------------------------------------------------------------

    def _answer(self, conn: _Conn, request: Request) -> None:
        sock = conn.sock
        try:
            sock.settimeout(self.write_timeout_s)
            response = self._handle(request)
            extra = self.web.headers if self.web is not None else None
            sock.sendall(encode(response, request.method == "HEAD", extra))
        except (OSError, ValueError):
            pass  # the client went away or is too slow: nothing to say about it
        finally:
            with self._queued_lock:
                self._queued -= 1
            with suppress(OSError):
                sock.close()

    def _handle(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception as err:  # one line, not a traceback per scrape
            self.journal.say("handler", f"error answering {request.path}: {type(err).__name__}: {err}")
            return Response(500, b"internal error; see the exporter's log\n")

    # --- stopping --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (from another thread) and wait for it to return."""
        self._stop.set()
        with suppress(OSError):
            self._wake_w.send(b"x")
        if self._started:
            self._stopped.wait(5)

    def server_close(self) -> None:
        """Close the listening socket; answers in progress finish within their write bound."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._checks is not None:
            self._checks.shutdown(wait=False, cancel_futures=True)
        for sock in (self.socket, self._wake_r, self._wake_w):
            with suppress(OSError):
                sock.close()


def _unauthorised() -> Response:
    return Response(401, b"unauthorized\n",
                    [("WWW-Authenticate", 'Basic realm="podvm-gpu metrics"')])


_THROTTLED = Response(429, b"too many password checks from this address: wait a second\n",
                      [("Retry-After", "1")])
_NO_CHECKS = Response(503, b"busy: too many password checks at once\n", [("Retry-After", "1")])
