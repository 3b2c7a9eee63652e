"""``mode='synchronous', frequency='epoch'``: model averaging once per epoch, merged by Spark.

The driver broadcasts its state (weights and optimizer slots); every partition trains one local
epoch from it; Spark merges the results with ``treeReduce`` (sample-weighted mean of the state,
sum of metric state) and the driver adopts the mean. No server is needed. An empty partition
contributes nothing and is reported; it never drags the average towards the starting point.
"""

from __future__ import annotations

from typing import Any

from ...model_io import metrics_result, set_metric_state, set_state
from ...worker.tasks import TrainEpochTask
from ..stats import EpochStats
from .base import Engine, EpochContext, run_epoch


class AveragingEngine(Engine):
    name = "spark_averaging"

    def train_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        settings, epoch = ctx.settings, ctx.epoch
        partial, stats = run_epoch(ctx, lambda p, s, r: TrainEpochTask(p, s, epoch, settings, r))
        set_state(ctx.model, partial.model.result())
        set_metric_state(ctx.model, partial.metrics)
        return metrics_result(ctx.model), stats
