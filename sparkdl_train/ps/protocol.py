"""Wire protocol of the parameter server (pure: sockets in, numpy out; never pickle).

Frame::

    magic b"SDPS" | version u8 | type u8 | reserved u16 | payload length u64 | payload

The payload is a :mod:`sparkdl_train.wire` message (JSON header + raw numpy buffers).
Frames larger than the receiver's limit are refused before any allocation.

Handshake (mutual, per-fit secret, HMAC-SHA256)::

    client -> HELLO     {worker, client_nonce}
    server -> CHALLENGE {server_nonce, proof = HMAC(secret, "server" | client_nonce | server_nonce)}
    client -> AUTH      {proof = HMAC(secret, "client" | server_nonce | client_nonce)}
    server -> AUTH_OK

Messages after the handshake (arrays in model order)::

    PULL    {want: [i, ...]}                    ids of the rows wanted from each listed table
    PUSH    {base_version, samples, rows: [i, ...], want: [i, ...]}
            one delta per weight, except that each table listed in ``rows`` sends
            two arrays instead (its touched ids, strictly increasing, and their
            delta rows); then the wanted ids
    WEIGHTS {version, rows: [i, ...]}        one array per weight; each table in
            ``rows`` sends only the rows that were asked for, in the order asked

The driver's report server (live progress, :mod:`sparkdl_train.driver.reports`)
uses the same frames and handshake; workers send it one-way, metadata-only::

    REPORT  {epoch, partition, samples, steps, logs: {name: float}, done}

Until AUTH_OK the server accepts frames of at most ``PREAUTH_MAX_BYTES``, so an
unauthenticated peer cannot make it allocate a model-sized buffer.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import socket
import struct
from typing import Any, Sequence

import numpy as np

from .. import wire
from .state import SparseRows

MAGIC = b"SDPS"
VERSION = 1
HEADER = struct.Struct("<4sBBHQ")
PREAUTH_MAX_BYTES = 4096


class Msg(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    AUTH_OK = 4
    PULL = 5
    WEIGHTS = 6
    PUSH = 7
    DONE = 8
    ACK = 9
    ERROR = 10
    REPORT = 11


class ProtocolError(ConnectionError):
    """A peer sent something malformed, oversized, unauthenticated or unexpected."""


class AuthError(ProtocolError):
    """The peer does not hold this fit's secret."""


def new_secret() -> bytes:
    return os.urandom(32)


def new_nonce() -> bytes:
    return os.urandom(16)


def proof(secret: bytes, role: bytes, a: bytes, b: bytes) -> str:
    return hmac.new(secret, role + b"|" + a + b"|" + b, hashlib.sha256).hexdigest()


def check_proof(expected: str, got: Any) -> None:
    if not isinstance(got, str) or not hmac.compare_digest(expected, got):
        raise AuthError("authentication failed: wrong secret")


def server_handshake(conn: socket.socket, secret: bytes, timeout: float, ok_meta: dict[str, Any] | None = None) -> int:
    """Authenticate a connecting peer (server side); returns the worker id it announced."""
    conn.settimeout(timeout)
    kind, meta, _, _ = recv(conn, PREAUTH_MAX_BYTES)
    expect(Msg.HELLO, kind, meta)
    worker = meta.get("worker")
    client_nonce = meta.get("nonce")
    if not isinstance(worker, int) or isinstance(worker, bool) or not isinstance(client_nonce, str):
        raise ProtocolError("HELLO must carry an integer worker id and a nonce")
    server_nonce = new_nonce().hex()
    send(conn, Msg.CHALLENGE, {"nonce": server_nonce, "proof": proof(secret, b"server", client_nonce.encode(), server_nonce.encode())})
    kind, meta, _, _ = recv(conn, PREAUTH_MAX_BYTES)
    expect(Msg.AUTH, kind, meta)
    check_proof(proof(secret, b"client", server_nonce.encode(), client_nonce.encode()), meta.get("proof"))
    send(conn, Msg.AUTH_OK, ok_meta or {})
    return worker


def client_handshake(sock: socket.socket, worker: int, secret: bytes) -> dict[str, Any]:
    """Authenticate to a server (client side; the server proves itself first); returns AUTH_OK's meta."""
    nonce = new_nonce().hex()
    send(sock, Msg.HELLO, {"worker": worker, "nonce": nonce})
    kind, meta, _, _ = recv(sock, PREAUTH_MAX_BYTES)
    expect(Msg.CHALLENGE, kind, meta)
    server_nonce = meta.get("nonce")
    if not isinstance(server_nonce, str):
        raise ProtocolError("CHALLENGE without a nonce")
    check_proof(proof(secret, b"server", nonce.encode(), server_nonce.encode()), meta.get("proof"))
    send(sock, Msg.AUTH, {"proof": proof(secret, b"client", server_nonce.encode(), nonce.encode())})
    kind, meta, _, _ = recv(sock, PREAUTH_MAX_BYTES)
    expect(Msg.AUTH_OK, kind, meta)
    return meta


def send(sock: socket.socket, mtype: Msg, meta: dict[str, Any] | None = None, arrays: Sequence[np.ndarray] = ()) -> int:
    """Send one frame; returns the bytes written. Large arrays are not copied."""
    parts = wire.encode_parts(meta or {}, arrays)
    length = sum(memoryview(p).nbytes for p in parts)
    head = HEADER.pack(MAGIC, VERSION, int(mtype), 0, length)
    small = [p for p in parts if memoryview(p).nbytes < 65536]
    if len(small) == len(parts):
        sock.sendall(head + b"".join(bytes(p) for p in parts))
    else:
        sock.sendall(head + bytes(parts[0]) + bytes(parts[1]))
        for p in parts[2:]:
            sock.sendall(p)
    return HEADER.size + length


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    pos = 0
    n = len(view)
    while pos < n:
        got = sock.recv_into(view[pos:], n - pos)
        if got == 0:
            raise ConnectionError(f"peer closed the connection after {pos} of {n} bytes")
        pos += got


class RecvBuffer:
    """A receive buffer reused across frames of one connection.

    Touching fresh memory costs more than loopback TCP for large models, so
    frames land in the same buffer each time. Arrays decoded from a frame are
    views into it: valid until the next :func:`recv` with the same buffer.
    """

    def __init__(self) -> None:
        self._buf = bytearray(0)

    def view(self, n: int) -> memoryview:
        if n > len(self._buf):
            self._buf = bytearray(n)
        return memoryview(self._buf)[:n]


def recv(sock: socket.socket, max_bytes: int, buffer: RecvBuffer | None = None) -> tuple[Msg, dict[str, Any], list[np.ndarray], int]:
    """Receive one frame: ``(type, meta, arrays, bytes read)``; arrays are read-only views
    (into ``buffer`` when given: valid until its next use)."""
    head = bytearray(HEADER.size)
    _recv_exact_into(sock, memoryview(head))
    magic, version, mtype, _, length = HEADER.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}: not a sparkdl_train parameter-server peer")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}")
    try:
        kind = Msg(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {max_bytes}")
    buf = buffer.view(length) if buffer is not None else memoryview(bytearray(length))
    _recv_exact_into(sock, buf)
    try:
        meta, arrays = wire.decode(buf)
    except wire.FrameError as exc:
        raise ProtocolError(f"malformed payload: {exc}") from None
    return kind, meta, arrays, HEADER.size + length


def expect(kind: Msg, got: Msg, meta: dict[str, Any]) -> None:
    if got == Msg.ERROR:
        raise ProtocolError(f"server error: {meta.get('error', 'unknown')}")
    if got != kind:
        raise ProtocolError(f"expected {kind.name}, got {got.name}")


def frame_bytes(meta: dict[str, Any], arrays: Sequence[np.ndarray]) -> int:
    """The exact size of the frame :func:`send` would write (nothing is copied)."""
    return HEADER.size + sum(memoryview(p).nbytes for p in wire.encode_parts(meta, arrays))


def push_meta(base_version: int, samples: int, rows: list[int], want: list[int]) -> dict[str, Any]:
    return {"base_version": base_version, "samples": samples, "rows": rows, "want": want}


def dense_exchange_bytes(weights: Sequence[np.ndarray]) -> int:
    """Bytes of one push with every weight whole plus its reply, as framed on the wire."""
    return frame_bytes(push_meta(10**6, 10**4, [], []), weights) + frame_bytes({"version": 10**6, "rows": []}, weights)


def index_list(meta: dict[str, Any], key: str, n: int) -> list[int]:
    got = meta.get(key, [])
    if not isinstance(got, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in got):
        raise ProtocolError(f"'{key}' must be a list of array indices below {n}")
    if len(set(got)) != len(got):
        raise ProtocolError(f"'{key}' lists an array twice")
    return got


def pack_want(want: dict[int, np.ndarray] | None) -> tuple[list[int], list[np.ndarray]]:
    if not want:
        return [], []
    keys = sorted(want)
    return keys, [np.asarray(want[i]) for i in keys]


def pack_update(delta: Sequence[Any]) -> tuple[list[int], list[np.ndarray]]:
    """Flatten a delta (arrays, or :class:`SparseRows` for tables) into frame arrays."""
    rows: list[int] = []
    arrays: list[np.ndarray] = []
    for i, d in enumerate(delta):
        if isinstance(d, SparseRows):
            rows.append(i)
            arrays.extend((d.ids, d.rows))
        else:
            arrays.append(d)
    return rows, arrays


def unpack_update(meta: dict[str, Any], arrays: list[np.ndarray], n: int) -> tuple[list[Any], dict[int, np.ndarray] | None]:
    """Inverse of :func:`pack_update` plus the wanted rows (shape checks are the state's)."""
    rows = set(index_list(meta, "rows", n))
    want_keys = index_list(meta, "want", n)
    expected = n + len(rows) + len(want_keys)
    if len(arrays) != expected:
        raise ProtocolError(f"update carries {len(arrays)} arrays, its header announces {expected}")
    delta: list[Any] = []
    pos = 0
    for i in range(n):
        if i in rows:
            delta.append(SparseRows(arrays[pos], arrays[pos + 1]))
            pos += 2
        else:
            delta.append(arrays[pos])
            pos += 1
    return delta, unpack_want(want_keys, arrays[pos:])


def unpack_want(keys: list[int], arrays: list[np.ndarray]) -> dict[int, np.ndarray] | None:
    if len(arrays) != len(keys):
        raise ProtocolError(f"{len(arrays)} id arrays for {len(keys)} wanted tables")
    return dict(zip(keys, arrays)) if keys else None
