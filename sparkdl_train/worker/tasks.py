"""Tasks shipped to executors. Each holds plain data only: references to
broadcast bytes (``.value``), numbers and the column mapping; never a driver
object. Each is called once per partition with a stream of chunks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np

from .. import backend as _backend
from .. import wire
from ..data.batching import Batch, rebatch
from ..data.finite import Screen
from ..data.prefetch import prefetch
from ..merge import Partial, WeightedMean
from ..model_io import get_metric_state, get_state, seed_random_state, set_state, set_weights
from . import gpu, runtime
from .report import Reporter, ReportSettings
from .steps import predict_batches, run_steps

log = logging.getLogger(__name__)


class Ref(Protocol):
    """A Spark broadcast variable, or anything else with ``.value``."""

    @property
    def value(self) -> Any: ...


def encode_state(model: Any, include_optimizer: bool) -> bytes:
    arrays = get_state(model) if include_optimizer else [np.asarray(v.numpy()) for v in model.weights]
    return wire.encode({"n_weights": len(model.weights), "optimizer": include_optimizer}, arrays)


def apply_state(model: Any, blob: bytes) -> None:
    meta, arrays = wire.decode(blob)
    if meta["optimizer"]:
        set_state(model, arrays)
    else:
        set_weights(model, arrays)


@dataclass(frozen=True)
class StepSettings:
    batch_size: int
    shuffle: bool = False
    shuffle_buffer_size: int = 0
    seed: int = 0
    threads: int | None = None
    nan_policy: str = "fail"  # see sparkdl_train.data.finite
    # the signature (row_signature) of the labels the driver found in the data's sample: a cached
    # model whose compiled loss and metrics were built for other labels, or guessed for them by a
    # prepare task (sparkdl_train.worker.prepare), is rebuilt (sparkdl_train.worker.runtime);
    # None: no labels
    labels: str | None = None
    # consecutive batches per call of the compiled step (sparkdl_train.worker.steps.run_steps'
    # group), as the engine allows it (spark.sparkdl_train.worker.stepsPerExecution)
    group: int = 1
    # allreduce's fused step: gradient buckets of about this many bytes reduced while the backward
    # pass runs (spark.sparkdl_train.allreduce.bucketBytes); 0: one vector after it
    bucket_bytes: int = 0
    # allreduce's fused step: (position in model.weights, the most rows one batch looks up) of each
    # embedding table whose gradient is exchanged as the rows a step touched
    # (spark.sparkdl_train.allreduce.sparseGradients)
    sparse_tables: tuple[tuple[int, int], ...] = ()
    # the Keras backend of the driver's model, which the worker must run (sparkdl_train.backend)
    keras_backend: str = field(default_factory=lambda: _backend.keras_backend())

    def for_evaluation(self) -> "StepSettings":
        """The settings an evaluation pass over the same data runs with: no shuffling, the plain test step."""
        return StepSettings(batch_size=self.batch_size, threads=self.threads, nan_policy=self.nan_policy, labels=self.labels,
                            group=self.group)


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)  # bytes on macOS, KiB on Linux


def task_identity() -> dict[str, Any]:
    """Which Spark task this is: its attempt number (> 0: Spark retried the partition), its stage
    and its application-wide task id, by which the driver finds the executor that ran it
    (:mod:`sparkdl_train.driver.executors`), and the executor's id as the task found it
    (:mod:`.identity`: where the driver cannot ask Spark). Empty values outside Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:  # the executor's code driven without Spark (bench/gpu/check.py on a machine without pyspark)
        return {"attempt": 0, "stage": None, "task": None}
    from .identity import executor_id, yarn_container

    ctx = TaskContext.get()
    if ctx is None:
        return {"attempt": 0, "stage": None, "task": None}
    return {"attempt": ctx.attemptNumber(), "stage": ctx.stageId(), "task": ctx.taskAttemptId(), "executor": executor_id(),
            **yarn_container()}


def _info(samples: int, steps: int, start: float) -> dict[str, Any]:
    return {
        **task_identity(),
        "samples": samples,
        "batches": steps,
        "seconds": round(time.perf_counter() - start, 4),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "daemon_pid": os.getppid(),  # the Python worker daemon it was forked from (Spark's, or sparkdl_train's)
        "peak_rss_mb": peak_rss_mb(),
    }


@contextlib.contextmanager
def placed(settings: StepSettings):
    """Prepare the process, then run under the task's GPU (if Spark assigned one); yields the
    placement (``{}`` without GPUs; its ``"device"`` is what the task's model is built on)."""
    runtime.prepare_process(settings.threads, settings.keras_backend)
    place = gpu.placement()
    with gpu.scope(place.get("device")):
        yield place


def on_task_device(call):
    """Decorates a task's ``__call__(partition, chunks, ..., *, device)``: runs it under
    :func:`placed`, passes the device it was given, and records the placement in the
    partition's statistics."""

    @functools.wraps(call)
    def wrapper(self, partition, *args, **kwargs):
        with placed(self.settings) as place:
            out = call(self, partition, *args, device=place.get("device"), **kwargs)
        if place and isinstance(out, Partial):
            for info in out.partitions.values():
                info.update(place)
        return out

    return wrapper


def _model(payload: Ref, state: Ref, settings: StepSettings, device: str | None, startup: dict[str, Any] | None = None) -> Any:
    """The model for ``payload`` with the broadcast ``state``; ``startup`` receives the seconds
    spent importing TensorFlow, rebuilding the model (0 when this worker has it cached) and
    fetching and applying the state."""
    startup = {} if startup is None else startup
    runtime.prepare_process(settings.threads, settings.keras_backend)
    runtime.import_tensorflow()
    startup["tf_import"] = runtime.take_import_seconds()  # here, or in placed() before this task
    t0 = time.perf_counter()
    value = payload.value
    startup["model_cached"] = runtime.is_cached(value, device, settings.labels)
    if not startup["model_cached"]:
        startup["cache_miss"] = runtime.cache_miss(value, device, settings.labels)
    model = runtime.get_model(value, device, settings.labels)
    t1 = time.perf_counter()
    apply_state(model, state.value)
    startup.update(rebuild=t1 - t0, state=time.perf_counter() - t1)
    return model


class PartitionPass:
    """One task's pass over its partition: the skeleton every engine's worker task shares.

    It loads the model (rebuilt once per Python worker, see :mod:`.runtime`) with the driver's
    broadcast state, resets its metrics, seeds shuffling and the model's random generators (dropout,
    noise) by ``(seed, epoch, partition)``, screens
    non-finite rows (:mod:`sparkdl_train.data.finite`), re-batches and prefetches the stream
    (:meth:`batches`), reports live progress (:attr:`reporter`) and assembles the partition's
    statistics (:meth:`info`). An engine's task supplies only its step strategy: local steps
    (:func:`.steps.run_steps`), a push window (:mod:`.ps_task`) or an allreduce step
    (:mod:`.allreduce_task`).
    """

    def __init__(self, payload: Ref, state: Ref, settings: StepSettings, partition: int, *, device: str | None = None,
                 epoch: int | None = None, report: ReportSettings | None = None, training: bool = True):
        self.start = time.perf_counter()
        self.started_at = time.time()  # wall clock, for timelines across processes
        self.settings = settings
        self.partition = partition
        self.training = training
        # this task's fixed costs in seconds (sparkdl_train.driver.phases.TASK_STARTUP); the
        # steps fill in "first_batch" (data ready) and "first_step" (tracing, when not cached)
        self.startup: dict[str, Any] = {}
        self.tally: dict[str, int] = {}  # run_steps' calls of the compiled step (StepSettings.group batches each)
        self.model = _model(payload, state, settings, device, self.startup)
        self.model.reset_metrics()  # metrics accumulate from zero over this partition
        self.rng = None
        if epoch is not None:
            self._seed(epoch)
        self.screen = Screen(settings.nan_policy, partition, self.model)
        self.reporter = Reporter(report, partition)  # no settings: reports nothing

    def next_epoch(self, epoch: int, report: ReportSettings | None = None) -> None:
        """Start this task's next epoch on the same model, as the last one left it (a barrier stage
        that runs several epochs: :mod:`.allreduce_task`): metrics from zero, the epoch's own shuffle
        seed, screen, reporter and statistics, exactly as a task of its own for that epoch would."""
        self.start = time.perf_counter()
        self.started_at = time.time()
        self.startup = {"model_cached": True}
        self.tally = {}
        self.model.reset_metrics()
        self._seed(epoch)
        self.screen = Screen(self.settings.nan_policy, self.partition, self.model)
        self.reporter = Reporter(report, self.partition)

    def _seed(self, epoch: int) -> None:
        """The epoch's shuffle and the model's random draws, from ``(seed, epoch, partition)``: the
        same fit with the same seed draws the same dropout masks on any worker."""
        key = [self.settings.seed, epoch, self.partition]
        self.rng = np.random.default_rng(key)
        if self.training:
            seed_random_state(self.model, key)

    def batches(self, chunks: Iterable[Batch], tap: Callable[[Iterable[Batch]], Iterable[Batch]] | None = None) -> Iterable[Batch]:
        """The partition's batches, read ahead on a thread; ``tap`` sees each batch on that thread
        (e.g. counting the rows it looks up) before the step does."""
        s = self.settings
        shuffle = self.training and s.shuffle
        batches = rebatch(self.screen(chunks), s.batch_size, shuffle=shuffle, buffer_rows=s.shuffle_buffer_size, rng=self.rng)
        return self._first_batch_timed(prefetch(tap(batches) if tap is not None else batches))

    def _first_batch_timed(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        try:
            for i, batch in enumerate(batches):
                if i == 0:
                    self.startup["first_batch"] = time.perf_counter() - self.start
                yield batch
        finally:  # a consumer that stops early stops the prefetch thread now, not at garbage collection
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def on_batch(self) -> Any:
        """A ``run_steps`` callback that reports progress (``None`` when nobody listens)."""
        if self.reporter.settings is None:
            return None
        return lambda steps, samples: self.reporter(steps, samples, self.model)

    def run(self, chunks: Iterable[Batch], tap: Callable[[Iterable[Batch]], Iterable[Batch]] | None = None) -> tuple[int, int]:
        """Keras' own train (or test) step over the whole partition; returns ``(samples, steps)``."""
        samples, steps = run_steps(self.model, self.batches(chunks, tap), training=self.training, on_batch=self.on_batch(),
                                   group=self.settings.group, tally=self.tally,
                                   startup=self.startup)
        self.finish(steps, samples)
        return samples, steps

    def finish(self, steps: int, samples: int) -> None:
        self.reporter.finish(steps, samples, self.model)

    def info(self, samples: int, steps: int, **extra: Any) -> dict[str, Any]:
        startup = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.startup.items()}
        return {**_info(samples, steps, self.start), "started_at": round(self.started_at, 3), **self.screen.info(),
                "step_calls": self.tally.get("calls"), "startup": startup, **extra}


@dataclass(frozen=True)
class TrainEpochTask:
    """One epoch of local training from the broadcast state (model averaging)."""

    payload: Ref
    state: Ref
    epoch: int
    settings: StepSettings
    report: ReportSettings | None = None

    @on_task_device
    def __call__(self, partition: int, chunks: Iterable[Batch], *, device: str | None = None) -> Partial:
        run = PartitionPass(self.payload, self.state, self.settings, partition, device=device, epoch=self.epoch, report=self.report)
        samples, steps = run.run(chunks)
        info = run.info(samples, steps)
        if samples == 0:
            return Partial(partitions={partition: info})
        return Partial(
            samples=samples,
            batches=steps,
            model=WeightedMean.of(get_state(run.model), samples),
            metrics=get_metric_state(run.model),
            partitions={partition: info},
        )


@dataclass(frozen=True)
class EvaluateTask:
    """Metric state of the broadcast weights over one partition."""

    payload: Ref
    state: Ref
    settings: StepSettings

    @on_task_device
    def __call__(self, partition: int, chunks: Iterable[Batch], *, device: str | None = None) -> Partial:
        run = PartitionPass(self.payload, self.state, self.settings, partition, device=device, training=False)
        samples, steps = run.run(chunks)
        metrics = get_metric_state(run.model) if samples else None
        return Partial(samples=samples, batches=steps, metrics=metrics, partitions={partition: run.info(samples, steps)})


@dataclass(frozen=True)
class PredictTask:
    """Predictions of the broadcast weights, chunk by chunk, in input order."""

    payload: Ref
    state: Ref
    settings: StepSettings

    def model(self) -> Any:
        with placed(self.settings) as place:
            return _model(self.payload, self.state, self.settings, place.get("device"))

    def predict(self, model: Any, x: Any) -> Any:
        with placed(self.settings):
            return predict_batches(model, x, self.settings.batch_size)
