"""TLS for the servers of one fit, with a per-fit certificate pinned by fingerprint.

When the cluster encrypts its own traffic, so do sparkdl_train's sockets. The driver creates a
fresh key and self-signed certificate for each server of a fit (:func:`new_identity`); clients
receive only the certificate's SHA-256 fingerprint, as plain data, and refuse any server that
presents another certificate (:func:`wrap_client`). Nothing is asked of the user: no CA, no
keystore. The per-fit secret's HMAC handshake (:mod:`.auth`) still runs inside the TLS session,
so a peer must both reach the pinned server and hold the secret.

The ring allreduce has no server on the driver: every rank accepts its previous rank, so the
ranks share one identity, key included, shipped like the secret with the Spark task.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass, replace

from .auth import AuthError


class TlsError(AuthError):
    """The TLS handshake failed, or the peer's certificate is not this fit's."""


@dataclass(frozen=True)
class TlsIdentity:
    """A server's certificate (PEM) and its pinned fingerprint; ``key_pem`` only where a server
    runs (:meth:`for_clients` drops it)."""

    cert_pem: bytes
    fingerprint: str  # SHA-256 of the DER certificate, hex
    key_pem: bytes | None = None

    def for_clients(self) -> "TlsIdentity":
        return replace(self, key_pem=None)

    def __repr__(self) -> str:  # never print the key
        return f"TlsIdentity(fingerprint={self.fingerprint[:16]}..., key={'yes' if self.key_pem else 'no'})"


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def new_identity(common_name: str = "sparkdl_train fit") -> TlsIdentity:
    """A fresh EC P-256 key and a self-signed certificate valid for two days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # executors' clocks may lag the driver's
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    der = cert.public_bytes(serialization.Encoding.DER)
    return TlsIdentity(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        fingerprint=fingerprint(der),
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


_contexts: dict[str, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _server_context(identity: TlsIdentity) -> ssl.SSLContext:
    if identity.key_pem is None:
        raise ValueError("a TLS server needs the identity's key (for_clients() dropped it)")
    with _contexts_lock:
        ctx = _contexts.get(identity.fingerprint)
        if ctx is not None:
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.num_tickets = 0  # no session tickets: a ring link only ever writes on its client side
        # load_cert_chain reads files: write them readable by this user only, for the moment it takes
        with tempfile.TemporaryDirectory(prefix="sparkdl_train-tls-") as tmp:
            path = os.path.join(tmp, "identity.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(identity.key_pem + identity.cert_pem)
            ctx.load_cert_chain(path)
        if len(_contexts) > 64:  # one per fit and server: keep the latest few
            _contexts.clear()
        _contexts[identity.fingerprint] = ctx
        return ctx


def _client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # the certificate is pinned by fingerprint instead (checked below)
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def wrap_server(sock: socket.socket, identity: TlsIdentity | None, timeout: float) -> socket.socket:
    """The server side of an accepted connection: TLS when ``identity`` is given, else ``sock``.
    A plaintext or non-TLS peer fails the handshake (:class:`TlsError`) within ``timeout``."""
    if identity is None:
        return sock
    sock.settimeout(timeout)
    try:
        return _server_context(identity).wrap_socket(sock, server_side=True)
    except (ssl.SSLError, ConnectionError) as exc:
        raise TlsError(f"TLS handshake failed (a peer without TLS, or not this fit's): {_reason(exc)}") from None


def wrap_client(sock: socket.socket, identity: TlsIdentity | None, timeout: float) -> socket.socket:
    """The client side: TLS when ``identity`` is given, refusing a server whose certificate's
    fingerprint is not the pinned one; else ``sock``."""
    if identity is None:
        return sock
    sock.settimeout(timeout)
    try:
        tls = _client_context().wrap_socket(sock, server_side=False)
    except (ssl.SSLError, ConnectionError) as exc:  # a plaintext server resets or answers garbage
        raise TlsError(f"TLS handshake failed (the server does not speak TLS, or is not this fit's): {_reason(exc)}") from None
    der = tls.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(fingerprint(der), identity.fingerprint):
        tls.close()
        raise TlsError("the server's TLS certificate is not this fit's (fingerprint mismatch): refusing to talk to it")
    return tls


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc)


# Spark's own settings that mean "this cluster encrypts or authenticates its traffic"
SPARK_SECURITY_KEYS = ("spark.network.crypto.enabled", "spark.ssl.enabled", "spark.ssl.rpc.enabled", "spark.authenticate")


def spark_secures_traffic(conf: dict[str, str]) -> list[str]:
    """The keys among :data:`SPARK_SECURITY_KEYS` set to true in ``conf``."""
    return [k for k in SPARK_SECURITY_KEYS if str(conf.get(k, "false")).strip().lower() == "true"]


def wanted(setting: str, conf: dict[str, str]) -> bool:
    """``spark.sparkdl_train.network.tls``: ``on``, ``off``, or ``auto`` (on when Spark's own
    traffic is encrypted or authenticated)."""
    if setting == "on":
        return True
    if setting == "off":
        return False
    return bool(spark_secures_traffic(conf))
