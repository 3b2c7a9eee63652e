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

A barrier stage that runs several epochs (``spark.sparkdl_train.allreduce.epochsPerStage``) meets
here between them too: each rank sends ``EPOCH {round, rank, size, epoch}`` with its epoch's
:class:`~sparkdl_train.merge.Partial` in binary form (rank 0's with the ranks' common state), the
server hands the complete set to whoever :meth:`RendezvousServer.watch` es the round (the engine,
which merges it, runs the epoch's callbacks and checkpoint) and answers every rank ``GO {go}`` once
the engine has :meth:`RendezvousServer.decide` d: go on with the next epoch, or end the stage.

JSON frames and :mod:`sparkdl_train.wire` buffers, never pickle; bounded sizes, every wait bounded.
"""

from __future__ import annotations

import queue
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import net
from ..net.server import AuthServer

MAX_JOIN_BYTES = 16384
MAX_MESSAGE_CHARS = 4096  # one rank's message: its address and token (JSON)


@dataclass
class _Round:
    size: int
    messages: dict[int, str] = field(default_factory=dict)
    delivered: int = 0


@dataclass
class _Boundary:
    size: int
    blobs: dict[int, bytes] = field(default_factory=dict)
    go: bool | None = None  # the engine's decision
    answered: int = 0


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

    def __init__(self, host: str, secret: bytes, timeout: float, tls: net.TlsIdentity | None = None,
                 max_epoch_bytes: int = MAX_JOIN_BYTES, ports: tuple[int, int] | None = None):
        super().__init__(host, secret, 0, idle_timeout=timeout + 60.0, tls=tls, ports=ports)
        self.timeout = timeout
        self.max_epoch_bytes = max_epoch_bytes  # one rank's EPOCH frame (rank 0's carries the model's state)
        self._rounds: dict[str, _Round] = {}
        self._boundaries: dict[tuple[str, int], _Boundary] = {}
        self._watchers: dict[str, queue.Queue] = {}
        self._cv = threading.Condition()
        self.completed = 0  # rounds whose every rank got the answer
        self.boundaries_passed = 0  # epoch ends inside a stage every rank was answered for

    def watch(self, round_: str) -> "queue.Queue[tuple[int, dict[int, bytes]]]":
        """The queue that receives ``(epoch, {rank: partial bytes})`` each time every rank of the
        stage ``round_`` has ended an epoch; each must be answered with :meth:`decide`."""
        with self._cv:
            return self._watchers.setdefault(round_, queue.Queue())

    def unwatch(self, round_: str) -> None:
        """Forget ``round_``: ranks still waiting at one of its epoch ends are told to stop."""
        with self._cv:
            self._watchers.pop(round_, None)
            for (r, _), b in self._boundaries.items():
                if r == round_ and b.go is None:
                    b.go = False
            self._cv.notify_all()

    def decide(self, round_: str, epoch: int, go: bool) -> None:
        """Answer the ranks waiting at the end of ``epoch`` of the stage ``round_``."""
        with self._cv:
            b = self._boundaries.get((round_, epoch))
            if b is not None:
                b.go = go
                self._cv.notify_all()

    def stopping(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def handle(self, conn: socket.socket, worker: int) -> None:
        kind, meta, arrays, _ = net.recv(conn, max(MAX_JOIN_BYTES, self.max_epoch_bytes))
        if kind == net.Msg.EPOCH:
            return self._epoch_end(conn, worker, meta, arrays)
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
            if self._stopping.is_set():
                self._rounds.pop(key, None)
                return  # closing the connection tells the rank; its error names the wait
            if done:
                out = [r.messages[i] for i in range(r.size)]
                r.delivered += 1
                if r.delivered == r.size:
                    self._rounds.pop(key, None)
                    self.completed += 1
            else:
                self._rounds.pop(key, None)
                missing = sorted(set(range(r.size)) - set(r.messages))
        if not done:  # the ranks that came learn which never did (their errors name those ranks' hosts)
            self.try_error(conn, f"ranks {missing} did not join round {key!r} within {self.timeout:g} s", missing=missing)
            return
        net.send(conn, net.Msg.PEERS, {"messages": out})

    def _epoch_end(self, conn: socket.socket, worker: int, meta: dict[str, Any], arrays: list[Any]) -> None:
        key, rank, size, epoch = meta.get("round"), meta.get("rank"), meta.get("size"), meta.get("epoch")
        parse_join({"round": key, "rank": rank, "size": size, "message": ""}, worker)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise net.ProtocolError(f"EPOCH needs a non-negative integer 'epoch', got {epoch!r}")
        if len(arrays) != 1 or arrays[0].dtype != "uint8" or arrays[0].ndim != 1:
            raise net.ProtocolError("EPOCH carries one byte array (the rank's partial)")
        round_ = key.split(":", 1)[0]
        with self._cv:
            watcher = self._watchers.get(round_)
            if watcher is None:
                go = False  # the engine no longer waits for this stage: its ranks stop
            else:
                b = self._boundaries.setdefault((round_, epoch), _Boundary(size))
                if b.size != size:
                    raise net.ProtocolError(f"stage {round_!r} has {b.size} ranks; rank {rank} says {size}")
                b.blobs[rank] = arrays[0].tobytes()
                if len(b.blobs) == b.size:
                    watcher.put((epoch, dict(b.blobs)))
                    b.blobs.clear()
                done = self._cv.wait_for(lambda: b.go is not None or self._stopping.is_set(), self.timeout)
                if not done or self._stopping.is_set():
                    return  # closing the connection tells the rank
                go = b.go
                b.answered += 1
                if b.answered == b.size:
                    self._boundaries.pop((round_, epoch), None)
                    self.boundaries_passed += 1
        net.send(conn, net.Msg.GO, {"go": bool(go)})
