"""The allreduce engine (``mode='allreduce'``), driver side.

Each epoch is one Spark barrier stage with one task per rank; the driver only
broadcasts the starting state, launches the stage and adopts rank 0's final
state (all ranks hold the same weights; their digests are checked). Nothing
runs on the driver during the epoch: gradients never pass through it.
"""

from __future__ import annotations

import logging
from typing import Any

from ... import _compat
from ...allreduce.barrier import RendezvousSettings
from ...config import EngineConfig
from ...data.adapters import DataAdapter
from ...errors import ConfigError, ConsistencyError, WorkerError
from ...failures import Cause, FailurePolicy
from ...model_io import metrics_result, set_metric_state, set_state
from ...net import new_identity, new_secret
from ...worker.allreduce_task import AllreduceTrainTask, RingSettings
from ..connect import check_reachable, is_connect
from ..rendezvous import RendezvousServer
from ..stats import EpochStats
from .base import Engine, EpochContext, Launch, driver_host, run_epoch
from .slots import barrier_slots, check_barrier_launch

log = logging.getLogger(__name__)


def check_learning_rate(model: Any, config: EngineConfig) -> None:
    if config.allreduce.lr_scaling == "none":
        return
    lr = _compat.raw_learning_rate(model.optimizer)
    if lr is not None and callable(lr) and not hasattr(lr, "assign"):
        raise ConfigError(
            f"lr_scaling={config.allreduce.lr_scaling!r} needs a constant learning rate; the optimizer uses a "
            "schedule: scale the schedule itself and leave lr_scaling='none'"
        )


class AllreduceEngine(Engine):
    """Barrier-mode ring allreduce for the duration of one fit."""

    name = "allreduce"
    step = "fused"

    @classmethod
    def steps_per_call(cls, config: EngineConfig) -> int:
        return 1  # gradients are averaged between every two steps

    @classmethod
    def plan(cls, config: EngineConfig, sc: Any, train: DataAdapter) -> Launch:
        if sc is None:  # in-process arrays: one rank
            return Launch(workers=config.num_workers or train.num_partitions(), barrier=True)
        workers = config.num_workers or barrier_slots(sc)
        check_barrier_launch(sc, workers, config.core.connect_timeout)
        known = train.known_partitions()
        if known is not None and known != workers:
            log.info("allreduce: repartitioning %d partitions into %d (one per rank; barrier stages cannot coalesce)",
                     known, workers)
        return Launch(workers=workers, barrier=True)

    def __init__(self, config: EngineConfig, model: Any, sc: Any, launch: Launch):
        check_learning_rate(model, config)
        super().__init__(config, model, sc, launch)
        self.secret = new_secret()  # per fit; proves ring peers belong to it
        # every rank accepts its previous rank: they share one identity, key included
        self.tls = new_identity("sparkdl_train ring") if launch.tls else None
        self.totals = {"steps": 0, "bytes_sent": 0, "bytes_received": 0, "comm_seconds": 0.0, "epoch_retries": 0}
        # the ranks' rendezvous through the driver (milliseconds) instead of Spark's allGather (about 1 s
        # an epoch): on a cluster whose executors reach the driver's servers (sparkdl_train.driver.rendezvous)
        self.host = driver_host(config, sc) if sc is not None else None
        use = sc is not None and config.allreduce.rendezvous == "driver" and launch.workers > 1
        if use and is_connect(sc) and check_reachable(sc, self.host, timeout=min(config.core.connect_timeout, 5.0)) is not None:
            log.info("allreduce: executors cannot reach this Spark Connect client; ranks meet through Spark's allGather")
            use = False
        self.rendezvous = RendezvousServer(self.host, self.secret, config.allreduce.timeout,
                                           tls=new_identity("sparkdl_train rendezvous") if launch.tls else None) if use else None

    def __enter__(self) -> "AllreduceEngine":
        if self.rendezvous is not None:
            self.rendezvous.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.rendezvous is not None:
            self.totals["driver_rendezvous_rounds"] = self.rendezvous.completed
            self.rendezvous.stop()

    def stats(self) -> dict[str, Any]:
        c = self.config
        return {"engine": "allreduce", "ranks": self.workers, "compression": c.allreduce.compression or "none",
                "lr_scaling": c.allreduce.lr_scaling, **self.totals}

    def _ring_settings(self, round_: str) -> RingSettings:
        c = self.config
        return RingSettings(
            self.secret, timeout=c.allreduce.timeout, connect_timeout=c.core.connect_timeout,
            compression=None if c.allreduce.compression in (None, "none") else c.allreduce.compression, lr_scaling=c.allreduce.lr_scaling,
            tls=self.tls,
            rendezvous=None if self.rendezvous is None else RendezvousSettings(
                self.host, self.rendezvous.port, self.secret, round_,
                tls=self.rendezvous.tls.for_clients() if self.rendezvous.tls is not None else None),
        )

    def train_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        model, train, settings, epoch = ctx.model, ctx.train, ctx.settings, ctx.epoch
        c = self.config
        # Spark never re-runs a failed barrier ResultStage, so the engine does: the driver's model
        # still holds the epoch's starting state (the last checkpoint), and a new stage starts
        # from it with a fresh rendezvous. Errors in the data or the model are not retried.
        policy = FailurePolicy(max_retries=c.allreduce.epoch_retries)
        for attempt in range(c.allreduce.epoch_retries + 1):
            rs = self._ring_settings(f"epoch-{epoch}.{attempt}")  # a re-run epoch meets in a round of its own
            try:
                partial, stats = run_epoch(
                    ctx, lambda p, s, r: AllreduceTrainTask(p, s, epoch, settings, rs, r),
                    launch=train.barrier_map,
                )
                break
            except WorkerError as exc:
                if not policy.should_retry(Cause(exc.cause) if exc.cause else None, attempt):
                    raise
                self.totals["epoch_retries"] += 1
                log.warning("epoch %d: the barrier stage failed (%s); re-running it from the epoch's start (retry %d of %d)",
                            epoch + 1, exc.message, attempt + 1, c.allreduce.epoch_retries)
        infos = list(partial.partitions.values())
        digests = {i.get("weights_sha256") for i in infos}
        if len(digests) != 1:
            raise ConsistencyError(f"epoch {epoch + 1}: allreduce ranks ended with different weights ({len(digests)} digests)")
        if partial.model.sums is None:
            raise ConsistencyError(f"epoch {epoch + 1}: rank 0 reported no state")
        set_state(model, partial.model.result())
        set_metric_state(model, partial.metrics)
        self.totals["steps"] += max(i.get("global_steps", 0) for i in infos)
        for key in ("bytes_sent", "bytes_received", "comm_seconds"):
            self.totals[key] += sum(i.get(key, 0) for i in infos)
        return metrics_result(model), stats
