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

Training and test steps run in groups (:func:`run_steps`' ``group``, the
``worker.stepsPerExecution`` setting): one call of the compiled function loops
over several stacked batches, as Keras' ``steps_per_execution`` does, which
saves TensorFlow's per-call overhead (0.5 ms of a small CTR model's 1.9 ms step
on one thread) and gives every model one training function, which a prepare
task instantiates before the first epoch (:func:`instantiate`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import numpy as np

from .. import _compat, backend
from ..data.batching import Batch, num_rows, row_signature, stack_batches, tree_leaves, zero_rows

STEP_KINDS = ("train", "test", "predict")
# a group of batches (run_steps' group) is stacked into one array per input: at most this many bytes
# (a group only saves the per-call overhead, which large batches do not notice)
GROUP_BYTES = 8 << 20


def compiled_step(model: Any, kind: str, batch: Batch, stats: dict[str, Any] | None = None,
                  grouped: bool = False) -> Callable[[Batch], Any]:
    """The model's ``{kind}_step`` compiled once per model and compilation for ``batch``'s
    structure, dtypes and row shapes with any number of rows, called statefully (variables,
    optimizer and metric state update as ``Model.fit``'s do); ``grouped``: the function takes a
    *group* of such batches, stacked (:func:`stack_batches`: every leaf gains a leading dimension,
    one entry per batch) and runs the step on each in turn inside one call, as Keras'
    ``steps_per_execution`` does. Kept on the model, so a worker that has the model cached
    (:mod:`.runtime`) compiles nothing in later tasks. ``stats["traced"]`` tells whether this
    call traced. The backend's module does it (:mod:`sparkdl_train.backend`)."""
    if kind not in STEP_KINDS:
        raise ValueError(f"step kind must be one of {STEP_KINDS}, got {kind!r}")
    return backend.current().compiled_step(model, kind, batch, stats, grouped)


def traces(model: Any, kind: str, grouped: bool = False) -> int:
    """How many times the model's current ``{kind}_step`` function (its compilation's; its
    ``grouped`` form) has been traced in this process; 0 before :func:`compiled_step` made it."""
    return backend.current().traces(model, kind, grouped)


def run_steps(
    model: Any,
    batches: Iterable[Batch],
    training: bool,
    on_batch: Callable[[int, int], None] | None = None,
    startup: dict[str, Any] | None = None,
    group: int = 1,
    tally: dict[str, int] | None = None,
) -> tuple[int, int]:
    """Run one step per batch; return ``(samples, steps)``. Metrics accumulate. ``startup``
    receives ``first_step``: the first step's seconds (tracing and compiling it, when this
    worker's model has not run one before), and ``traced``: whether it traced.

    Steps run through :func:`compiled_step`'s ``grouped`` form, up to ``group`` consecutive
    batches of one signature and size per call (the first batch alone): the same steps in the
    same order as one call each, and one function per model that a prepare task can trace and
    instantiate beforehand (:func:`instantiate`). ``on_batch`` is called once per call, with the
    counts after its last step; ``tally["calls"]`` receives the number of calls."""
    kind = "train" if training else "test"
    samples = steps = calls = 0
    fns: dict[str, Callable[[Batch], Any]] = {}
    pending: list[Batch] = []
    key: tuple[str, int] | None = None  # the pending batches' signature and row count
    size = group  # batches per call, once the first batch is known (group_size)

    def flush() -> None:
        nonlocal samples, steps, calls
        signature = key[0]
        fn = fns.get(signature)
        first = None
        if fn is None:  # 5 µs a batch for row_signature: what a concrete function takes
            if not fns:
                first = time.perf_counter()
                _compat.symbolic_build(model, pending[0])
            fn = fns[signature] = compiled_step(model, kind, pending[0], startup if first is not None else None, grouped=True)
        fn(stack_batches(pending))
        if first is not None and startup is not None:
            startup["first_step"] = time.perf_counter() - first
        samples += key[1] * len(pending)
        steps += len(pending)
        calls += 1
        pending.clear()
        if on_batch is not None:
            on_batch(steps, samples)

    per_shape = backend.capabilities().compiles_per_shape

    def flush_rest() -> None:
        """The batches left before a change of shape or the end: on a backend that compiles per
        shape (JAX), a group of a size no call had so far runs one batch per call, on the
        executable every pass compiles (:func:`instantiate`'s), instead of compiling another."""
        if per_shape and len(pending) not in (1, size - 1, size):
            rest = pending[:]
            for b in rest:
                pending[:] = [b]
                flush()
        else:
            flush()

    for batch in batches:
        n = num_rows(batch)
        if n == 0:
            continue
        found = (row_signature(batch), n)
        if pending and found != key:  # a short last batch, or a chunk of other dtypes (mixed RDD rows): a call of its own
            flush_rest()
        if found != key:
            size = group_size(group, batch)
        key = found
        pending.append(batch)
        # the first batch runs alone (startup["first_step"] is its trace and one step); then calls
        # end where ``steps`` is a multiple of ``size``, as a push interval that ``group`` divides does
        if steps + len(pending) == 1 or (steps + len(pending)) % size == 0:
            flush()
    if pending:
        flush_rest()
    if tally is not None:
        tally["calls"] = calls
    return samples, steps


def group_size(group: int, batch: Batch) -> int:
    """Batches like ``batch`` per call: the largest divisor of ``group`` whose batches take at
    most :data:`GROUP_BYTES` (a divisor, so calls still end on multiples of ``group``)."""
    size = sum(np.asarray(a).nbytes for a in tree_leaves(batch))
    return largest_divisor(group, max(1, GROUP_BYTES // max(1, size)))


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (at least 1): a group of steps that a
    push interval, or a larger group, divides into whole calls."""
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def instantiate(model: Any, kind: str, batch: Batch, batch_size: int | None = None, group: int = 1) -> bool:
    """Compile ``kind``'s grouped step for ``batch``'s signature ahead of the first epoch, as far
    as the backend can without running a step (TensorFlow: traced and instantiated on a group of
    no batches; JAX: lowered and compiled for the shapes of :func:`run_steps`' calls: a first batch
    alone, then ``size - 1`` and ``size`` batches of ``batch_size`` rows, ``size`` being
    :func:`group_size` of ``group``); changes no state. ``batch`` may have no rows (its signature):
    given ``batch_size``, it stands for full batches. Returns whether it traced."""
    if batch_size and num_rows(batch) == 0:
        batch = zero_rows(batch, batch_size)
    size = group_size(group, batch) if num_rows(batch) else 1
    return backend.current().instantiate(model, kind, batch, tuple(sorted({1, size - 1, size} - {0})))


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
