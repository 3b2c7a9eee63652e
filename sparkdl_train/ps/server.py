"""The parameter server's network side, run inside the driver for one ``fit``
(an :class:`~sparkdl_train.net.server.AuthServer` serving PULL/PUSH/DONE frames)."""

from __future__ import annotations

import logging
import socket

from .. import net
from ..net.server import AuthServer
from . import protocol as P
from .state import RoundTimeout, ServerState

log = logging.getLogger(__name__)


class ParameterServer(AuthServer):
    kind = "parameter server"

    def __init__(
        self,
        state: ServerState,
        host: str,
        secret: bytes,
        port: int = 0,
        idle_timeout: float = 21600.0,
        handshake_timeout: float = 10.0,
        tls: net.TlsIdentity | None = None,
        ports: tuple[int, int] | None = None,
    ):
        super().__init__(host, secret, port, idle_timeout, handshake_timeout, tls=tls, ports=ports)
        self.state = state
        # a push carries one delta per weight, and for a table at most every row id twice
        # (touched and wanted, int64); allow framing overhead on top
        table_rows = sum(state.shapes[i][0] for i in state.sparse)
        self.max_frame_bytes = state.nbytes + 16 * table_rows + 1_048_576 + 1024 * len(state.shapes)

    def ok_meta(self) -> dict:
        return {"version": self.state.version}

    def rejected(self, peer, exc) -> None:
        self.state.stats.reject()
        super().rejected(peer, exc)

    def stopping(self) -> None:
        self.state.fail("server shutting down")

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        log.info("parameter server stopped: %s", self.state.stats.as_dict())

    def handle(self, conn: socket.socket, worker: int) -> None:
        try:
            address = str(conn.getpeername()[0])
        except OSError:
            address = None
        self.state.join(worker, address)
        try:
            self._loop(conn, worker)
        except RoundTimeout as exc:
            log.error("worker %s: %s", worker, exc)
            self.try_error(conn, str(exc))
        finally:
            self.state.leave(worker)

    def _loop(self, conn: socket.socket, worker: int) -> None:
        state = self.state
        n = len(state.shapes)
        buffer = net.RecvBuffer()  # a delta is applied before the next frame overwrites it
        while True:
            kind, meta, arrays, size = net.recv(conn, self.max_frame_bytes, buffer)
            state.stats.add_bytes(received=size)
            if kind == net.Msg.PULL:
                want = P.unpack_want(P.index_list(meta, "want", n), arrays)
                reply = state.pull(want)
            elif kind == net.Msg.PUSH:
                base, samples = meta.get("base_version"), meta.get("samples")
                if not isinstance(base, int) or not isinstance(samples, int) or samples < 0:
                    raise net.ProtocolError("PUSH needs integer base_version and samples")
                delta, want = P.unpack_update(meta, arrays, n)
                reply = state.push(worker, base, delta, samples, want)
            elif kind == net.Msg.DONE:
                state.leave(worker)
                state.stats.add_bytes(sent=net.send(conn, net.Msg.ACK))
                return
            else:
                raise net.ProtocolError(f"unexpected {kind.name} from worker {worker}")
            try:
                rows = sorted(want) if want else []
                out = reply.on_wire(P.wire_of(meta))
                state.stats.add_bytes(sent=net.send(conn, net.Msg.WEIGHTS, {"version": reply.version, "rows": rows}, out))
            finally:
                state.release(reply)
