"""Running Keras' own compiled train/test/predict steps over a stream of batches.

``Model.train_on_batch`` resets the metrics on every call, so it cannot
accumulate an epoch's metrics; these loops call the model's compiled
``train_function`` / ``test_function`` directly, which leaves metric state to
accumulate exactly as ``Model.fit`` / ``Model.evaluate`` would.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import numpy as np

from .. import _compat
from ..data.batching import Batch, num_rows


def run_steps(
    model: Any,
    batches: Iterable[Batch],
    training: bool,
    on_batch: Callable[[int, int], None] | None = None,
    startup: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Run one step per batch; return ``(samples, steps)``. Metrics accumulate. ``startup``
    receives ``first_step``: the first step's seconds (tracing and compiling it, when this
    worker's model has not run one before)."""
    samples = steps = 0
    fn = None
    first = None
    for batch in batches:
        n = num_rows(batch)
        if n == 0:
            continue
        if fn is None:
            first = time.perf_counter()
            _compat.symbolic_build(model, batch)
            if training:
                model.make_train_function()
                fn = model.train_function
            else:
                model.make_test_function()
                fn = model.test_function
        fn([batch])
        if first is not None:
            if startup is not None:
                startup["first_step"] = time.perf_counter() - first
            first = None
        samples += n
        steps += 1
        if on_batch is not None:
            on_batch(steps, samples)
    return samples, steps


def predict_batches(model: Any, x: Any, batch_size: int) -> Any:
    """Predict ``x`` (one chunk) in slices of ``batch_size``; returns arrays like the model's outputs."""
    from ..data.batching import take_rows, tree_concat

    n = num_rows((x,))
    outs = []
    for start in range(0, n, batch_size):
        part = take_rows(x, slice(start, start + batch_size))
        outs.append(model.predict_on_batch(part))
    if not outs:
        return None
    return tree_concat([_as_struct(o) for o in outs])


def _as_struct(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: np.asarray(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [np.asarray(v) for v in o]
    return np.asarray(o)
