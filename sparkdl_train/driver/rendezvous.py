"""The allreduce ranks' rendezvous, served by the driver.

Every epoch of the allreduce engine is a barrier stage whose ranks must learn each other's
``host:port`` before they form the ring. ``BarrierTaskContext.allGather`` does it, but Spark's
executor side checks for the answer once a second (``Thread.sleep(1000)`` between polls of the
coordinator's reply), so every epoch paid about a second: measured 1.0 s per call on ``local[2]``,
as much as a GPU epoch of the flagship job at 64 workers. This server does the same exchange in
milliseconds: each rank connects (authenticated with the fit's secret, TLS when the fit uses it),
sends ``JOIN {round, rank, size, message}`` and gets ``PEERS {messages}`` (ordered by rank) once
every rank of its round has joined. A round is one epoch's attempt of the stage (a re-run epoch
starts a new one); a round not complete within the timeout closes its connections, and the ranks
fail naming the wait.

Metadata only (JSON frames, never pickle), bounded sizes, every wait bounded.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import net
from ..serving import AuthServer

MAX_JOIN_BYTES = 16384
MAX_MESSAGE_CHARS = 4096  # one rank's message: its address and token (JSON)


@dataclass
class _Round:
    size: int
    messages: dict[int, str] = field(default_factory=dict)
    delivered: int = 0


def parse_join(meta: dict[str, Any], worker: int) -> tuple[str, int, int, str]:
    """A JOIN frame's ``(round, rank, size, message)``; any deviation is a ProtocolError. ``worker``
    is the id the peer authenticated as, which must be its rank."""
    key, rank, size, message = meta.get("round"), meta.get("rank"), meta.get("size"), meta.get("message")
    if not isinstance(key, str) or not 0 < len(key) <= 128:
        raise net.ProtocolError("JOIN needs a 'round' string of at most 128 characters")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= 65536:
        raise net.ProtocolError(f"JOIN needs a positive integer 'size', got {size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise net.ProtocolError(f"JOIN rank {rank!r} is out of range for size {size}")
    if rank != worker:
        raise net.ProtocolError(f"JOIN from peer {worker} claims rank {rank}")
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        raise net.ProtocolError(f"JOIN needs a 'message' string of at most {MAX_MESSAGE_CHARS} characters")
    return key, rank, size, message


class RendezvousServer(AuthServer):
    """All-gathers one message per rank for each round; a round's size is its first joiner's."""

    kind = "rendezvous server"

    def __init__(self, host: str, secret: bytes, timeout: float, tls: net.TlsIdentity | None = None):
        super().__init__(host, secret, 0, idle_timeout=timeout + 60.0, tls=tls)
        self.timeout = timeout
        self._rounds: dict[str, _Round] = {}
        self._cv = threading.Condition()
        self.completed = 0  # rounds whose every rank got the answer

    def stopping(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def handle(self, conn: socket.socket, worker: int) -> None:
        kind, meta, arrays, _ = net.recv(conn, MAX_JOIN_BYTES)
        if kind != net.Msg.JOIN or arrays:
            raise net.ProtocolError(f"the rendezvous server takes one JOIN frame without arrays, got {kind.name}")
        key, rank, size, message = parse_join(meta, worker)
        with self._cv:
            r = self._rounds.setdefault(key, _Round(size))
            if r.size != size:
                raise net.ProtocolError(f"round {key!r} has {r.size} ranks; rank {rank} says {size}")
            r.messages[rank] = message  # a rank that joins again (its retried task) replaces its message
            self._cv.notify_all()
            done = self._cv.wait_for(lambda: len(r.messages) == r.size or self._stopping.is_set(), self.timeout)
            if not done or self._stopping.is_set():
                self._rounds.pop(key, None)
                return  # closing the connection tells the rank; its error names the wait
            out = [r.messages[i] for i in range(r.size)]
            r.delivered += 1
            if r.delivered == r.size:
                self._rounds.pop(key, None)
                self.completed += 1
        net.send(conn, net.Msg.PEERS, {"messages": out})
