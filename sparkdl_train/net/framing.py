"""Frames between sparkdl_train's processes (pure: sockets in, numpy out; never pickle).

Every server of a fit speaks it: the parameter server (:mod:`sparkdl_train.ps`), the ring
allreduce between executors (:mod:`sparkdl_train.allreduce.transport`), the driver's report
server (:mod:`sparkdl_train.driver.reports`), each through the authenticated TCP server of
:mod:`sparkdl_train.net.server`.
Frame::

    magic b"SDPS" | version u8 | type u8 | reserved u16 | payload length u64 | payload

The payload is a :mod:`sparkdl_train.wire` message (JSON header + raw numpy buffers). Frames
larger than the receiver's limit are refused before any allocation; until a peer has
authenticated (:mod:`.auth`) the limit is ``PREAUTH_MAX_BYTES``.
"""

from __future__ import annotations

import enum
import socket
import struct
from typing import Any, Sequence

import numpy as np

from .. import wire

MAGIC = b"SDPS"
VERSION = 1
HEADER = struct.Struct("<4sBBHQ")
PREAUTH_MAX_BYTES = 4096


class Msg(enum.IntEnum):
    """Every message type of every service, in one table so that codes never collide."""


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
    JOIN = 12
    PEERS = 13
    EPOCH = 14  # an allreduce rank's end of an epoch inside a stage of several (sparkdl_train.driver.rendezvous)
    GO = 15


class ProtocolError(ConnectionError):
    """A peer sent something malformed, oversized, unauthenticated or unexpected."""


# parts of a frame smaller than this are copied together into one send
_JOIN_BYTES = 65536


def send(sock: socket.socket, mtype: Msg, meta: dict[str, Any] | None = None, arrays: Sequence[np.ndarray] = ()) -> int:
    """Send one frame; returns the bytes written. Large arrays are not copied."""
    parts = wire.encode_parts(meta or {}, arrays)
    length = sum(memoryview(p).nbytes for p in parts)
    head = HEADER.pack(MAGIC, VERSION, int(mtype), 0, length)
    # small parts (the header, biases) go out joined, a large array straight from its memory:
    # one small send per array made a segment each (TCP_NODELAY) and a wake-up of the reader
    pending = bytearray(head)
    for p in parts:
        if memoryview(p).nbytes < _JOIN_BYTES:
            pending += p
            continue
        if pending:
            sock.sendall(pending)
            pending = bytearray()
        sock.sendall(p)
    if pending:
        sock.sendall(pending)
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
        raise ProtocolError(f"bad magic {bytes(magic)!r}: not a sparkdl_train peer")
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
