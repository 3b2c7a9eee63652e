"""Where a fit's wall time goes: named phases timed on the driver, and the startup costs each
task reports from its executor (``FitStats.phases``, ``EpochStats.phases``,
``FitStats.fixed_costs()``; ``bench/e2e/fixed_cost.py`` prints them)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

# what a task reports about its own start (seconds; see sparkdl_train.worker.tasks.PartitionPass)
TASK_STARTUP = ("tf_import", "rebuild", "state", "first_batch", "first_step", "first_pull", "rendezvous", "ring_broadcast")


class Phases:
    """Wall seconds per named phase, summed when a phase runs more than once."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.seconds.items()}


def task_startup(partitions: dict[int, dict[str, Any]]) -> dict[str, float]:
    """The slowest task's figure for each startup cost of one epoch (the epoch waits for it)."""
    out: dict[str, float] = {}
    for info in partitions.values():
        for k, v in (info.get("startup") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = max(out.get(k, 0.0), float(v))
    return {k: round(out[k], 4) for k in TASK_STARTUP if k in out}
