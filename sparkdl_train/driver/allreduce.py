"""Driver side of the allreduce engine (``mode='allreduce'``).

Each epoch is one Spark barrier stage with one task per rank; the driver only
broadcasts the starting state, launches the stage and adopts rank 0's final
state (all ranks hold the same weights; their digests are checked). Nothing
runs on the driver during the epoch: gradients never pass through it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import _compat
from ..config import EngineConfig
from ..errors import ConfigError, SparkDLError, WorkerError
from ..model_io import metrics_result, set_metric_state, set_state
from ..ps.protocol import new_secret
from ..worker.allreduce_task import AllreduceTrainTask, RingSettings
from ..worker.tasks import StepSettings
from .engine import run_epoch

log = logging.getLogger(__name__)


def barrier_slots(sc: Any) -> int:
    """Tasks the cluster can run at once for the default resource profile."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - internal API missing: fall back to the public estimate
        return int(sc.defaultParallelism)


def check_barrier_launch(sc: Any, ranks: int, wait: float) -> int:
    """Fail before launch (not after Spark's minutes of retries) when a barrier stage of
    ``ranks`` tasks cannot be scheduled. Returns the slot count."""
    conf = sc.getConf()
    if (conf.get("spark.dynamicAllocation.enabled") or "false").strip().lower() == "true":
        raise ConfigError(
            "mode='allreduce' runs as a Spark barrier stage, which Spark does not support with "
            "spark.dynamicAllocation.enabled=true; disable dynamic allocation or use a parameter-server mode"
        )
    return check_concurrent_slots(
        sc, ranks, wait,
        f"mode='allreduce' needs {ranks} task slots at once (one per rank, all in one barrier stage)",
    )


def check_concurrent_slots(sc: Any, ranks: int, wait: float, need: str) -> int:
    """Raise ConfigError (``need`` says why) unless ``ranks`` tasks can run at once; on a cluster,
    wait up to ``wait`` seconds for executors to register first. Returns the slot count."""
    slots = barrier_slots(sc)
    local = sc.master.startswith("local") and not sc.master.startswith("local-cluster")
    if slots < ranks and not local:
        deadline = time.monotonic() + wait  # executors may still be registering
        while slots < ranks and time.monotonic() < deadline:
            time.sleep(0.5)
            slots = barrier_slots(sc)
    if slots < ranks:
        raise ConfigError(
            f"{need}, "
            f"but the cluster offers {slots} (executors x cores / spark.task.cpus); lower num_workers "
            "(spark.sparkdl_train.numWorkers) or add executors"
        )
    return slots


def check_learning_rate(model: Any, config: EngineConfig) -> None:
    if config.lr_scaling == "none":
        return
    lr = _compat.raw_learning_rate(model.optimizer)
    if lr is not None and callable(lr) and not hasattr(lr, "assign"):
        raise ConfigError(
            f"lr_scaling={config.lr_scaling!r} needs a constant learning rate; the optimizer uses a "
            "schedule: scale the schedule itself and leave lr_scaling='none'"
        )


# signatures of a lost rank process: worth a new stage. A stalled rank (timeout), bad data or a
# model error would only fail again, slower.
_LOST_RANK = (
    "Python worker exited unexpectedly",
    "ExecutorLostFailure",
    "Executor lost",
    "Connection reset by peer",
    "Broken pipe",
)
_NOT_RETRYABLE = ("sparkdl_train.errors.DataError", "sparkdl_train.errors.ModelError", "sparkdl_train.errors.ConfigError")


def retryable(exc: WorkerError) -> bool:
    """A lost rank (killed worker, lost executor) is worth a new stage; bad data is not."""
    text = str(exc) + "".join(exc.failures.values())
    return any(m in text for m in _LOST_RANK) and not any(m in text for m in _NOT_RETRYABLE)


class AllreduceEngine:
    """Barrier-mode ring allreduce for the duration of one fit."""

    def __init__(self, config: EngineConfig, model: Any, workers: int):
        check_learning_rate(model, config)
        self.config = config
        self.workers = workers
        self.secret = new_secret()  # per fit; proves ring peers belong to it
        self.totals = {"steps": 0, "bytes_sent": 0, "bytes_received": 0, "comm_seconds": 0.0, "epoch_retries": 0}

    def __enter__(self) -> "AllreduceEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def server_stats(self) -> dict[str, Any]:
        c = self.config
        return {"engine": "allreduce", "ranks": self.workers, "compression": c.compression or "none",
                "lr_scaling": c.lr_scaling, **self.totals}

    def stopped(self, model: Any) -> None:
        """An epoch was cancelled midway: the driver keeps the weights it started it with."""

    def train_epoch(self, model, train, refs, settings: StepSettings, epoch: int, epochs: int, monitor: Any):
        c = self.config
        rs = RingSettings(
            self.secret, timeout=c.allreduce_timeout, connect_timeout=c.connect_timeout,
            compression=None if c.compression in (None, "none") else c.compression, lr_scaling=c.lr_scaling,
        )
        # Spark never re-runs a failed barrier ResultStage, so the engine does: the driver's model
        # still holds the epoch's starting state (the last checkpoint), and a new stage starts
        # from it with a fresh rendezvous. Errors in the data or the model are not retried.
        for attempt in range(c.epoch_retries + 1):
            try:
                partial, stats = run_epoch(
                    model, train, refs, lambda p, s, r: AllreduceTrainTask(p, s, epoch, settings, rs, r), epoch, epochs,
                    monitor, launch=lambda task, desc: train.barrier_map(task, desc, c.allreduce_timeout),
                )
                break
            except WorkerError as exc:
                if attempt >= c.epoch_retries or not retryable(exc):
                    raise
                self.totals["epoch_retries"] += 1
                log.warning("epoch %d: the barrier stage failed (%s); re-running it from the epoch's start (retry %d of %d)",
                            epoch + 1, exc.message, attempt + 1, c.epoch_retries)
        infos = list(partial.partitions.values())
        digests = {i.get("weights_sha256") for i in infos}
        if len(digests) != 1:
            raise SparkDLError(f"epoch {epoch + 1}: allreduce ranks ended with different weights ({len(digests)} digests)")
        if partial.model.sums is None:
            raise SparkDLError(f"epoch {epoch + 1}: rank 0 reported no state")
        set_state(model, partial.model.result())
        set_metric_state(model, partial.metrics)
        self.totals["steps"] += max(i.get("global_steps", 0) for i in infos)
        for key in ("bytes_sent", "bytes_received", "comm_seconds"):
            self.totals[key] += sum(i.get(key, 0) for i in infos)
        return metrics_result(model), stats
