"""The synchronous, once-per-epoch model-averaging engine.

Each epoch the driver broadcasts its state (weights and optimizer slots); every
partition trains one local epoch from it; Spark merges the workers' results
with ``treeReduce`` (sample-weighted mean of the state, sum of metric state),
and the driver adopts the mean. An empty partition contributes nothing and is
reported; it never drags the average towards the starting point.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..data.adapters import DataAdapter
from ..errors import DataError
from ..merge import Partial
from ..model_io import metrics_result, set_metric_state, set_state
from ..worker.tasks import EvaluateTask, StepSettings, TrainEpochTask
from .session import SharedRefs

log = logging.getLogger(__name__)


@dataclass
class EpochStats:
    epoch: int
    samples: int
    batches: int
    seconds: float
    partitions: dict[int, dict[str, Any]]
    empty_partitions: list[int]

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class FitStats:
    epochs: list[EpochStats] = field(default_factory=list)
    num_workers: int = 0
    worker_threads: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "worker_threads": self.worker_threads,
            "epochs": [
                {
                    "epoch": e.epoch,
                    "samples": e.samples,
                    "batches": e.batches,
                    "seconds": e.seconds,
                    "samples_per_second": e.samples_per_second,
                    "empty_partitions": e.empty_partitions,
                    "partitions": e.partitions,
                }
                for e in self.epochs
            ],
        }


def evaluate_logs(model: Any, adapter: DataAdapter, refs: SharedRefs, settings: StepSettings, description: str) -> dict[str, float]:
    """Globally correct metrics of the driver model's weights over ``adapter``."""
    state = refs.state_ref(adapter, model, include_optimizer=False)
    try:
        task = EvaluateTask(refs.payload_ref(adapter), state, settings)
        partial = adapter.map_reduce(task, description)
    finally:
        adapter.unshare(state)
    if partial.samples == 0 or partial.metrics is None:
        raise DataError(f"{description}: no samples to evaluate")
    set_metric_state(model, partial.metrics)
    return metrics_result(model)


def train_one_epoch(
    model: Any,
    train: DataAdapter,
    refs: SharedRefs,
    settings: StepSettings,
    epoch: int,
    epochs: int,
) -> tuple[dict[str, float], EpochStats]:
    start = time.perf_counter()
    state = refs.state_ref(train, model, include_optimizer=True)
    try:
        task = TrainEpochTask(refs.payload_ref(train), state, epoch, settings)
        partial: Partial = train.map_reduce(task, f"sparkdl_train fit: epoch {epoch + 1}/{epochs}")
    finally:
        train.unshare(state)
    n_parts = train.num_partitions()
    empty = sorted(set(range(n_parts)) - {p for p, i in partial.partitions.items() if i.get("samples", 0) > 0})
    if partial.samples == 0:
        raise DataError(f"epoch {epoch + 1}: none of the {n_parts} partitions holds a training sample")
    if empty:
        log.warning(
            "epoch %d: %d of %d partitions were empty (%s); they did not take part in the average",
            epoch + 1, len(empty), n_parts, empty[:10],
        )
    set_state(model, partial.model.result())
    set_metric_state(model, partial.metrics)
    logs = metrics_result(model)
    stats = EpochStats(
        epoch=epoch,
        samples=partial.samples,
        batches=partial.batches,
        seconds=time.perf_counter() - start,
        partitions=dict(sorted(partial.partitions.items())),
        empty_partitions=empty,
    )
    return logs, stats
