"""The attestation-agent's ``ExtendRuntimeMeasurement`` over ttrpc: the sanctioned way to add an
event to RTMR3 and AA's event log once the agent runs (issue 43 item 3; docs/interface.md 3.14).

Facts this module is written to (guest-components 8246e5e0, containerd/ttrpc-rust; the
project's notes in ../shared/trustee-aa.md, section 3):

* The agent listens on the path socket :data:`SOCKET_PATH` (not abstract: reachable under
  ``PrivateNetwork=yes`` and ``RestrictAddressFamilies=AF_UNIX``).
* ttrpc frame: a 10-byte header ``u32 BE length, u32 BE stream id (odd from a client), u8
  type (1 request, 2 response), u8 flags (0)``, then one protobuf message of at most 4 MiB.
* ttrpc ``Request``: service=1, method=2 (strings), payload=3 (bytes), timeout_nano=4 (int64),
  metadata=5 (repeated, never sent here). ``Response``: status=1 (``Status``: code=1 int32,
  message=2 string), payload=2 (bytes).
* ``ExtendRuntimeMeasurementRequest``: Domain=1, Operation=2, Content=3 (strings), optional
  uint64 RegisterIndex=4, a *PCR number* the agent maps to a CC register: omitted, the agent
  uses its PCR 17, which lands in RTMR3; 3 or 4 would land in RTMR1. So it is never sent.
* ``ExtendRuntimeMeasurementResponse``: Result=1, ``OK=0, NOT_SUPPORTED=1, NOT_ENABLED=2``
  (OK arrives as an empty payload). Every failure is ttrpc status 13 with a fixed message.

The protobuf encoding is written by hand (varints and length-delimited fields: the handful
this needs), so the agent needs no protobuf package; tests/test_aa_ttrpc.py holds it to the
known-answer frame and to the ``protobuf`` package. Standard library only; every socket
operation has a timeout.
"""

from __future__ import annotations

import errno
import os
import struct

SOCKET_PATH = "/run/confidential-containers/attestation-agent/attestation-agent.sock"
SERVICE = "attestation_agent.AttestationAgentService"
METHOD = "ExtendRuntimeMeasurement"
OK, NOT_SUPPORTED, NOT_ENABLED = 0, 1, 2
RESULTS = {OK: "OK", NOT_SUPPORTED: "NOT_SUPPORTED", NOT_ENABLED: "NOT_ENABLED"}
REQUEST, RESPONSE = 1, 2  # ttrpc message types
HEADER = struct.Struct(">IIBB")  # length, stream id, type, flags
MESSAGE_MAX = 4 << 20  # ttrpc-rust's limit on one message
TIMEOUT_S = 10.0  # each socket operation; the agent's extend is one write and one append
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5  # protobuf wire types


class Unreachable(Exception):
    """Nobody answers on the socket (missing, refused): the agent is not running."""


class AAError(Exception):
    """The agent was reached but the call failed (a ttrpc error status, a broken or late
    answer); the message names the attestation-agent and what went wrong."""


def varint(value: int) -> bytes:
    """A protobuf varint of ``value`` (>= 0; an int64 below 0 is sent as its 64-bit
    two's complement, ten bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def field_bytes(number: int, data: bytes) -> bytes:
    """A length-delimited field (string, bytes, message)."""
    return _key(number, _LEN) + varint(len(data)) + data


def field_varint(number: int, value: int) -> bytes:
    """A varint field (int32, int64, uint64, enum)."""
    return _key(number, _VARINT) + varint(value)


def _present(number: int, data: bytes) -> bytes:
    """A length-delimited proto3 field, left out when empty (as proto3 encoders do)."""
    return field_bytes(number, data) if data else b""


def extend_request(domain: str, operation: str, content: str) -> bytes:
    """``ExtendRuntimeMeasurementRequest`` with Domain, Operation and Content; RegisterIndex
    omitted (module docstring: the agent's default lands in RTMR3)."""
    return (_present(1, domain.encode("utf-8")) + _present(2, operation.encode("utf-8")) +
            _present(3, content.encode("utf-8")))


def ttrpc_request(payload: bytes, timeout_nano: int = 0, service: str = SERVICE,
                  method: str = METHOD) -> bytes:
    """A ttrpc ``Request``: service, method, payload, and timeout_nano when not 0 (proto3
    leaves a zero out); no metadata."""
    body = (_present(1, service.encode("utf-8")) + _present(2, method.encode("utf-8")) +
            _present(3, payload))
    return body + (field_varint(4, timeout_nano) if timeout_nano else b"")


def frame(message: bytes, stream_id: int = 1, type_: int = REQUEST) -> bytes:
    """The ttrpc frame: the 10-byte header, then the message."""
    return HEADER.pack(len(message), stream_id, type_, 0) + message


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint cut short or too long")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """The fields of one protobuf message, in order: ``(number, wire type, value)`` with a
    varint's int or the bytes of the others (fixed 64/32-bit kept raw).

    Raises:
        ValueError: a message that does not parse (a field cut short, a group, a bad key).
    """
    out: list[tuple[int, int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("a field numbered 0")
        if wire == _VARINT:
            value, at = _read_varint(data, at)
            out.append((number, wire, value))
            continue
        if wire == _LEN:
            size, at = _read_varint(data, at)
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
        else:
            raise ValueError(f"wire type {wire} (groups are not used here)")
        if at + size > len(data):
            raise ValueError(f"field {number} runs past the end")
        out.append((number, wire, data[at:at + size]))
        at += size
    return out


def _last(found, number: int, wire: int, default):
    """The last value of field ``number`` (protobuf: the last one wins), or ``default``."""
    value = default
    for n, w, v in found:
        if n == number:
            if w != wire:
                raise ValueError(f"field {number} has wire type {w}, not {wire}")
            value = v
    return value


def ttrpc_response(message: bytes) -> tuple[int, str, bytes]:
    """A ttrpc ``Response``: ``(status code, status message, payload)`` (no status: 0, "").

    Raises:
        ValueError: it does not parse.
    """
    found = fields(message)
    status = _last(found, 1, _LEN, b"")
    payload = _last(found, 2, _LEN, b"")
    inner = fields(status)
    code = _last(inner, 1, _VARINT, 0)
    if code >= 1 << 63:
        code -= 1 << 64
    said = _last(inner, 2, _LEN, b"").decode("utf-8", errors="backslashreplace")
    return code, said, payload


def extend_result(payload: bytes) -> int:
    """The ``Result`` of an ``ExtendRuntimeMeasurementResponse`` (an empty one: OK).

    Raises:
        ValueError: it does not parse.
    """
    return _last(fields(payload), 1, _VARINT, OK)


def extend(socket_path: str, domain: str, operation: str, content: str,
           timeout_s: float = TIMEOUT_S) -> int:
    """Call ``ExtendRuntimeMeasurement`` once; the agent's ``Result`` (:data:`OK`,
    :data:`NOT_SUPPORTED`, :data:`NOT_ENABLED`, or another number it sent).

    Args:
        socket_path: the socket's real path (already resolved under the root; a long one is
            reached through its folder's ``/proc/self/fd`` link, as ``sun_path`` holds 108
            bytes).
        domain, operation, content: the AAEL event's three parts.
        timeout_s: the limit of each socket operation (connect, send, every receive), seconds;
            also sent as the call's ttrpc timeout.

    Raises:
        Unreachable: no socket, or nobody listening on it (ENOENT, ECONNREFUSED): the agent is
            not running.
        AAError: the agent was reached, but the call failed (named).
    """
    sock = _connect(socket_path, timeout_s)
    try:
        request = ttrpc_request(extend_request(domain, operation, content),
                                int(timeout_s * 1e9))
        try:
            sock.sendall(frame(request, 1, REQUEST))
            length, stream, type_, _flags = HEADER.unpack(_receive(sock, HEADER.size))
            if length > MESSAGE_MAX:
                raise AAError(f"the attestation-agent's answer announces {length} bytes, more "
                              "than ttrpc's 4 MiB")
            if (stream, type_) != (1, RESPONSE):
                raise AAError(f"the attestation-agent answered stream {stream} type {type_}, "
                              "not the response to stream 1")
            message = _receive(sock, length)
        except OSError as err:
            raise AAError(_said("ExtendRuntimeMeasurement", err)) from None
    finally:
        sock.close()
    try:
        code, said, payload = ttrpc_response(message)
        if code != 0:
            raise AAError(f"the attestation-agent refused ExtendRuntimeMeasurement: ttrpc "
                          f"status {code}: {said[:200]}")
        return extend_result(payload)
    except ValueError as err:
        raise AAError(f"the attestation-agent's answer does not parse: {err}") from None


def _receive(sock, size: int) -> bytes:
    """Exactly ``size`` bytes (each ``recv`` under the socket's timeout).

    Raises:
        OSError: the socket failed, timed out, or closed before ``size`` bytes came.
    """
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise OSError(errno.ECONNRESET, "the attestation-agent closed the connection "
                          "before its whole answer")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _said(what: str, err: OSError) -> str:
    import socket

    if isinstance(err, socket.timeout) or isinstance(err, TimeoutError):
        return f"the attestation-agent did not answer {what} in time"
    return f"the attestation-agent: {what} failed: {err.strerror or err}"


_GONE = (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR, errno.ENOTSOCK)


def _connect(socket_path: str, timeout_s: float):
    """A stream socket connected to the agent's, with ``timeout_s`` on every operation.

    Raises:
        Unreachable: no socket or nobody listening. AAError: any other failure (named).
    """
    import socket

    try:  # a sandbox without AF_UNIX (RestrictAddressFamilies=) refuses here: EAFNOSUPPORT
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError as err:
        raise AAError(_said(f"a unix socket for {SOCKET_PATH}", err)) from None
    sock.settimeout(timeout_s)
    folder = None
    try:
        folder = os.open(os.path.dirname(socket_path) or ".",
                         os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        sock.connect(f"/proc/self/fd/{folder}/{os.path.basename(socket_path)}")
    except OSError as err:
        sock.close()
        if err.errno in _GONE:
            raise Unreachable(f"{SOCKET_PATH}: {err.strerror or err}") from None
        raise AAError(_said(f"connect to {SOCKET_PATH}", err)) from None
    finally:
        if folder is not None:
            os.close(folder)
    return sock


def answers(socket_path: str, timeout_s: float = 2.0) -> bool:
    """Whether the agent may be running: True unless its socket is missing or refuses a
    connection (a connect that fails otherwise or takes too long counts as running: the
    repair that asks must not run then). One connect, closed at once, nothing sent."""
    try:
        _connect(socket_path, timeout_s).close()
    except Unreachable:
        return False
    except AAError:
        return True
    return True
