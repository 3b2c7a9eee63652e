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
        addr = self._ctx.getTaskInfos()[self.rank].address
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
        s = self.settings
        attempt = self._ctx.stageAttemptNumber() if hasattr(self._ctx, "stageAttemptNumber") else 0
        key = f"{s.round}:{attempt}:{self._calls}"
        self._calls += 1
        where = f"the driver's rendezvous server at {s.host}:{s.port}"
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
            sock.settimeout(self.timeout)
            net.send(sock, net.Msg.JOIN, {"round": key, "rank": self.rank, "size": self.size, "message": message})
            kind, meta, _, _ = net.recv(sock, MAX_PEERS_BYTES)
        except socket.timeout:
            raise RingTimeout(
                f"rank {self.rank}: rendezvous through {where} not complete after {self.timeout:g} s: another rank "
                "never reached it (see spark.sparkdl_train.allreduce.timeout)"
            ) from None
        except (ConnectionError, OSError) as exc:
            raise RingTimeout(
                f"rank {self.rank}: {where} closed the rendezvous ({exc}): another rank never reached it within "
                "spark.sparkdl_train.allreduce.timeout, or the fit ended"
            ) from None
        finally:
            sock.close()
        if kind == net.Msg.ERROR:
            raise RingError(f"rank {self.rank}: {where} refused the rendezvous: {meta.get('error')}")
        messages = meta.get("messages") if kind == net.Msg.PEERS else None
        if not isinstance(messages, list) or len(messages) != self.size or not all(isinstance(m, str) for m in messages):
            raise RingError(f"rank {self.rank}: {where} answered {kind.name} without {self.size} messages")
        return messages


class SingleGroup:
    """A ring of one (in-process arrays)."""

    rank = 0
    size = 1

    def all_gather(self, message: str) -> list[str]:
        return [message]
