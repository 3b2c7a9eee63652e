"""Networking shared by every server of a fit: framing (:mod:`.framing`), mutual
authentication with a per-fit secret (:mod:`.auth`) and TLS with a pinned per-fit
certificate (:mod:`.tls`)."""

from .auth import AuthError, check_proof, client_handshake, new_nonce, new_secret, proof, server_handshake
from .framing import HEADER, MAGIC, PREAUTH_MAX_BYTES, VERSION, Msg, ProtocolError, RecvBuffer, expect, frame_bytes, recv, send
from .tls import TlsError, TlsIdentity, new_identity, wrap_client, wrap_server

__all__ = [
    "AuthError", "HEADER", "MAGIC", "Msg", "PREAUTH_MAX_BYTES", "ProtocolError", "RecvBuffer", "VERSION", "check_proof",
    "client_handshake", "expect", "frame_bytes", "new_identity", "new_nonce", "new_secret", "proof", "recv", "send",
    "server_handshake", "TlsError", "TlsIdentity", "wrap_client", "wrap_server",
]
