"""Running Keras' own compiled train/test/predict steps over a stream of batches.

``Model.train_on_batch`` resets the metrics on every call, so it cannot
accumulate an epoch's metrics; these loops call the model's own ``train_step`` /
``test_step`` / ``predict_step``, which leaves metric state to accumulate exactly
as ``Model.fit`` / ``Model.evaluate`` would.

The steps are compiled by :func:`compiled_step`, not by ``make_train_function``:
Keras traces its function for the first batch's exact shape and traces it again
at the first batch of another size (a partition's short last batch), about as
long as the first trace (0.6-0.9 s per worker per kind of step on a CTR model);
``Model.fit`` avoids that by feeding a ``tf.data`` iterator whose batch
dimension is open, which a stream of numpy batches is not.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import numpy as np

from .. import _compat
from ..data.batching import Batch, num_rows, row_signature, tree_map

STEP_KINDS = ("train", "test", "predict")
_ATTRIBUTE = "_sparkdl_train_compiled_steps"  # on the model itself: a cached model keeps its traces


def open_rows_spec(batch: Any) -> Any:
    """``batch``'s structure with each array replaced by a ``tf.TensorSpec`` of its dtype and
    row shape, its first (batch) dimension left open."""
    import tensorflow as tf

    def spec(a: Any) -> Any:
        a = np.asarray(a)
        dtype = tf.string if a.dtype.kind in "OSU" else tf.as_dtype(a.dtype)  # str / bytes: a Keras string input
        return tf.TensorSpec((None,) + a.shape[1:], dtype)

    return tree_map(spec, batch)


def compiled_step(model: Any, kind: str, batch: Batch, stats: dict[str, Any] | None = None) -> Callable[[Batch], Any]:
    """The model's ``{kind}_step`` as one ``tf.function`` per model and compilation, traced for
    ``batch``'s structure, dtypes and row shapes with any number of rows: every batch of that
    signature, whatever its size, runs the same trace. Kept on the model, so a worker that has
    the model cached (:mod:`.runtime`) traces nothing in later tasks. Returns the trace's
    concrete function, which a batch of another signature must not be given (a call skips the
    function's matching of its arguments: 0.15 ms of a CTR model's 1.1 ms step). A model that
    runs eagerly gets its plain step.

    A model rebuilt by :func:`sparkdl_train.model_io.load_archive` (every worker's) has its
    optimizer and compiled metrics built; one whose variables are created in the trace (fresh
    ``compile`` on TensorFlow, which defers building to the first step) is traced twice, once
    creating them, as Keras' own function is. ``stats["traced"]`` tells whether this call traced."""
    import tensorflow as tf

    if kind not in STEP_KINDS:
        raise ValueError(f"step kind must be one of {STEP_KINDS}, got {kind!r}")
    step = getattr(model, f"{kind}_step")
    if model.run_eagerly:
        return step
    cache = model.__dict__.setdefault(_ATTRIBUTE, {})  # past Keras' attribute tracking
    key = (kind, id(getattr(model, "optimizer", None)))  # compile() makes a new optimizer: trace anew
    fn = cache.get(key)
    if fn is None:
        strategy = model.distribute_strategy

        def one_step(data: Batch) -> Any:
            return strategy.run(step, args=(data,))

        fn = tf.function(one_step, reduce_retracing=True, jit_compile=bool(model.jit_compile))
        cache[key] = fn
    before = fn.experimental_get_tracing_count()
    concrete = fn.get_concrete_function(open_rows_spec(batch))  # traces once per signature; a lookup after
    if stats is not None:
        stats["traced"] = fn.experimental_get_tracing_count() > before
    return concrete


def traces(model: Any, kind: str) -> int:
    """How many times the model's current ``{kind}_step`` function (its compilation's) has been
    traced in this process; 0 before :func:`compiled_step` made it."""
    fn = model.__dict__.get(_ATTRIBUTE, {}).get((kind, id(getattr(model, "optimizer", None))))
    return fn.experimental_get_tracing_count() if fn is not None else 0


def run_steps(
    model: Any,
    batches: Iterable[Batch],
    training: bool,
    on_batch: Callable[[int, int], None] | None = None,
    startup: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Run one step per batch; return ``(samples, steps)``. Metrics accumulate. ``startup``
    receives ``first_step``: the first step's seconds (tracing and compiling it, when this
    worker's model has not run one before), and ``traced``: whether it traced."""
    samples = steps = 0
    fn = None
    signature = None
    first = None
    for batch in batches:
        n = num_rows(batch)
        if n == 0:
            continue
        found = row_signature(batch)  # 5 µs: what a concrete step takes
        if fn is None:
            first = time.perf_counter()
            _compat.symbolic_build(model, batch)
            fn = compiled_step(model, "train" if training else "test", batch, startup)
        elif found != signature:  # a chunk of other dtypes (mixed RDD rows): its own trace
            fn = compiled_step(model, "train" if training else "test", batch)
        signature = found
        fn(batch)
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
    fn = None
    for start in range(0, n, batch_size):
        part = (take_rows(x, slice(start, start + batch_size)),)
        if fn is None:  # one chunk: one signature
            fn = compiled_step(model, "predict", part)
        outs.append(fn(part))
    if not outs:
        return None
    return tree_concat([_as_struct(o) for o in outs])


def _as_struct(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: np.asarray(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [np.asarray(v) for v in o]
    return np.asarray(o)
