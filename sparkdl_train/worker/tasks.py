"""Tasks shipped to executors. Each holds plain data only: references to
broadcast bytes (``.value``), numbers and the column mapping; never a driver
object. Each is called once per partition with a stream of chunks.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import numpy as np

from .. import wire
from ..data.batching import Batch, rebatch
from ..merge import Partial, WeightedMean
from ..model_io import ModelPayload, get_metric_state, get_state, set_state
from . import runtime
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
        model.set_weights(arrays)


@dataclass(frozen=True)
class StepSettings:
    batch_size: int
    shuffle: bool = False
    shuffle_buffer_size: int = 0
    seed: int = 0
    threads: int | None = None


def _info(samples: int, steps: int, start: float) -> dict[str, Any]:
    return {
        "samples": samples,
        "batches": steps,
        "seconds": round(time.perf_counter() - start, 4),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _model(payload: Ref, state: Ref, settings: StepSettings) -> Any:
    runtime.prepare_process(settings.threads)
    model = runtime.get_model(payload.value)
    apply_state(model, state.value)
    return model


@dataclass(frozen=True)
class TrainEpochTask:
    """One epoch of local training from the broadcast state (model averaging)."""

    payload: Ref
    state: Ref
    epoch: int
    settings: StepSettings

    def __call__(self, partition: int, chunks: Iterable[Batch]) -> Partial:
        start = time.perf_counter()
        model = _model(self.payload, self.state, self.settings)
        model.reset_metrics()
        s = self.settings
        rng = np.random.default_rng([s.seed, self.epoch, partition])
        batches = rebatch(chunks, s.batch_size, shuffle=s.shuffle, buffer_rows=s.shuffle_buffer_size, rng=rng)
        samples, steps = run_steps(model, batches, training=True)
        info = _info(samples, steps, start)
        if samples == 0:
            return Partial(partitions={partition: info})
        return Partial(
            samples=samples,
            batches=steps,
            model=WeightedMean.of(get_state(model), samples),
            metrics=get_metric_state(model),
            partitions={partition: info},
        )


@dataclass(frozen=True)
class EvaluateTask:
    """Metric state of the broadcast weights over one partition."""

    payload: Ref
    state: Ref
    settings: StepSettings

    def __call__(self, partition: int, chunks: Iterable[Batch]) -> Partial:
        start = time.perf_counter()
        model = _model(self.payload, self.state, self.settings)
        model.reset_metrics()
        batches = rebatch(chunks, self.settings.batch_size)
        samples, steps = run_steps(model, batches, training=False)
        info = _info(samples, steps, start)
        metrics = get_metric_state(model) if samples else None
        return Partial(samples=samples, batches=steps, metrics=metrics, partitions={partition: info})


@dataclass(frozen=True)
class PredictTask:
    """Predictions of the broadcast weights, chunk by chunk, in input order."""

    payload: Ref
    state: Ref
    settings: StepSettings

    def model(self) -> Any:
        return _model(self.payload, self.state, self.settings)

    def predict(self, model: Any, x: Any) -> Any:
        return predict_batches(model, x, self.settings.batch_size)
