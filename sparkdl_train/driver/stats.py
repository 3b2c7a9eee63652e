"""Statistics of a fit: per epoch, per partition, and the engine's (``sm.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .phases import task_startup


@dataclass
class EpochStats:
    epoch: int
    samples: int
    batches: int
    seconds: float
    partitions: dict[int, dict[str, Any]]
    empty_partitions: list[int]
    interrupted: bool = False  # stopped mid-epoch (model.stop_training set by a callback)
    # driver wall seconds: broadcast, job (the Spark job), merge, validation, callbacks, checkpoint
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def task_startup(self) -> dict[str, float]:
        """The slowest task's startup costs (:data:`sparkdl_train.driver.phases.TASK_STARTUP`)."""
        return task_startup(self.partitions)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def executors(self) -> list[str]:
        """The executors this epoch's training tasks ran on: under dynamic allocation, the workers the epoch had."""
        return sorted({str(i.get("executor_id")) for i in self.partitions.values() if i.get("executor_id") is not None})


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
    tls: bool = False  # the fit's sockets (parameter server, ring, reports) used TLS
    # driver wall seconds before the first epoch and after the last: payload, adapter, preflight,
    # validation_split, executors (the wait for registration), plan, prepare_start, sample, sample_check, prepare, restore, start (servers), stop
    phases: dict[str, float] = field(default_factory=dict)
    # the prepare job (sparkdl_train.driver.prepare): tasks, rebuilt, traced, errors, slowest
    # task's seconds; None when it did not run
    prepare: dict[str, Any] | None = None
    # how the training tasks read their rows: "parquet" (a DataFrame's files, directly: sparkdl_train.data.parquet),
    # "spark" (Spark's reader), "rdd", "arrays"
    data_source: str | None = None
    # how the driver read its sample of the training data (DataAdapter.sampled_by): "jvm", "python",
    # "query", "files", "kept", "arrays"
    sample_source: str | None = None
    # consecutive batches a worker ran per call of its compiled step (StepSettings.group: the
    # worker.stepsPerExecution setting as the engine allows it); partitions' "step_calls" count the calls
    steps_per_call: int = 1
    # the wait for the application's executors before planning (sparkdl_train.driver.registration):
    # executors and cores registered, seconds waited, whether all asked for were there; None on local masters
    registration: dict[str, Any] | None = None
    # what the fit told the user once (sparkdl_train.driver.efficiency: few steps per worker on small data)
    advice: list[str] = field(default_factory=list)

    def fixed_costs(self) -> dict[str, Any]:
        """Where the fixed cost of this fit went: the driver's set-up phases, the first epoch's
        driver phases, its slowest task's startup (TensorFlow import, model rebuild, state,
        first batch, first step, first pull / rendezvous) and :meth:`executor_start`."""
        first = self.epochs[0] if self.epochs else None
        return {
            "driver": dict(self.phases),
            "first_epoch": dict(first.phases) if first else {},
            "tasks": first.task_startup if first else {},
            "executor_start": self.executor_start(),
        }

    def executor_start(self) -> dict[str, Any]:
        """What the executors' environment check found of the executor plugin (sparkdl_train.jvm): how many of
        its Python workers run under a daemon whose imports started with their executor, of how many, and
        the longest those imports took (seconds, spent before or while the fit began)."""
        reports = self.environment or []
        served = [r["zygote"] for r in reports if r.get("zygote")]
        return {"workers": len(reports), "started_with_executor": len(served),
                "imports_s": max((z.get("imports_s", 0.0) for z in served), default=None)}

    def executor_ids(self) -> list[str]:
        """The executors that ran this fit's training tasks (``"driver"`` in local mode)."""
        return sorted({str(i.get("executor_id")) for e in self.epochs for i in e.partitions.values()})

    def containers(self) -> list[str]:
        """The YARN containers that ran this fit's training tasks (empty off YARN)."""
        return sorted({i["container"] for e in self.epochs for i in e.partitions.values() if i.get("container")})

    def nodemanagers(self) -> list[str]:
        """The YARN NodeManagers (``host:port``) whose containers ran this fit's training tasks."""
        return sorted({i["nodemanager"] for e in self.epochs for i in e.partitions.values() if i.get("nodemanager")})

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
            "containers": self.containers(),
            "nodemanagers": self.nodemanagers(),
            "environment": self.environment,
            "tls": self.tls,
            "phases": self.phases,
            "prepare": self.prepare,
            "data_source": self.data_source,
            "sample_source": self.sample_source,
            "steps_per_call": self.steps_per_call,
            "registration": self.registration,
            "epochs": [
                {
                    "epoch": e.epoch,
                    "samples": e.samples,
                    "batches": e.batches,
                    "seconds": e.seconds,
                    "samples_per_second": e.samples_per_second,
                    "executors": e.executors,
                    "empty_partitions": e.empty_partitions,
                    "interrupted": e.interrupted,
                    "phases": e.phases,
                    "task_startup": e.task_startup,
                    "partitions": e.partitions,
                }
                for e in self.epochs
            ],
        }
