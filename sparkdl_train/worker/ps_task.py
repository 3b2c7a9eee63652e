"""Executor side of the parameter-server engine: train a partition, pushing deltas."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..data.batching import Batch, rebatch
from ..merge import Partial, WeightedMean
from ..model_io import get_metric_state
from ..ps.client import PSClient
from .steps import run_steps
from .tasks import Ref, StepSettings, _info, _model


@dataclass(frozen=True)
class PSSettings:
    """Where the server is and how often to push (plain data)."""

    host: str
    port: int
    secret: bytes
    every: int | None  # push every N steps; None: once, at the end of the partition
    scale: float = 1.0  # multiplies each delta before it is pushed
    timeout: float = 660.0
    connect_timeout: float = 30.0


@dataclass(frozen=True)
class PSTrainTask:
    payload: Ref
    state: Ref
    epoch: int
    settings: StepSettings
    ps: PSSettings

    def __call__(self, partition: int, chunks: Iterable[Batch]) -> Partial:
        start = time.perf_counter()
        s = self.settings
        model = _model(self.payload, self.state, s)  # optimizer slots from the driver's broadcast
        model.reset_metrics()
        rng = np.random.default_rng([s.seed, self.epoch, partition])
        batches = rebatch(chunks, s.batch_size, shuffle=s.shuffle, buffer_rows=s.shuffle_buffer_size, rng=rng)
        ps = self.ps
        with PSClient(ps.host, ps.port, ps.secret, partition, ps.timeout, ps.connect_timeout) as client:
            version, base = client.pull()
            model.set_weights(base)
            mark = {"version": version, "base": base, "steps": 0, "samples": 0, "pushes": 0}

            def push(steps: int, samples: int) -> None:
                local = [np.asarray(v.numpy()) for v in model.weights]
                delta = [np.subtract(a, b, dtype=a.dtype) for a, b in zip(local, mark["base"])]
                if ps.scale != 1.0:
                    for d in delta:
                        d *= ps.scale
                version, fresh = client.push(delta, mark["version"], samples - mark["samples"])
                model.set_weights(fresh)
                mark.update(version=version, base=fresh, steps=steps, samples=samples, pushes=mark["pushes"] + 1)

            def on_batch(steps: int, samples: int) -> None:
                if ps.every is not None and steps - mark["steps"] >= ps.every:
                    push(steps, samples)

            samples, steps = run_steps(model, batches, training=True, on_batch=on_batch)
            if steps > mark["steps"]:
                push(steps, samples)
            client.done()
            info = _info(samples, steps, start)
            info.update(pushes=mark["pushes"], bytes_sent=client.bytes_sent, bytes_received=client.bytes_received)
        if samples == 0:
            return Partial(partitions={partition: info})
        optimizer_state = [np.asarray(v.numpy()) for v in model.optimizer.variables]
        return Partial(
            samples=samples,
            batches=steps,
            model=WeightedMean.of(optimizer_state, samples),
            metrics=get_metric_state(model),
            partitions={partition: info},
        )
