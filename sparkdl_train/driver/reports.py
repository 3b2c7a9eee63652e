"""Driver side of live progress: the report server and the per-epoch tally.

Workers send their partition's running totals (samples, steps, running
metrics) every ``progress.interval`` seconds; the server validates each report
(JSON only, never pickle) and queues it; :class:`EpochTally` (pure) keeps the
latest report of each partition and aggregates them for the progress bar and
for batch-level callbacks. Running metrics are combined as sample-weighted
means of the workers' running values: exact for loss and accuracy-like means,
an approximation for AUC (the epoch logs, from merged metric state, are exact).

Workers authenticate (:mod:`sparkdl_train.net`) and then send one-way, metadata-only frames::

    REPORT  {epoch, partition, samples, steps, logs: {name: float}, done}
"""

from __future__ import annotations

import math
import queue
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import net
from ..net.server import AuthServer

MAX_REPORT_BYTES = 65536


@dataclass(frozen=True)
class Report:
    epoch: int
    partition: int
    samples: int
    steps: int
    logs: dict[str, float] = field(default_factory=dict)
    done: bool = False


def _count(meta: dict[str, Any], key: str) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise net.ProtocolError(f"REPORT needs a non-negative integer {key!r}, got {v!r}")
    return v


def parse_report(meta: dict[str, Any]) -> Report:
    """Validate a REPORT frame's metadata (any deviation is a ProtocolError)."""
    logs = meta.get("logs", {})
    if not isinstance(logs, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in logs.items()
    ):
        raise net.ProtocolError("REPORT 'logs' must map metric names to numbers")
    done = meta.get("done", False)
    if not isinstance(done, bool):
        raise net.ProtocolError("REPORT 'done' must be a boolean")
    return Report(
        epoch=_count(meta, "epoch"),
        partition=_count(meta, "partition"),
        samples=_count(meta, "samples"),
        steps=_count(meta, "steps"),
        logs={k: float(v) for k, v in logs.items()},
        done=done,
    )


class EpochTally:
    """The latest report of every partition in one epoch, aggregated."""

    def __init__(self, epoch: int, workers: int):
        self.epoch = epoch
        self.workers = workers
        self.latest: dict[int, Report] = {}
        self.updates = 0

    def add(self, report: Report) -> bool:
        """Take a report (a retried task's report replaces its earlier attempt's); False if stale."""
        if report.epoch != self.epoch:
            return False
        self.latest[report.partition] = report
        self.updates += 1
        return True

    @property
    def samples(self) -> int:
        return sum(r.samples for r in self.latest.values())

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.latest.values())

    @property
    def active(self) -> int:
        return sum(not r.done for r in self.latest.values())

    @property
    def finished(self) -> int:
        return sum(r.done for r in self.latest.values())

    def logs(self) -> dict[str, float]:
        """Sample-weighted mean of each running metric over the partitions that report it
        (a NaN anywhere stays NaN: TerminateOnNaN must see it)."""
        totals: dict[str, float] = {}
        weights: dict[str, int] = {}
        for r in self.latest.values():
            if r.samples == 0:
                continue
            for k, v in r.logs.items():
                totals[k] = totals.get(k, 0.0) + v * r.samples
                weights[k] = weights.get(k, 0) + r.samples
        return {k: (totals[k] / weights[k] if math.isfinite(totals[k]) else totals[k]) for k in totals}


class ReportServer(AuthServer):
    """Receives REPORT frames and queues them as :class:`Report` for the fit's thread."""

    kind = "report server"

    def __init__(self, host: str, secret: bytes, idle_timeout: float = 21600.0, tls: net.TlsIdentity | None = None,
                 ports: tuple[int, int] | None = None):
        super().__init__(host, secret, 0, idle_timeout, tls=tls, ports=ports)
        self.events: "queue.Queue[Report]" = queue.Queue()
        self.received = 0

    def handle(self, conn: socket.socket, worker: int) -> None:
        while True:
            try:
                kind, meta, arrays, _ = net.recv(conn, MAX_REPORT_BYTES)
            except net.ProtocolError:
                raise
            except ConnectionError:  # a cancelled or failed task: its error reaches the driver through Spark
                return
            if kind != net.Msg.REPORT or arrays:
                raise net.ProtocolError(f"the report server takes REPORT frames without arrays, got {kind.name}")
            report = parse_report(meta)
            self.received += 1
            self.events.put(report)
            if report.done:
                return
