"""The parameter server's network side, run inside the driver for one ``fit``.

Binds the configured host (port 0 by default), authenticates every connection
with the fit's secret, serves each peer on its own thread, and always shuts
down: listener closed, connections shut, threads joined.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from . import protocol as P
from .state import RoundTimeout, ServerState

log = logging.getLogger(__name__)


class ParameterServer:
    def __init__(
        self,
        state: ServerState,
        host: str,
        secret: bytes,
        port: int = 0,
        idle_timeout: float = 21600.0,
        handshake_timeout: float = 10.0,
    ):
        self.state = state
        self.host = host
        self.port = port
        self._secret = secret
        self.idle_timeout = idle_timeout
        self.handshake_timeout = handshake_timeout
        # a push carries one delta per weight, and for a table at most every row id twice
        # (touched and wanted, int64); allow framing overhead on top
        table_rows = sum(state.shapes[i][0] for i in state.sparse)
        self.max_frame_bytes = state.nbytes + 16 * table_rows + 1_048_576 + 1024 * len(state.shapes)
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "ParameterServer":
        listener = socket.create_server((self.host, self.port), reuse_port=False)
        listener.settimeout(0.5)
        self._listener = listener
        self.port = listener.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name="sparkdl_train-ps-accept", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("parameter server (%s) listening on %s:%d", self.state.mode, self.host, self.port)
        return self

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.state.fail("server shutting down")
        if self._listener is not None:
            self._listener.close()
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
            log.warning("parameter server threads still alive after stop: %s", alive)
        log.info("parameter server stopped: %s", self.state.stats.as_dict())

    def __enter__(self) -> "ParameterServer":
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
                self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn, peer), name=f"sparkdl_train-ps-{peer[1]}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
            t.start()

    def _handshake(self, conn: socket.socket) -> int:
        conn.settimeout(self.handshake_timeout)
        kind, meta, _, n = P.recv(conn, P.PREAUTH_MAX_BYTES)
        P.expect(P.Msg.HELLO, kind, meta)
        worker = meta.get("worker")
        client_nonce = meta.get("nonce")
        if not isinstance(worker, int) or not isinstance(client_nonce, str):
            raise P.ProtocolError("HELLO must carry an integer worker id and a nonce")
        server_nonce = P.new_nonce().hex()
        P.send(conn, P.Msg.CHALLENGE, {"nonce": server_nonce, "proof": P.proof(self._secret, b"server", client_nonce.encode(), server_nonce.encode())})
        kind, meta, _, _ = P.recv(conn, P.PREAUTH_MAX_BYTES)
        P.expect(P.Msg.AUTH, kind, meta)
        P.check_proof(P.proof(self._secret, b"client", server_nonce.encode(), client_nonce.encode()), meta.get("proof"))
        P.send(conn, P.Msg.AUTH_OK, {"version": self.state.version})
        return worker

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        worker = None
        try:
            try:
                worker = self._handshake(conn)
            except (P.ProtocolError, OSError) as exc:
                self.state.stats.reject()
                log.warning("rejected connection from %s: %s", peer, exc)
                return
            conn.settimeout(self.idle_timeout)
            self.state.join(worker)
            self._loop(conn, worker)
        except (P.ProtocolError, ValueError) as exc:
            log.warning("dropping worker %s (%s): %s", worker, peer, exc)
            self._try_error(conn, str(exc))
        except RoundTimeout as exc:
            log.error("worker %s: %s", worker, exc)
            self._try_error(conn, str(exc))
        except (OSError, RuntimeError) as exc:
            if not self._stopping.is_set():
                log.warning("worker %s (%s) disconnected: %s", worker, peer, exc)
        finally:
            if worker is not None:
                self.state.leave(worker)
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _try_error(self, conn: socket.socket, message: str) -> None:
        try:
            P.send(conn, P.Msg.ERROR, {"error": message})
        except OSError:
            pass

    def _loop(self, conn: socket.socket, worker: int) -> None:
        state = self.state
        n = len(state.shapes)
        buffer = P.RecvBuffer()  # a delta is applied before the next frame overwrites it
        while True:
            kind, meta, arrays, size = P.recv(conn, self.max_frame_bytes, buffer)
            state.stats.add_bytes(received=size)
            if kind == P.Msg.PULL:
                want = P.unpack_want(P.index_list(meta, "want", n), arrays)
                reply = state.pull(want)
            elif kind == P.Msg.PUSH:
                base, samples = meta.get("base_version"), meta.get("samples")
                if not isinstance(base, int) or not isinstance(samples, int) or samples < 0:
                    raise P.ProtocolError("PUSH needs integer base_version and samples")
                delta, want = P.unpack_update(meta, arrays, n)
                reply = state.push(worker, base, delta, samples, want)
            elif kind == P.Msg.DONE:
                state.leave(worker)
                state.stats.add_bytes(sent=P.send(conn, P.Msg.ACK))
                return
            else:
                raise P.ProtocolError(f"unexpected {kind.name} from worker {worker}")
            try:
                rows = sorted(want) if want else []
                state.stats.add_bytes(sent=P.send(conn, P.Msg.WEIGHTS, {"version": reply.version, "rows": rows}, reply.arrays))
            finally:
                state.release(reply)
