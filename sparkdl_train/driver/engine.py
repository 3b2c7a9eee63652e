"""Training engines: how an epoch's work is run and merged.

* :class:`AveragingEngine` (``mode='synchronous', frequency='epoch'``): the
  driver broadcasts its state (weights and optimizer slots); every partition
  trains one local epoch from it; Spark merges the results with ``treeReduce``
  (sample-weighted mean of the state, sum of metric state) and the driver adopts
  the mean. No server is needed.
* :class:`ParameterServerEngine` (every other PS mode/frequency): a parameter
  server runs in the driver for the whole fit; workers pull weights, train, and
  push weight deltas every N steps (or once per partition); the server merges
  them by the mode's rule (:mod:`sparkdl_train.ps.state`). Embedding tables
  fed by a model input travel by rows: a worker pushes the rows its batches
  touched and pulls the rows its next batches look up
  (:mod:`sparkdl_train.worker.sparse`).

In both, an empty partition contributes nothing and is reported; it never
drags the average towards the starting point.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import EngineConfig
from ..data.adapters import DataAdapter
from ..errors import DataError
from ..merge import Partial
from ..model_io import metrics_result, set_metric_state, set_optimizer_state, set_state
from ..ps.protocol import dense_exchange_bytes, new_secret
from ..ps.server import ParameterServer
from ..ps.state import ServerState
from ..worker.ps_task import PSSettings, PSTrainTask
from ..worker.tasks import EvaluateTask, StepSettings, TrainEpochTask
from .executors import locate
from .monitor import FitMonitor
from .session import SharedRefs
from .sparse import find_tables

log = logging.getLogger(__name__)


@dataclass
class EpochStats:
    epoch: int
    samples: int
    batches: int
    seconds: float
    partitions: dict[int, dict[str, Any]]
    empty_partitions: list[int]
    interrupted: bool = False  # stopped mid-epoch (model.stop_training set by a callback)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class FitStats:
    epochs: list[EpochStats] = field(default_factory=list)
    num_workers: int = 0
    worker_threads: int | None = None
    mode: str = "synchronous"
    frequency: str | int = "epoch"
    server: dict[str, Any] | None = None
    reports: int = 0  # live progress reports received from workers
    master: str | None = None  # the Spark master the fit ran on
    environment: list[dict[str, Any]] | None = None  # the executor environment check's reports (preflight)

    def executor_ids(self) -> list[str]:
        """The executors that ran this fit's training tasks (``"driver"`` in local mode)."""
        return sorted({str(i.get("executor_id")) for e in self.epochs for i in e.partitions.values()})

    def as_dict(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "worker_threads": self.worker_threads,
            "mode": self.mode,
            "frequency": self.frequency,
            "server": self.server,
            "reports": self.reports,
            "master": self.master,
            "executor_ids": self.executor_ids(),
            "environment": self.environment,
            "epochs": [
                {
                    "epoch": e.epoch,
                    "samples": e.samples,
                    "batches": e.batches,
                    "seconds": e.seconds,
                    "samples_per_second": e.samples_per_second,
                    "empty_partitions": e.empty_partitions,
                    "interrupted": e.interrupted,
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


def run_epoch(
    model: Any,
    train: DataAdapter,
    refs: SharedRefs,
    make_task: Callable[[Any, Any, Any], Any],
    epoch: int,
    epochs: int,
    monitor: FitMonitor,
    launch: Callable[[Any, str], Partial] | None = None,
) -> tuple[Partial, EpochStats]:
    """Broadcast the driver's state, run ``make_task(payload_ref, state_ref, report_settings)``
    on every partition (through ``launch``, default ``train.map_reduce``, driven by
    ``monitor``), merge."""
    start = time.perf_counter()
    state = refs.state_ref(train, model, include_optimizer=True)
    launch = launch or train.map_reduce
    try:
        task = make_task(refs.payload_ref(train), state, monitor.report_settings(epoch))
        partial: Partial = monitor.run(epoch, lambda: launch(task, f"sparkdl_train fit: epoch {epoch + 1}/{epochs}"))
    finally:
        train.unshare(state)
    locate(train.spark_context(), partial.partitions)
    n_parts = train.num_partitions()
    empty = sorted(set(range(n_parts)) - {p for p, i in partial.partitions.items() if i.get("samples", 0) > 0})
    if partial.samples == 0:
        raise DataError(f"epoch {epoch + 1}: none of the {n_parts} partitions holds a training sample")
    if empty:
        log.warning(
            "epoch %d: %d of %d partitions were empty (%s); they did not take part in the average",
            epoch + 1, len(empty), n_parts, empty[:10],
        )
    stats = EpochStats(
        epoch=epoch,
        samples=partial.samples,
        batches=partial.batches,
        seconds=time.perf_counter() - start,
        partitions=dict(sorted(partial.partitions.items())),
        empty_partitions=empty,
    )
    return partial, stats


class AveragingEngine:
    """Synchronous model averaging once per epoch, merged by Spark itself."""

    def __init__(self, config: EngineConfig):
        self.config = config

    def __enter__(self) -> "AveragingEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def server_stats(self) -> dict[str, Any] | None:
        return None

    def stopped(self, model: Any) -> None:
        """An epoch was cancelled midway: the driver keeps the weights it started it with."""

    def train_epoch(self, model, train, refs, settings: StepSettings, epoch: int, epochs: int, monitor: FitMonitor):
        partial, stats = run_epoch(
            model, train, refs, lambda p, s, r: TrainEpochTask(p, s, epoch, settings, r), epoch, epochs, monitor
        )
        set_state(model, partial.model.result())
        set_metric_state(model, partial.metrics)
        return metrics_result(model), stats


class ParameterServerEngine:
    """A driver-hosted parameter server for the duration of one fit."""

    def __init__(self, config: EngineConfig, model: Any, host: str, workers: int):
        self.config = config
        self.workers = workers
        self.secret = new_secret()
        self.tables = find_tables(model) if config.sparse_embeddings is not False else ()
        if config.sparse_embeddings and not self.tables:
            log.warning("sparse_embeddings=True, but no embedding table reads its ids from a model input: all weights travel whole")
        weights = [w.numpy() for w in model.weights]
        self.state = ServerState(
            weights,
            config.mode,
            staleness_bound=config.staleness_bound,
            round_timeout=config.round_timeout,
            join_timeout=config.join_timeout,
            sparse=[t.index for t in self.tables],
        )
        self.dense_bytes_per_push = dense_exchange_bytes(weights)
        self.server = ParameterServer(self.state, host, self.secret, port=config.ps_port, idle_timeout=config.idle_timeout)
        freq = config.frequency
        self.every = None if freq == "epoch" else 1 if freq == "batch" else int(freq)
        # Applied one by one, K full deltas move the model K times as far as one worker would:
        # by default scale them by 1/K so each update counts as one K-th of an averaged step.
        if config.mode in ("asynchronous", "hogwild"):
            self.scale = config.delta_scale if config.delta_scale is not None else 1.0 / workers
        else:
            self.scale = 1.0

    def __enter__(self) -> "ParameterServerEngine":
        self.server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()

    def server_stats(self) -> dict[str, Any]:
        st = self.state.stats.as_dict()
        per_push = (st["bytes_in"] + st["bytes_out"]) / st["updates"] if st["updates"] else None
        return {
            **st,
            "address": list(self.server.address),
            "delta_scale": self.scale,
            "sparse_tables": [t.name for t in self.tables],
            # everything on the wire (handshakes and pulls included) per push ...
            "bytes_per_push": per_push,
            # ... against one dense push and its reply, framing included
            "dense_bytes_per_push": self.dense_bytes_per_push,
            "dense_to_actual_bytes": self.dense_bytes_per_push / per_push if per_push else None,
        }

    def stopped(self, model: Any) -> None:
        """An epoch was cancelled midway: take the server's weights, the latest there are."""
        model.set_weights(self.state.snapshot())

    def train_epoch(self, model, train, refs, settings: StepSettings, epoch: int, epochs: int, monitor: FitMonitor):
        host, port = self.server.address
        ps = PSSettings(
            host, port, self.secret, self.every, scale=self.scale,
            timeout=self.config.round_timeout + 60, connect_timeout=self.config.connect_timeout, tables=self.tables,
        )
        self.state.begin_epoch(self.workers)
        partial, stats = run_epoch(
            model, train, refs, lambda p, s, r: PSTrainTask(p, s, epoch, settings, ps, r), epoch, epochs, monitor
        )
        model.set_weights(self.state.snapshot())
        if partial.model.sums is not None:
            set_optimizer_state(model, partial.model.result())
        set_metric_state(model, partial.metrics)
        return metrics_result(model), stats


def driver_host(config: EngineConfig, sc: Any) -> str:
    """The address driver-side servers bind and executors connect to."""
    return config.ps_host or (sc.getConf().get("spark.driver.host") if sc is not None else None) or socket.gethostname()


def make_engine(config: EngineConfig, model: Any, sc: Any, workers: int):
    if config.mode == "allreduce":
        from .allreduce import AllreduceEngine

        return AllreduceEngine(config, model, workers)
    if config.mode == "synchronous" and config.frequency == "epoch":
        return AveragingEngine(config)
    return ParameterServerEngine(config, model, driver_host(config, sc), workers)
