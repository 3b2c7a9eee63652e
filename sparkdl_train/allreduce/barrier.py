"""The Spark side of the rendezvous: :class:`~.transport.Group` s over a barrier stage's tasks.

:class:`BarrierGroup` exchanges the ranks' messages through ``BarrierTaskContext.allGather``
(Spark's executor polls for its answer once a second: about 1 s per epoch); :class:`DriverGroup`
through the driver's rendezvous server (:mod:`sparkdl_train.driver.rendezvous`, milliseconds), with
the same ranks, size and address.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import net
from .transport import RingError, RingTimeout

MAX_PEERS_BYTES = 1 << 24


@dataclass(frozen=True)
class RendezvousSettings:
    """Where the driver's rendezvous server is, and this epoch's round (plain data)."""

    host: str
    port: int
    secret: bytes
    round: str  # the epoch; the stage attempt is added by the task
    tls: net.TlsIdentity | None = None  # the server's pinned certificate (no key)


class BarrierGroup:
    """rank = partition id; ``all_gather`` is Spark's, bounded by our own timeout.

    ``spark.barrier.sync.timeout`` defaults to a year and is fixed when the
    SparkContext starts, so the wait runs in a helper thread and gives up after
    ``timeout`` seconds (Spark then kills the stage's other tasks).
    """

    def __init__(self, ctx: Any, timeout: float):
        self._ctx = ctx
        self.rank = ctx.partitionId()
        self.size = len(ctx.getTaskInfos())
        self.timeout = timeout

    def address(self) -> str:
        """The host Spark reports for this task's executor (reachable from the driver and peers)."""
        return self.address_of(self.rank)

    def address_of(self, rank: int) -> str:
        """The host Spark reports for rank ``rank``'s executor."""
        addr = self._ctx.getTaskInfos()[rank].address
        host = addr.rsplit(":", 1)[0] if ":" in addr else addr
        return host.strip("[]")

    def all_gather(self, message: str) -> list[str]:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = self._ctx.allGather(message)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                box["err"] = exc

        t = threading.Thread(target=run, name="sparkdl-allgather", daemon=True)
        t.start()
        t.join(self.timeout)
        if t.is_alive():
            raise RingTimeout(
                f"rank {self.rank}: rendezvous (allGather) not complete after {self.timeout:g} s: "
                "another rank never reached it (see spark.sparkdl_train.allreduce.timeout)"
            )
        if "err" in box:
            raise box["err"]
        return list(box["out"])


class DriverGroup(BarrierGroup):
    """:class:`BarrierGroup` whose ``all_gather`` goes through the driver's rendezvous server."""

    def __init__(self, ctx: Any, timeout: float, settings: RendezvousSettings, connect_timeout: float = 30.0):
        super().__init__(ctx, timeout)
        self.settings = settings
        self.connect_timeout = connect_timeout
        self._calls = 0

    def all_gather(self, message: str) -> list[str]:
        attempt = self._ctx.stageAttemptNumber() if hasattr(self._ctx, "stageAttemptNumber") else 0
        key = f"{self.settings.round}:{attempt}:{self._calls}"
        self._calls += 1
        # the server answers a round that never completes within the timeout, naming the ranks that never came;
        # this rank's own wait is a backstop a little longer
        kind, meta = self._call(net.Msg.JOIN, {"round": key, "rank": self.rank, "size": self.size, "message": message}, (),
                                "rendezvous", grace=5.0)
        messages = meta.get("messages") if kind == net.Msg.PEERS else None
        if not isinstance(messages, list) or len(messages) != self.size or not all(isinstance(m, str) for m in messages):
            raise RingError(f"rank {self.rank}: {self._where()} answered {kind.name} without {self.size} messages")
        return messages

    def epoch_end(self, epoch: int, partial: bytes) -> bool:
        """Hand the driver this rank's ``partial`` (:meth:`~sparkdl_train.merge.Partial.to_bytes`)
        of ``epoch``, a stage's epoch before its last, and wait for its answer: ``True``, train the
        next epoch; ``False``, end the stage here (the fit stops, or the driver's state changed)."""
        attempt = self._ctx.stageAttemptNumber() if hasattr(self._ctx, "stageAttemptNumber") else 0
        meta = {"round": f"{self.settings.round}:{attempt}", "rank": self.rank, "size": self.size, "epoch": epoch}
        kind, answer = self._call(net.Msg.EPOCH, meta, [np.frombuffer(partial, np.uint8)], f"meeting at the end of epoch {epoch + 1}")
        if kind != net.Msg.GO or not isinstance(answer.get("go"), bool):
            raise RingError(f"rank {self.rank}: {self._where()} answered {kind.name} at the end of epoch {epoch + 1}")
        return answer["go"]

    def _where(self) -> str:
        return f"the driver's rendezvous server at {self.settings.host}:{self.settings.port}"

    def _call(self, kind: net.Msg, meta: dict[str, Any], arrays: Any, what: str, grace: float = 0.0) -> tuple[net.Msg, dict[str, Any]]:
        """One authenticated request to the driver's server and its answer, every wait bounded."""
        s, where = self.settings, self._where()
        try:
            sock = socket.create_connection((s.host, s.port), timeout=min(self.timeout, self.connect_timeout))
        except OSError as exc:
            raise RingError(
                f"rank {self.rank}: cannot reach {where} ({exc}): executors must reach the driver's address "
                "(spark.sparkdl_train.ps.host), or set spark.sparkdl_train.allreduce.rendezvous=spark"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = net.wrap_client(sock, s.tls, self.connect_timeout)
            net.client_handshake(sock, self.rank, s.secret)
            sock.settimeout(self.timeout + grace)
            net.send(sock, kind, meta, arrays)
            got, answer, _, _ = net.recv(sock, MAX_PEERS_BYTES)
        except socket.timeout:
            raise RingTimeout(
                f"rank {self.rank}: {what} through {where} not complete after {self.timeout:g} s: another rank "
                "never reached it, or the driver did not answer (see spark.sparkdl_train.allreduce.timeout)"
            ) from None
        except (ConnectionError, OSError) as exc:
            raise RingTimeout(
                f"rank {self.rank}: {where} closed the {what} ({exc}): another rank never reached it within "
                "spark.sparkdl_train.allreduce.timeout, or the fit ended"
            ) from None
        finally:
            sock.close()
        if got == net.Msg.ERROR:
            missing = answer.get("missing")
            if isinstance(missing, list) and missing and all(isinstance(m, int) and 0 <= m < self.size for m in missing):
                ranks = ", ".join(f"rank {m} (its executor at {self.address_of(m)})" for m in missing)
                raise RingTimeout(
                    f"rank {self.rank}: {ranks} never reached the {what} through {where} within {self.timeout:g} s "
                    "(spark.sparkdl_train.allreduce.timeout): that host, its link or its executor is down or stuck"
                )
            raise RingError(f"rank {self.rank}: {where} refused the {what}: {answer.get('error')}")
        return got, answer


class SingleGroup:
    """A ring of one (in-process arrays)."""

    rank = 0
    size = 1

    def all_gather(self, message: str) -> list[str]:
        return [message]
