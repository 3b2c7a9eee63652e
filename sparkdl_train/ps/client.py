"""Executor-side client of the parameter server (plain data in, numpy out)."""

from __future__ import annotations

import socket
from typing import Any, Sequence

import numpy as np

from .. import net
from . import protocol as P
from .narrow import widen


class PSClient:
    def __init__(self, host: str, port: int, secret: bytes, worker: int, timeout: float = 660.0, connect_timeout: float = 30.0,
                 max_frame_bytes: int = 1 << 34, tls: net.TlsIdentity | None = None, wire: str | None = None):
        self.worker = worker
        self.address, self.timeout = f"{host}:{port}", timeout
        self.wire = wire  # fp16/bf16: deltas sent and weights received in that type (ps.compression)
        self.max_frame_bytes = max_frame_bytes
        self.bytes_sent = 0
        self.bytes_received = 0
        self._buffer = net.RecvBuffer()
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise ConnectionError(f"cannot reach the parameter server at {host}:{port} from this executor within "
                                  f"{connect_timeout:g} s (spark.sparkdl_train.ps.connectTimeout): {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock = net.wrap_client(self._sock, tls, connect_timeout)
            self._handshake(secret)
        except BaseException:
            self._sock.close()
            raise
        self._sock.settimeout(timeout)

    def _handshake(self, secret: bytes) -> None:
        net.client_handshake(self._sock, self.worker, secret)

    def _timed_out(self) -> TimeoutError:
        return TimeoutError(f"no answer from the parameter server at {self.address} within {self.timeout:g} s "
                            "(spark.sparkdl_train.ps.roundTimeout + 60 s): the driver's host or the link to it is down, or "
                            "the server is stuck")

    def _call(self, kind: net.Msg, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> tuple[int, list[np.ndarray]]:
        try:
            self.bytes_sent += net.send(self._sock, kind, meta, arrays)
            got, meta, arrays, n = net.recv(self._sock, self.max_frame_bytes, self._buffer)
        except socket.timeout:
            raise self._timed_out() from None
        self.bytes_received += n
        net.expect(net.Msg.WEIGHTS, got, meta)
        if self.wire is not None:  # float32 copies (no longer views into the receive buffer)
            arrays = [widen(a, self.wire, f"weight {i} of the server's reply") for i, a in enumerate(arrays)]
        return int(meta["version"]), arrays

    def pull(self, want: dict[int, np.ndarray] | None = None) -> tuple[int, list[np.ndarray]]:
        """The server's version and weights; a table named in ``want`` comes back as just
        the rows with those ids. The arrays are read-only views into this client's
        receive buffer: valid until its next ``pull``/``push``."""
        keys, ids = P.pack_want(want)
        meta: dict[str, Any] = {"want": keys}
        if self.wire is not None:
            meta["wire"] = self.wire
        return self._call(net.Msg.PULL, meta, ids)

    def push(
        self, delta: Sequence[Any], base_version: int, samples: int, want: dict[int, np.ndarray] | None = None
    ) -> tuple[int, list[np.ndarray]]:
        """Send a delta (arrays, or ``SparseRows`` for tables); returns the server's weights
        after applying it (after the round, in sync mode), with ``want`` as in :meth:`pull`."""
        rows, arrays = P.pack_update(delta, self.wire)
        keys, ids = P.pack_want(want)
        return self._call(net.Msg.PUSH, P.push_meta(base_version, samples, rows, keys, self.wire), [*arrays, *ids])

    def done(self) -> None:
        self.bytes_sent += net.send(self._sock, net.Msg.DONE)
        got, meta, _, _ = net.recv(self._sock, net.PREAUTH_MAX_BYTES)
        net.expect(net.Msg.ACK, got, meta)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
