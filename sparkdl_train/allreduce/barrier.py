"""The Spark side of the rendezvous: a :class:`~.transport.Group` over BarrierTaskContext."""

from __future__ import annotations

import threading
from typing import Any

from .transport import RingTimeout


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


class SingleGroup:
    """A ring of one (in-process arrays)."""

    rank = 0
    size = 1

    def all_gather(self, message: str) -> list[str]:
        return [message]
