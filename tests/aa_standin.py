"""A stand-in for CoCo's attestation-agent's ttrpc server (issue 43 item 3): a thread listening
on a unix socket that answers ``ExtendRuntimeMeasurement`` as it is told, and, with a writer,
does what the agent does for an event (guest-components, ../shared/trustee-aa.md section 2):
extend RTMR3, then write the record at the log offset it remembered at its start.

Standard library only, and its own protobuf reading (not podvm_gpu.host.aa's): it also runs as
a script inside the booted test images (``python3 aa_standin.py SOCKET ANSWER LOG REGISTER``).

Answers: ``ok`` (an empty payload), ``not_enabled``, ``not_supported`` (the Result enum's 2 and
1), ``error`` (ttrpc status 13 with the agent's fixed message), ``hang`` (no answer), ``close``
(the connection closed unanswered).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import threading

ERROR_MESSAGE = "[ERROR:attestation-agent] AA extend runtime measurement failed"
RESULT = {"not_supported": 1, "not_enabled": 2}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def decode(data: bytes) -> dict:
    """A message's fields: number -> list of values (ints for varints, bytes otherwise)."""
    out: dict = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        if key & 7 == 0:
            value, at = _varint(data, at)
        elif key & 7 == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise ValueError(f"wire type {key & 7}")
        out.setdefault(key >> 3, []).append(value)
    return out


def _enc(number: int, wire: int, value) -> bytes:
    def var(n: int) -> bytes:
        n &= (1 << 64) - 1
        out = bytearray()
        while n > 0x7F:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes(out) + bytes([n])
    if wire == 0:
        return var(number << 3) + var(value)
    return var(number << 3 | 2) + var(len(value)) + value


class AAWriter:
    """The agent's event-log writer from guest-components b74cb38d: the log opened once at its
    start without O_APPEND, each event extended into the register, then written at the offset
    remembered (so a record appended behind its back is overwritten)."""

    def __init__(self, log_path: str, register):
        self.register = register
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.offset = os.fstat(self.fd).st_size

    def __call__(self, domain: str, operation: str, content: str) -> None:
        text = f"{domain} {operation} {content}".encode()
        event = struct.pack("<II", 0x4141454C, len(text)) + text
        digest = hashlib.sha384(event).digest()
        self.register.extend(digest)
        entry = struct.pack("<IIIH", 4, 6, 1, 0x000C) + digest + struct.pack("<I", len(event)) + event
        os.pwrite(self.fd, entry, self.offset)
        self.offset += len(entry)

    def close(self) -> None:
        os.close(self.fd)


class StandIn:
    """The server. ``requests`` holds each call received: ``{"service", "method", "stream",
    "type", "timeout_nano", "fields"}`` with the request payload's fields decoded
    (``{1: [domain], 2: [operation], 3: [content]}``; 4 present only if RegisterIndex was
    sent)."""

    def __init__(self, path: str, answer: str = "ok", writer=None):
        self.path, self.answer, self.writer = path, answer, writer
        self.requests: list[dict] = []
        self._stop = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
        try:  # sun_path holds 108 bytes: a temporary root's path can be longer
            self.sock.bind(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
        finally:
            os.close(folder)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    self._one(conn)
                except (OSError, ValueError, IndexError):
                    pass

    def _read(self, conn, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _one(self, conn) -> None:
        length, stream, type_, _flags = struct.unpack(">IIBB", self._read(conn, 10))
        request = decode(self._read(conn, length))
        payload = decode(request.get(3, [b""])[0])
        self.requests.append({
            "service": request[1][0].decode(), "method": request[2][0].decode(),
            "stream": stream, "type": type_, "timeout_nano": request.get(4, [0])[0],
            "fields": payload})
        if self.answer == "close":
            return
        if self.answer == "hang":
            self._stop.wait(30)
            return
        if self.answer == "error":
            body = _enc(1, 2, _enc(1, 0, 13) + _enc(2, 2, ERROR_MESSAGE.encode()))
        else:
            if self.answer == "ok" and self.writer is not None:
                self.writer(*(payload[n][0].decode() for n in (1, 2, 3)))
            result = RESULT.get(self.answer, 0)
            body = _enc(1, 2, b"") + (_enc(2, 2, _enc(1, 0, result)) if result else b"")
        conn.sendall(struct.pack(">IIBB", len(body), stream, 2, 0) + body)


class FileRegister:
    """The register as a file under a root (the real-systemd test: the sysfs file of the
    test's root), extended in place as the kernel does."""

    def __init__(self, path: str):
        self.path = path

    def extend(self, digest: bytes) -> None:
        with open(self.path, "rb") as f:
            old = f.read()
        with open(self.path, "wb") as f:
            f.write(hashlib.sha384(old + digest).digest())


def main(argv: list[str]) -> int:
    """``aa_standin.py SOCKET ANSWER [LOG REGISTER]``: serve until SIGTERM, each request
    appended as JSON to ``$AA_STANDIN_REQUESTS`` (default SOCKET + ``.requests``; the boot
    test's is under /srv, which outlives the container)."""
    path, answer = argv[0], argv[1]
    record = os.environ.get("AA_STANDIN_REQUESTS") or path + ".requests"
    writer = AAWriter(argv[2], FileRegister(argv[3])) if len(argv) > 3 else None
    server = StandIn(path, answer, writer)
    server.thread.start()
    seen = 0
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *a: server._stop.set())
    while not server._stop.is_set():
        time.sleep(0.1)
        while seen < len(server.requests):
            r = dict(server.requests[seen])
            r["fields"] = {str(k): [v.decode() if isinstance(v, bytes) else v for v in vs]
                           for k, vs in r["fields"].items()}
            with open(record, "a") as f:
                f.write(json.dumps(r) + "\n")
            seen += 1
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
