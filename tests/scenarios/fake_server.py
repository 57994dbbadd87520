"""The fake-tool server: one process per test process answers the fake tool calls of its worlds.

A world's fake tool (``bin/nvidia-smi``, ...) is a script whose interpreter is the compiled
client (``fake_client.c``) with this server's socket and the world's ``world.json``:
``#!<client> <socket>|<world.json>``. The client hands the call (argv, pid, parent pid, stdout
and stderr) to the server; the server forks a worker that answers it with
:func:`fake_tool.answer`, writing to the caller's own stdout and stderr, and replies with the
exit status. A forked worker starts in about 1 ms with everything imported, where a Python
process per call cost about 20 ms of CPU (issue 27: the fast tier is CPU-bound on two cores).

What the product sees is what it saw of a Python fake: a process of its own (the client) that
writes the answer to its pipes and exits with the rule's status, dies of a SIGTERM or SIGINT
sent during its delay (the worker logs the signal and applies no effect), and applies nothing
when killed. A kept world (``PODVM_GPU_KEEP_WORLD=1``) outlives its server: its fakes answer
only while the test process that made it lives.

The server is started on first use (:func:`interpreter`), in a private folder under ``/tmp``
(short: a unix socket path has at most 107 bytes) that it removes when it ends; it ends when
the test process does (the control pipe closes).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

CLIENT_SOURCE = Path(__file__).with_name("fake_client.c")
TESTS = Path(__file__).resolve().parents[1]
SHEBANG_MAX = 255  # the kernel reads the first 256 bytes of a script (BINPRM_BUF_SIZE)
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from scenarios.fake_server import serve; serve(*map(int, sys.argv[2:4]), sys.argv[4])")

_lock = threading.Lock()
_started: tuple[str, str, int] | None = None  # (client, socket, pid of the test process)
_keep: list[int] = []  # the control pipes' write ends, held open while this process lives


def interpreter() -> tuple[str, str]:
    """``(client, socket)`` of this process's fake-tool server, started on first use.

    Raises:
        RuntimeError: gcc is missing or the client does not build.
    """
    global _started
    with _lock:
        if _started is None or _started[2] != os.getpid():
            _started = (*_start(), os.getpid())
        return _started[0], _started[1]


def script(tool: str, config: str, note: str = "") -> str:
    """The text of a fake ``tool`` answering from the world ``config`` (its ``world.json``).

    Raises:
        RuntimeError: the first line would be longer than the kernel reads.
    """
    client, path = interpreter()
    first = f"#!{client} {path}|{config}"
    if len(first) > SHEBANG_MAX:
        raise RuntimeError(f"fake {tool}: interpreter line longer than {SHEBANG_MAX} bytes: {first}")
    return f"{first}\n# Fake {tool}{note}: answered by tests/scenarios/fake_tool.py (fake_server.py)\n"


def _start() -> tuple[str, str]:
    """Build the client, bind the socket, start the server; return ``(client, socket)``."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found: the scenario harness builds its fake-tool client with "
                           "it (Debian packages gcc, libc6-dev)")
    folder = tempfile.mkdtemp(prefix="pgfake")
    os.chmod(folder, 0o755)  # the product may run its tools as another user
    client = os.path.join(folder, "client")
    built = subprocess.run([gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o", client,
                            str(CLIENT_SOURCE)], capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"the fake-tool client does not build: {built.stderr.strip()}")
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o777)  # connect() needs write permission: any user the product runs tools as
    listener.listen(128)
    control_read, control_write = os.pipe()  # the server ends when this process does
    with open(os.path.join(folder, "server.log"), "ab") as log:
        subprocess.Popen([sys.executable, "-IS", "-X", "utf8", "-c", _BOOT, str(TESTS),
                          str(listener.fileno()), str(control_read), folder],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                         pass_fds=(listener.fileno(), control_read), start_new_session=True)
    listener.close()
    os.close(control_read)
    _keep.append(control_write)  # never written, never closed: EOF only when this process ends
    return client, path



def serve(listener_fd: int, control_fd: int, folder: str) -> None:
    """The server's loop: a worker per call, until the control pipe closes."""
    from . import fake_tool  # noqa: F401  (imported once here, not in every worker)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    listener = socket.socket(fileno=listener_fd)
    try:
        while True:
            ready, _, _ = select.select([listener, control_fd], [], [])
            if control_fd in ready:
                return
            try:
                conn, _ = listener.accept()
            except InterruptedError:
                continue
            if os.fork() == 0:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its effects wait for children
                listener.close()
                os.close(control_fd)
                _worker(conn)  # never returns
            conn.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Caller:
    """The client process a worker answers for: what :func:`fake_tool.answer` needs of it."""

    def __init__(self, conn: socket.socket, pid: int, ppid: int):
        self.conn, self.pid, self.ppid = conn, pid, ppid
        self.log = None  # the call's CallLog, set by fake_tool.answer once it has one

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; a signal the client forwards meanwhile, or its death, ends the call."""
        poller = select.poll()
        poller.register(self.conn, select.POLLIN)
        left_ms = max(int(seconds * 1000), 0)
        deadline = time.monotonic() + seconds
        while True:
            if poller.poll(left_ms):
                self._interrupted()
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return

    def _interrupted(self) -> None:
        """The client wrote ``S<signum>`` (log it, tell it to die of it) or was killed: end here."""
        data = self.conn.recv(64)
        if data.startswith(b"S") and self.log is not None:
            self.log.write("signal", signal=signal.Signals(int(data[1:].split(b"\n")[0])).name)
        if data:
            self.conn.sendall(b"K\n")
        os._exit(0)


def _worker(conn: socket.socket) -> None:
    """Answer one call on ``conn`` and exit (the forked child of :func:`serve`)."""
    try:
        payload, fds = _receive(conn)
        pid, ppid, config, *argv = [os.fsdecode(item) for item in payload.split(b"\0")[:-1]]
        for target, fd in zip((1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        caller = Caller(conn, int(pid), int(ppid))
        from . import fake_tool

        try:
            rc, keep = fake_tool.answer(config, argv, caller)
        except Exception:  # what a Python fake's uncaught exception did: a traceback, exit 1
            traceback.print_exc()
            rc, keep = 1, 0.0
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
        caller.sleep(0)  # a signal that came during the answer still ends the call
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)  # the caller's pipes close before it exits, as with a process of its own
        os.dup2(null, 2)
        conn.sendall(f"E {rc} {keep}\n".encode())
    except BaseException:  # the server's own fault: the client says so (exit 125)
        traceback.print_exc()
    finally:
        os._exit(0)


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The call's payload and the descriptors sent with it (the client's stdout and stderr)."""
    data, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(2 * 4))
    fds: list[int] = []
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(value) // 4}i", value[:len(value) - len(value) % 4])
    while len(data) < 4:
        data += _more(conn)
    (length,) = struct.unpack("I", data[:4])
    while len(data) < 4 + length:
        data += _more(conn)
    return data[4:4 + length], fds


def _more(conn: socket.socket) -> bytes:
    chunk = conn.recv(1 << 16)
    if not chunk:
        raise EOFError("the client closed the connection before its call was whole")
    return chunk
