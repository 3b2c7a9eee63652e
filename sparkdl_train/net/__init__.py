"""Networking shared by every server of a fit: framing (:mod:`.framing`) and mutual
authentication with a per-fit secret (:mod:`.auth`)."""

from .auth import AuthError, check_proof, client_handshake, new_nonce, new_secret, proof, server_handshake
from .framing import HEADER, MAGIC, PREAUTH_MAX_BYTES, VERSION, Msg, ProtocolError, RecvBuffer, expect, frame_bytes, recv, send

__all__ = [
    "AuthError", "HEADER", "MAGIC", "Msg", "PREAUTH_MAX_BYTES", "ProtocolError", "RecvBuffer", "VERSION", "check_proof",
    "client_handshake", "expect", "frame_bytes", "new_nonce", "new_secret", "proof", "recv", "send", "server_handshake",
]
