"""Mutual authentication of two peers of one fit (per-fit secret, HMAC-SHA256)::

    client -> HELLO     {worker, nonce: client_nonce}
    server -> CHALLENGE {nonce: server_nonce, proof = HMAC(secret, "server" | client_nonce | server_nonce)}
    client -> AUTH      {proof = HMAC(secret, "client" | server_nonce | client_nonce)}
    server -> AUTH_OK

The server proves itself first, so a worker never sends data to a stranger; both sides compare
in constant time. Until AUTH_OK, frames are limited to ``PREAUTH_MAX_BYTES``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from typing import Any

from .framing import PREAUTH_MAX_BYTES, Msg, ProtocolError, expect, recv, send


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
