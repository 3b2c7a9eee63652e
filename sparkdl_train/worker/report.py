"""Executor side of live progress: a partition's running totals, sent to the driver.

Best effort by design: a report that cannot be sent is logged once and
reporting stops for that task; training is never slowed or failed by it.
Reports are metadata-only REPORT frames (:mod:`sparkdl_train.ps.protocol`)
on a connection authenticated with the fit's secret.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

from .. import net
from ..model_io import metrics_result

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportSettings:
    """Where the driver's report server is (plain data)."""

    host: str
    port: int
    secret: bytes
    epoch: int
    interval: float = 0.5  # seconds between two reports of one task
    timeout: float = 10.0
    tls: net.TlsIdentity | None = None  # the report server's pinned certificate (no key)


def scalar_logs(model: Any) -> dict[str, float]:
    """The model's running metrics that are single numbers (NaN and inf kept: the driver acts on them)."""
    return {k: v for k, v in metrics_result(model).items() if isinstance(v, float)}


class Reporter:
    """Call after every step; sends at most one report per ``interval`` (the first right away)."""

    def __init__(self, settings: ReportSettings | None, partition: int):
        self.settings = settings
        self.partition = partition
        self._sock: socket.socket | None = None
        self._next = 0.0
        self._dead = settings is None
        self.sent = 0

    def __call__(self, steps: int, samples: int, model: Any) -> None:
        if self._dead:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.settings.interval
        self._send(steps, samples, model, done=False)

    def due(self) -> bool:
        """Whether the next call sends a report (a caller whose model's metrics need a copy first)."""
        return not self._dead and time.monotonic() >= self._next

    def finish(self, steps: int, samples: int, model: Any) -> None:
        """The partition's final totals; closes the connection."""
        if not self._dead:
            self._send(steps, samples, model, done=True)
        self.close()

    def close(self) -> None:
        self._dead = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, steps: int, samples: int, model: Any, done: bool) -> None:
        s = self.settings
        try:
            if self._sock is None:
                self._sock = socket.create_connection((s.host, s.port), timeout=s.timeout)
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sock = net.wrap_client(self._sock, s.tls, s.timeout)
                net.client_handshake(self._sock, self.partition, s.secret)
            meta = {
                "epoch": s.epoch,
                "partition": self.partition,
                "samples": samples,
                "steps": steps,
                "logs": scalar_logs(model) if samples else {},
                "done": done,
            }
            net.send(self._sock, net.Msg.REPORT, meta)
            self.sent += 1
        except (OSError, net.ProtocolError) as exc:
            log.warning("partition %d: live progress reports to %s:%d stopped (%s); training goes on",
                        self.partition, s.host, s.port, exc)
            self.close()
