"""A small authenticated TCP server run inside the driver for one ``fit``.

Binds the configured host (port 0 by default), authenticates every
connection with the fit's secret (:func:`sparkdl_train.ps.protocol.server_handshake`),
serves each peer on its own thread, and always shuts down: listener closed,
connections shut, threads joined. Subclasses implement :meth:`handle`.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from .. import net
from ..errors import ConfigError
from . import ports as port_range

log = logging.getLogger(__name__)


class AuthServer:
    kind = "server"

    def __init__(self, host: str, secret: bytes, port: int = 0, idle_timeout: float = 21600.0, handshake_timeout: float = 10.0,
                 tls: "net.TlsIdentity | None" = None, ports: "port_range.PortRange | None" = None):
        self.host = host
        self.ports = ports  # network.ports: the range a port 0 is picked from (None: any)
        self.tls = tls  # with it, every connection is TLS with this certificate before the secret's handshake
        self.port = port
        self._secret = secret
        self.idle_timeout = idle_timeout
        self.handshake_timeout = handshake_timeout
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.peers: set[str] = set()  # the addresses authenticated peers connected from

    # -- hooks ----------------------------------------------------------------------------
    def handle(self, conn: socket.socket, worker: int) -> None:
        """Serve one authenticated peer until it leaves (runs on the peer's thread)."""
        raise NotImplementedError

    def ok_meta(self) -> dict[str, Any]:
        """What AUTH_OK tells an authenticated peer."""
        return {}

    def rejected(self, peer: Any, exc: BaseException) -> None:
        log.warning("%s rejected connection from %s: %s", self.kind, peer, exc)

    def stopping(self) -> None:
        """Called first in :meth:`stop` (e.g. to wake threads waiting on state)."""

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "AuthServer":
        try:
            if self.port:
                listener = socket.create_server((self.host, self.port), reuse_port=False)
            else:
                listener = port_range.listener(self.host, self.ports, self.kind, backlog=128)
        except OSError as exc:  # unknown name, or an address that is not this machine's
            raise ConfigError(
                f"the {self.kind} cannot listen on {self.host}:{self.port}: {exc}. It binds the driver's address "
                "(spark.sparkdl_train.ps.host, else spark.driver.host): set it to an address of the driver "
                "machine that the executors can reach"
            ) from None
        listener.settimeout(0.5)
        self._listener = listener
        self.port = listener.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name=f"sparkdl_train-{self.kind}-accept", daemon=True)
        t.start()
        self._accept_thread = t
        self._threads.append(t)
        log.info("%s listening on %s:%d", self.kind, self.host, self.port)
        return self

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.stopping()
        if self._listener is not None:
            try:  # wakes the accept loop now (Linux); closing alone leaves it in accept() until its 0.5 s timeout
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        # the accept loop first: a connection it accepted as the stop began must not get a handler
        # this stop misses (a cancelled fit's last report left one alive for the handshake's timeout)
        accept = getattr(self, "_accept_thread", None)
        if accept is not None:
            accept.join(timeout)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in list(self._threads):
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("%s threads still alive after stop: %s", self.kind, alive)

    def __enter__(self) -> "AuthServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    # -- serving --------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, peer = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # notice hosts that vanish
            with self._lock:
                if self._stopping.is_set():  # accepted as stop() began: refused, not served
                    conn.close()
                    break
                self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn, peer), name=f"sparkdl_train-{self.kind}-{peer[1]}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        worker = None
        try:
            try:
                if self.tls is not None:
                    plain = conn
                    conn = net.wrap_server(conn, self.tls, self.handshake_timeout)
                    with self._lock:  # stop() must shut the TLS socket, not the one it wraps
                        self._conns.discard(plain)
                        self._conns.add(conn)
                worker = net.server_handshake(conn, self._secret, self.handshake_timeout, self.ok_meta())
            except (net.ProtocolError, OSError) as exc:
                self.rejected(peer, exc)
                return
            conn.settimeout(self.idle_timeout)
            with self._lock:
                self.peers.add(str(peer[0]))
            self.handle(conn, worker)
        except (net.ProtocolError, ValueError) as exc:
            log.warning("%s: dropping worker %s (%s): %s", self.kind, worker, peer, exc)
            self.try_error(conn, str(exc))
        except (OSError, RuntimeError) as exc:
            if not self._stopping.is_set():
                log.warning("%s: worker %s (%s) disconnected: %s", self.kind, worker, peer, exc)
        except Exception as exc:  # noqa: BLE001 - an authenticated peer sent something unexpected
            log.warning("%s: dropping worker %s (%s) after %s: %s", self.kind, worker, peer, type(exc).__name__, exc)
            self.try_error(conn, f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def try_error(conn: socket.socket, message: str, **meta: Any) -> None:
        try:
            net.send(conn, net.Msg.ERROR, {"error": message, **meta})
        except OSError:
            pass
