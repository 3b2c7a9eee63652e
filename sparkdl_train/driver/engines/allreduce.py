"""The allreduce engine (``mode='allreduce'``), driver side.

Each epoch is one Spark barrier stage with one task per rank; the driver only
broadcasts the starting state, launches the stage and adopts rank 0's final
state (all ranks hold the same weights; their digests are checked). Nothing
runs on the driver during the epoch: gradients never pass through it.

With ``spark.sparkdl_train.allreduce.epochsPerStage`` above 1 a stage runs several epochs
(:class:`_Stage`): between two of them the ranks hand the driver their partials through the
rendezvous server and wait while the fit's loop runs the epoch's callbacks and checkpoint; at the
next epoch the engine lets them go on if the driver's state is still the state rank 0 sent, and
otherwise (a callback changed it: a learning-rate schedule) ends the stage and starts the next
one from the driver's state. A stage that fails is re-run from the last epoch the driver has.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from typing import Any

import numpy as np

from ... import _compat, backend
from ...allreduce.barrier import RendezvousSettings
from ...backend import keras_backend
from ...config import EngineConfig
from ...data.adapters import DataAdapter
from ...errors import ConfigError, ConsistencyError, DataError, WorkerError
from ...failures import Cause, FailurePolicy
from ...merge import Partial
from ...model_io import get_state, metrics_result, set_metric_state, set_state
from ...net import new_identity, new_secret
from ...worker.allreduce_task import AllreduceTrainTask, RingSettings
from ..background import SparkCall
from ..connect import check_reachable, is_connect
from ..executors import locate
from ..rendezvous import RendezvousServer
from ..sparse_tables import find_tables, gradient_tables
from ..stats import EpochStats
from .base import Engine, EpochContext, Launch, driver_host, run_epoch, server_host
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


def overridden_train_step(model: Any) -> str | None:
    """The class that overrides Keras' ``train_step`` for ``model`` (``None``: Keras' own)."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            return None if cls.__module__.split(".")[0] == "keras" else cls.__name__
    return None


def check_own_train_step(model: Any) -> None:
    """The gradient-allreduce step computes the gradients itself (loss, backward pass, averaged gradients,
    the optimizer's apply): a model whose ``train_step`` does something else would be trained without it."""
    owner = overridden_train_step(model)
    if owner is not None:
        raise ConfigError(
            f"model {model.name!r} overrides train_step (class {owner}), which mode='allreduce' with per-step gradient "
            "averaging cannot run: it computes and averages the gradients itself. Train it with a parameter-server mode "
            "(mode='asynchronous' or 'synchronous' with frequency=N), model averaging (mode='synchronous'), or "
            "mode='allreduce' with frequency='epoch' (model averaging through the ring): those run your train_step."
        )


class AllreduceEngine(Engine):
    """Barrier-mode ring allreduce for the duration of one fit."""

    name = "allreduce"
    step = "fused"
    average = "gradients"  # what the ring averages (RingSettings.average)

    @classmethod
    def steps_per_call(cls, config: EngineConfig) -> int:
        return 1  # gradients are averaged between every two steps

    @classmethod
    def plan(cls, config: EngineConfig, sc: Any, train: DataAdapter) -> Launch:
        can = backend.capabilities()
        if cls.step == "fused" and config.allreduce.bucket_bytes and not can.gradient_buckets:
            raise ConfigError(can.buckets_refused)  # before any job
        if config.allreduce.collectives == "xla" and not can.xla_collectives:
            raise ConfigError(f"collectives='xla' runs the ranks as one XLA program: the model must be built with a backend "
                              f"that has XLA's collectives (KERAS_BACKEND=jax), not {keras_backend()!r}; collectives='ring' "
                              "works with every backend")
        if sc is None:  # in-process arrays: one rank
            return Launch(workers=config.num_workers or train.num_partitions(), barrier=True)
        workers = config.num_workers or barrier_slots(sc)
        check_barrier_launch(sc, workers, config.core.connect_timeout)
        known = train.known_partitions()
        if known is not None and known != workers:
            log.info("allreduce: repartitioning %d partitions into %d (one per rank; barrier stages cannot coalesce)",
                     known, workers)
        return Launch(workers=workers, barrier=True)

    @classmethod
    def sparse_tables(cls, config: EngineConfig, model: Any, workers: int, batch_size: int) -> tuple[tuple[int, int], ...]:
        if cls.step != "fused" or config.allreduce.collectives == "xla":
            return ()
        return gradient_tables(model, config.allreduce.sparse_gradients, workers, batch_size)

    def __init__(self, config: EngineConfig, model: Any, sc: Any, launch: Launch):
        check_learning_rate(model, config)
        if self.step == "fused":
            check_own_train_step(model)
        super().__init__(config, model, sc, launch)
        self.sparse_names: list[str] = []  # the tables the fit's StepSettings send by rows, named at its first epoch
        self.secret = new_secret()  # per fit; proves ring peers belong to it
        # every rank accepts its previous rank: they share one identity, key included
        self.tls = new_identity("sparkdl_train ring") if launch.tls else None
        self.totals = {"steps": 0, "bytes_sent": 0, "bytes_received": 0, "comm_seconds": 0.0, "epoch_retries": 0, "stages": 0}
        # the ranks' rendezvous through the driver (milliseconds) instead of Spark's allGather (about 1 s
        # an epoch): on a cluster whose executors reach the driver's servers (sparkdl_train.driver.rendezvous)
        use = sc is not None and config.allreduce.rendezvous == "driver" and launch.workers > 1
        self.host = (server_host if use else driver_host)(config, sc) if sc is not None else None
        if use and is_connect(sc) and check_reachable(sc, self.host, timeout=min(config.core.connect_timeout, 5.0),
                                                         ports=config.core.port_range) is not None:
            log.info("allreduce: executors cannot reach this Spark Connect client; ranks meet through Spark's allGather")
            use = False
        per_stage = config.allreduce.epochs_per_stage
        if per_stage > 1 and not use and sc is not None and launch.workers > 1:
            log.warning("allreduce: one epoch per stage: several (allreduce.epochsPerStage=%d) meet through the driver's "
                        "rendezvous server, which this fit does not use", per_stage)
        self.epochs_per_stage = per_stage if use else 1
        # rank 0's EPOCH frame carries the state: its bytes (at least the weights and four slots each, should the
        # optimizer not be built yet), the partial's framing and some room
        limit = 0
        if self.epochs_per_stage > 1:
            weights = sum(np.asarray(v).nbytes for v in model.get_weights())
            limit = max(2 * sum(np.asarray(v).nbytes for v in get_state(model)), 5 * weights) + (1 << 22)
        self.rendezvous = RendezvousServer(self.host, self.secret, config.allreduce.timeout,
                                           tls=new_identity("sparkdl_train rendezvous") if launch.tls else None,
                                           max_epoch_bytes=limit, ports=config.core.port_range) if use else None
        self._stage: _Stage | None = None

    def __enter__(self) -> "AllreduceEngine":
        if self.rendezvous is not None:
            self.rendezvous.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stage is not None:  # ranks waiting between two epochs (the fit stopped) end their stage
            self._stage.close(self.config.allreduce.timeout, cancel=exc[0] is not None)
            self._stage = None
        if self.rendezvous is not None:
            self.totals["driver_rendezvous_rounds"] = self.rendezvous.completed
            self.totals["epoch_ends_in_stage"] = self.rendezvous.boundaries_passed
            self.totals["rendezvous_peers"] = sorted(self.rendezvous.peers)  # where the ranks connected from
            self.rendezvous.stop()

    def stats(self) -> dict[str, Any]:
        c = self.config
        return {"engine": "allreduce", "average": self.average, "epochs_per_stage": self.epochs_per_stage,
                "collectives": c.allreduce.collectives,
                "ranks": self.workers, "compression": c.allreduce.compression or "none",
                "bucket_bytes": c.allreduce.bucket_bytes if self.step == "fused" else 0,
                "sparse_gradients": self.sparse_names,
                "lr_scaling": c.allreduce.lr_scaling, **self.totals}

    def _ring_settings(self, round_: str) -> RingSettings:
        c = self.config
        return RingSettings(
            self.secret, average=self.average, state_sums=c.allreduce.state_sums, timeout=c.allreduce.timeout, connect_timeout=c.core.connect_timeout,
            compression=None if c.allreduce.compression in (None, "none") else c.allreduce.compression, lr_scaling=c.allreduce.lr_scaling,
            tls=self.tls, collectives=c.allreduce.collectives, ports=c.core.port_range,
            rendezvous=None if self.rendezvous is None else RendezvousSettings(
                self.host, self.rendezvous.port, self.secret, round_,
                tls=self.rendezvous.tls.for_clients() if self.rendezvous.tls is not None else None),
        )

    def train_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        if ctx.settings.sparse_tables and not self.sparse_names:
            weights = list(ctx.model.weights)
            self.sparse_names = [weights[i].path for i, _ in ctx.settings.sparse_tables]
        if self.epochs_per_stage > 1 or self._stage is not None:
            return self._staged_epoch(ctx)
        model, train, settings, epoch = ctx.model, ctx.train, ctx.settings, ctx.epoch
        c = self.config
        # Spark never re-runs a failed barrier ResultStage, so the engine does: the driver's model
        # still holds the epoch's starting state (the last checkpoint), and a new stage starts
        # from it with a fresh rendezvous. Errors in the data or the model are not retried.
        policy = FailurePolicy(max_retries=c.allreduce.epoch_retries)
        for attempt in range(c.allreduce.epoch_retries + 1):
            rs = self._ring_settings(f"epoch-{epoch}.{attempt}")  # a re-run epoch meets in a round of its own
            self.totals["stages"] += 1
            try:
                partial, stats = run_epoch(
                    ctx, lambda p, s, r: AllreduceTrainTask(p, s, epoch, settings, rs, r),
                    launch=train.barrier_map,
                )
                break
            except WorkerError as exc:
                self._retry_or_raise(exc, policy, attempt, epoch)
        return self._adopt(model, epoch, partial), stats

    def _retry_or_raise(self, exc: WorkerError, policy: FailurePolicy, attempt: int, epoch: int) -> None:
        """A failed barrier stage: re-raise ``exc`` unless ``policy`` retries its cause, then count the retry."""
        if not policy.should_retry(Cause(exc.cause) if exc.cause else None, attempt):
            raise exc
        self.totals["epoch_retries"] += 1
        log.warning("epoch %d: the barrier stage failed (%s); re-running it from the epoch's start (retry %d of %d)",
                    epoch + 1, exc.message, attempt + 1, self.config.allreduce.epoch_retries)

    def _adopt(self, model: Any, epoch: int, partial: Partial) -> dict[str, Any]:
        """Check the ranks ended with one state, set it and the merged metrics on the driver's model."""
        infos = list(partial.partitions.values())
        digests = {i.get("weights_sha256") for i in infos}
        if len(digests) != 1:
            raise ConsistencyError(f"epoch {epoch + 1}: allreduce ranks ended with different weights ({len(digests)} digests)")
        if partial.model.sums is None:
            raise ConsistencyError(f"epoch {epoch + 1}: rank 0 reported no state")
        set_state(model, partial.model.result())
        set_metric_state(model, partial.metrics)
        self.totals["steps"] += max(i.get("global_steps", 0) for i in infos)
        for key in ("bytes_sent", "bytes_received", "comm_seconds", "bucket_exchange_seconds", "bucket_wait_seconds"):
            self.totals[key] = self.totals.get(key, 0) + sum(i.get(key, 0) for i in infos)
        return metrics_result(model)

    # -- several epochs per stage ----------------------------------------------------------
    def _staged_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        model, epoch, c = ctx.model, ctx.epoch, self.config
        entered = time.perf_counter()
        stage = self._stage
        if stage is not None:  # its ranks wait at the end of the epoch before this one
            if stage.waiting == epoch - 1 and epoch <= stage.last and stage.unchanged(model):
                with ctx.phases("broadcast"):  # the "go" that replaces a new stage's broadcast
                    stage.go_on()
            else:
                if stage.waiting is not None:
                    log.info("epoch %d: the driver's state changed after epoch %d (a callback); a new stage starts from it",
                             epoch + 1, epoch)
                stage.close(c.allreduce.timeout)
                stage = self._stage = None
        policy = FailurePolicy(max_retries=c.allreduce.epoch_retries)
        for attempt in range(c.allreduce.epoch_retries + 1):
            if stage is None:
                end = ctx.epochs - 1 if ctx.stage_end is None else ctx.stage_end
                count = min(self.epochs_per_stage, end - epoch + 1)
                stage = self._stage = _Stage(self, ctx, count, self._ring_settings(f"stage-{epoch}.{attempt}"))
                self.totals["stages"] += 1
            try:
                with ctx.phases("job"):
                    partial = ctx.monitor.run(epoch, lambda: stage.result(epoch))
                break
            except WorkerError as exc:
                stage.close(c.allreduce.timeout)
                stage = self._stage = None
                self._retry_or_raise(exc, policy, attempt, epoch)
            except BaseException:
                stage.close(c.allreduce.timeout, cancel=True)
                self._stage = None
                raise
        if epoch == stage.last:
            stage.close(c.allreduce.timeout)
            self._stage = None
        locate(ctx.train.spark_context(), partial.partitions)
        if partial.samples == 0:
            raise DataError(f"epoch {epoch + 1}: none of the {len(partial.partitions)} partitions holds a training sample")
        logs = self._adopt(model, epoch, partial)
        if self._stage is not None:
            stage.adopted(model)
        stats = EpochStats(epoch=epoch, samples=partial.samples, batches=partial.batches,
                           seconds=time.perf_counter() - entered,
                           partitions=dict(sorted(partial.partitions.items())), empty_partitions=partial.empty_partitions)
        return logs, stats


class RingAveragingEngine(AllreduceEngine):
    """``mode='allreduce', frequency='epoch'``: model averaging without the driver. Each rank trains
    its partition with Keras' own (grouped) train step, then the ranks average the model's state
    (weights and optimizer slots, weighted by samples; integer counters take the maximum: the merge
    rules of :mod:`sparkdl_train.merge`) through the ring. The same result as
    ``mode='synchronous', frequency='epoch'``, whose partials Spark merges on the driver; here the
    driver receives one state, and with ``allreduce.epochsPerStage`` one stage runs many epochs."""

    name = "ring_averaging"
    step = "train"
    average = "state"

    @classmethod
    def steps_per_call(cls, config: EngineConfig) -> int:
        return config.core.steps_per_execution

    def __init__(self, config: EngineConfig, model: Any, sc: Any, launch: Launch):
        super().__init__(config, model, sc, launch)
        # allreduce.tableAverage='touches': the tables whose rows are weighted by the ranks' lookups
        self.tables = find_tables(model) if config.allreduce.table_average == "touches" else ()
        if config.allreduce.table_average == "touches" and not self.tables:
            log.warning("table_average='touches': the model has no trainable embedding table read straight from an "
                        "input, so every weight is averaged by samples")

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "table_average": self.config.allreduce.table_average,
                "row_weighted_tables": [t.name for t in self.tables]}

    def _ring_settings(self, round_: str) -> RingSettings:
        return dataclasses.replace(super()._ring_settings(round_), tables=self.tables)


class _Stage:
    """One barrier stage running ``count`` epochs from ``ctx.epoch``, launched on a helper thread
    (its job carries the fit's job group and tags, so the fit's cancel reaches it). The ranks'
    partials of every epoch but the last arrive through the rendezvous server's watch queue; the
    last epoch's comes back as the job's result."""

    def __init__(self, engine: AllreduceEngine, ctx: EpochContext, count: int, ring: RingSettings):
        self.first, self.last, self.count = ctx.epoch, ctx.epoch + count - 1, count
        self.round = ring.rendezvous.round if ring.rendezvous is not None else None
        self.server = engine.rendezvous
        self.waiting: int | None = None  # the epoch at whose end the ranks wait for the driver
        self._sent: list[np.ndarray] | None = None  # the state the driver adopted at that end
        self._queue: queue.Queue = self.server.watch(self.round) if count > 1 else queue.Queue()
        train, refs, model, epoch = ctx.train, ctx.refs, ctx.model, ctx.epoch
        with ctx.phases("broadcast"):
            payload = refs.payload_ref(train)
            self._state = refs.state_ref(train, model, include_optimizer=True)
        task = AllreduceTrainTask(payload, self._state, epoch, ctx.settings, ring, ctx.monitor.report_settings(epoch), epochs=count)
        self._train = train

        def run() -> None:
            try:
                self._queue.put(("end", train.barrier_map(task, f"sparkdl_train fit: epochs {epoch + 1}-{epoch + count}/{ctx.epochs}")))
            except BaseException as exc:  # noqa: BLE001 - handed to the fit's thread by result()
                self._queue.put(("error", exc))

        # its job carries the fit's job group and tags (the fit's cancel reaches it) and a tag of its own
        self._call = SparkCall(train.spark_context(), run, "sparkdl_train-allreduce-stage")

    def result(self, epoch: int) -> Partial:
        """The ranks' merged partial of ``epoch`` (waiting for it)."""
        while True:
            try:
                kind, value = self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._call.wait(0) and self._queue.empty():
                    raise ConsistencyError(f"epoch {epoch + 1}: the barrier stage ended without its result") from None
                continue
            if kind == "error":
                raise value
            if kind == "end":
                if epoch != self.last:
                    raise ConsistencyError(f"epoch {epoch + 1}: the barrier stage of epochs {self.first + 1}-{self.last + 1} "
                                           "ended early")
                return value
            if kind != epoch:
                raise ConsistencyError(f"epoch {epoch + 1}: the ranks ended epoch {kind + 1} instead")
            self.waiting = epoch
            total = Partial()
            for rank in sorted(value):
                total = total.merge(Partial.from_bytes(value[rank]))
            return total

    def adopted(self, model: Any) -> None:
        """The driver's model now holds what the ranks sent (kept to see whether callbacks change it)."""
        self._sent = get_state(model) if self.waiting is not None else None

    def unchanged(self, model: Any) -> bool:
        if self._sent is None:
            return False
        now = get_state(model)
        return len(now) == len(self._sent) and all(
            a.shape == b.shape and a.dtype == b.dtype and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                                                         np.ascontiguousarray(b).view(np.uint8))
            for a, b in zip(now, self._sent))

    def go_on(self) -> None:
        self.server.decide(self.round, self.waiting, True)
        self.waiting, self._sent = None, None

    def close(self, timeout: float, cancel: bool = False) -> None:
        """End the stage: ranks waiting between two epochs are told to stop, and its job is waited
        for (``cancel``: cancelled, where the fit failed while its ranks train)."""
        if self.round is not None and self.server is not None:
            if self.waiting is not None:
                self.server.decide(self.round, self.waiting, False)
            self.server.unwatch(self.round)
        self.waiting = None
        if cancel:
            self._call.cancel(timeout)
        elif not self._call.wait(timeout):
            log.warning("allreduce: the barrier stage of epochs %d-%d did not end within %g s", self.first + 1, self.last + 1,
                        timeout)
        self._train.unshare(self._state)
