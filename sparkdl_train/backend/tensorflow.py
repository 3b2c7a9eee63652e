"""The TensorFlow backend (the default): ``tf.function`` steps, a ``GradientTape`` fused step,
compiled variable reads and assigns, ``tf.device`` placement. See :mod:`sparkdl_train.backend`."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from .. import _compat
from ..trees import Batch, tree_leaves, tree_map
from . import capabilities
from .flat import FlatLayout, FusedLayout, first_input

NAME = "tensorflow"
CAPABILITIES = capabilities(NAME)  # one traced graph, its batch and group dimensions open
_ATTRIBUTE = "_sparkdl_train_compiled_steps"  # on the model itself: a cached model keeps its traces
_memory_growth_set = False


def import_framework() -> float:
    if "tensorflow" in sys.modules:
        return 0.0
    start = time.perf_counter()
    import tensorflow  # noqa: F401

    return time.perf_counter() - start


def configure_threads(threads: int) -> int:
    """Size TensorFlow's pools; returns the intra-op size in force (an initialised runtime keeps its own)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        # two, even for a one-thread worker: with one, TF's executor runs host callbacks (the overlap
        # buckets of allreduce.bucketBytes) only once the whole graph is done; on one core the second
        # thread cost nothing measurable (4 x Dense(1024), batch 256: 62.6 ms a step against 64.2 ms)
        tf.config.threading.set_inter_op_parallelism_threads(2)
        return threads
    except RuntimeError:  # TF already initialised in this process: keep its pools
        return tf.config.threading.get_intra_op_parallelism_threads() or threads


# -- compiled steps -------------------------------------------------------------------------------

def open_rows_spec(batch: Any) -> Any:
    """``batch``'s structure with each array replaced by a ``tf.TensorSpec`` of its dtype and
    row shape, its first (batch) dimension left open."""
    import tensorflow as tf

    def spec(a: Any) -> Any:
        a = np.asarray(a)
        dtype = tf.string if a.dtype.kind in "OSU" else tf.as_dtype(a.dtype)  # str / bytes: a Keras string input
        return tf.TensorSpec((None,) + a.shape[1:], dtype)

    return tree_map(spec, batch)


def compiled_step(model: Any, kind: str, batch: Batch, stats: dict[str, Any] | None = None,
                  grouped: bool = False) -> Callable[[Batch], Any]:
    """The model's ``{kind}_step`` as one ``tf.function`` per model and compilation, traced for
    ``batch``'s structure, dtypes and row shapes with any number of rows: every batch of that
    signature, whatever its size, runs the same trace. Kept on the model, so a worker that has
    the model cached (:mod:`.runtime`) traces nothing in later tasks. Returns the trace's
    concrete function, which a batch of another signature must not be given (a call skips the
    function's matching of its arguments: 0.15 ms of a CTR model's 1.1 ms step). A model that
    runs eagerly gets its plain step.

    ``grouped``: the function takes a *group* of such batches, stacked (:func:`stack_batches`:
    every leaf gains a leading dimension, one entry per batch, of any length) and runs the step
    on each in turn inside one call, as Keras' ``steps_per_execution`` does; the same steps, in the
    same order, without the per-call overhead (0.5 ms of a CTR model's 1.9 ms step on one thread).

    A model rebuilt by :func:`sparkdl_train.model_io.load_archive` (every worker's) has its
    optimizer and compiled metrics built; one whose variables are created in the trace (fresh
    ``compile`` on TensorFlow, which defers building to the first step) is traced twice, once
    creating them, as Keras' own function is. ``stats["traced"]`` tells whether this call traced."""
    import tensorflow as tf

    step = getattr(model, f"{kind}_step")
    if model.run_eagerly:
        return _eager_group(step) if grouped else step
    cache = model.__dict__.setdefault(_ATTRIBUTE, {})  # past Keras' attribute tracking
    key = _step_key(model, kind, grouped)
    fn = cache.get(key)
    if fn is None:
        strategy = model.distribute_strategy

        def one_step(data: Batch) -> Any:
            return strategy.run(step, args=(data,))

        def group_of_steps(data: Batch) -> Any:
            n = tf.shape(tree_leaves(data)[0])[0]

            def body(i: Any) -> Any:
                out = one_step(tree_map(lambda a: a[i], data))
                # the next step starts after this one's updates (its outputs read the updated state)
                with tf.control_dependencies([t for t in tf.nest.flatten(out) if isinstance(t, tf.Tensor)]):
                    return (i + 1,)

            return tf.while_loop(lambda i: i < n, body, (tf.constant(0),), parallel_iterations=1)

        fn = tf.function(group_of_steps if grouped else one_step, reduce_retracing=True, jit_compile=bool(model.jit_compile))
        cache[key] = fn
    before = fn.experimental_get_tracing_count()
    spec = open_rows_spec(batch)
    if grouped:
        spec = tree_map(lambda s: tf.TensorSpec((None,) + tuple(s.shape), s.dtype), spec)
    concrete = fn.get_concrete_function(spec)  # traces once per signature; a lookup after
    if stats is not None:
        stats["traced"] = fn.experimental_get_tracing_count() > before
    return concrete


def _step_key(model: Any, kind: str, grouped: bool) -> tuple:
    """A compiled step's key in the model's cache: compile() makes a new optimizer, traced anew."""
    return (kind, id(getattr(model, "optimizer", None))) + (("grouped",) if grouped else ())


def _eager_group(step: Callable[[Batch], Any]) -> Callable[[Batch], Any]:
    def run(data: Batch) -> None:
        for i in range(len(tree_leaves(data)[0])):
            step(tree_map(lambda a: a[i], data))

    return run


def traces(model: Any, kind: str, grouped: bool = False) -> int:
    """How many times the model's current ``{kind}_step`` function (its compilation's; its
    ``grouped`` form) has been traced in this process; 0 before :func:`compiled_step` made it."""
    fn = model.__dict__.get(_ATTRIBUTE, {}).get(_step_key(model, kind, grouped))
    return fn.experimental_get_tracing_count() if fn is not None else 0


def instantiate(model: Any, kind: str, batch: Batch, sizes: tuple[int, ...] = (1,)) -> bool:
    """Trace ``kind``'s grouped step for ``batch``'s signature and call it on a group of no
    batches: TensorFlow optimizes and instantiates a function's graph at its first call (0.2 s of
    a CTR model's train step, beside 0.3 s of tracing), and a loop of no steps changes no state.
    Returns whether it traced. A model compiled with ``jit_compile`` is only traced (XLA compiles
    each input shape at its first call). One graph serves every group size (``sizes``: unused)."""
    stats: dict[str, Any] = {}
    fn = compiled_step(model, kind, batch, stats, grouped=True)
    if not model.run_eagerly and not model.jit_compile:
        fn(tree_map(lambda a: np.asarray(a)[np.newaxis][:0, :0], batch))
    return bool(stats.get("traced"))


def check_test_step(model: Any, batch: Batch) -> None:
    """One ``test_step`` of ``batch``, run eagerly (nothing traced: eager TensorFlow is the cheaper of the two here)."""
    model.test_step(batch)


# -- the fused (allreduce) step -------------------------------------------------------------------


class FusedStep(FusedLayout):
    def __init__(self, model: Any, batch_size: int, bucket_bytes: int = 0, sparse: tuple[tuple[int, int], ...] = ()):
        import tensorflow as tf

        super().__init__(model, batch_size, sparse)
        # overlap: (first weight, end weight, lo, hi) per bucket, handed over as the backward pass produces it
        self.bucket_bounds = self.buckets(bucket_bytes) if bucket_bytes else []
        self._out: np.ndarray | None = None
        self._ready: Any = None
        self._gradients = tf.function(self._gradients_impl, reduce_retracing=True)
        signature = [tf.TensorSpec([None], tf.float32)]
        for t in self.tables:
            signature += [tf.TensorSpec([None], tf.as_dtype(t.id_dtype)), tf.TensorSpec([None, t.dim], tf.float32)]
        self._apply = tf.function(self._apply_impl, input_signature=signature)

    def _gradients_impl(self, x: Any, y: Any, sample_weight: Any) -> Any:
        import tensorflow as tf

        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if _compat.call_takes_training(model) else model(x)
            loss = _compat.compute_loss(model)(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            rows = tf.shape(first_input(x))[0]
            tracker = _compat.loss_tracker(model)
            if tracker is not None:
                tracker.update_state(loss, sample_weight=rows)
            scaled = model.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, self.trainables)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        w = tf.cast(rows, tf.float32) / self.batch_size
        tables = [self._rows_of(grads[i], self.trainables[i], t, w) for i, t in zip(self.table_at, self.tables)]
        flat = []
        for i, shape in zip(self.dense_at, self.shapes):
            g = grads[i]
            g = tf.zeros(shape, tf.float32) if g is None else tf.convert_to_tensor(g)
            flat.append(tf.reshape(tf.cast(g, tf.float32), [-1]))
        if not self.bucket_bounds:
            vector = tf.concat(flat, 0) if flat else tf.zeros([0], tf.float32)
            return tf.concat([vector * w, tf.reshape(w, [1])], 0), tables
        # Overlap: each bucket leaves through a host callback as soon as its gradients exist; TF's
        # executor runs it while the backward pass goes on (the callbacks are stateful, so
        # tf.function keeps them in this order, the order the backward pass produces them in).
        handed = []
        for k, (first, end, _, _) in enumerate(self.bucket_bounds):
            part = tf.concat(flat[first:end], 0) * w
            if k == 0:
                part = tf.concat([part, tf.reshape(w, [1])], 0)
            handed.append(tf.numpy_function(functools.partial(self._hand_over, k), [part], tf.int32, stateful=True))
        return tf.stack(handed), tables

    @staticmethod
    def _rows_of(g: Any, var: Any, table: Any, w: Any) -> tuple[Any, Any]:
        """A table's gradient as (the ids looked up, each once; their summed rows times ``w``): the
        rows in the order of the ids' first lookup, each the sum of its lookups' gradients in lookup
        order (what densifying the gradient adds, in the same order)."""
        import tensorflow as tf

        if g is None:
            return tf.zeros([0], table.id_dtype), tf.zeros([0, table.dim], tf.float32)
        if not isinstance(g, tf.IndexedSlices):
            raise ValueError(
                f"allreduce.sparseGradients: the gradient of embedding table {var.path!r} is dense, not the rows its "
                "lookups touched (a regularizer or another use of the table adds to every row); set "
                "sparse_gradients=False")
        ids, where = tf.unique(tf.cast(g.indices, table.id_dtype), out_idx=tf.int32)
        values = tf.reshape(tf.cast(g.values, tf.float32), [-1, table.dim])
        return ids, tf.math.unsorted_segment_sum(values, where, tf.size(ids)) * w

    def _hand_over(self, k: int, part: np.ndarray) -> np.ndarray:
        _, _, lo, hi = self.bucket_bounds[k]
        np.copyto(self._out[lo:hi], part)  # type: ignore[index]
        self._ready(k)
        return np.int32(k)

    def _apply_impl(self, summed: Any, *tables: Any) -> None:
        import tensorflow as tf

        total = summed[-1]
        mean = summed[:-1] / total
        parts = tf.split(mean, self.sizes) if self.sizes else []
        grads: list[Any] = [None] * len(self.trainables)
        for i, p, s in zip(self.dense_at, parts, self.shapes):
            grads[i] = tf.cast(tf.reshape(p, s), self.trainables[i].dtype)
        # every rank's rows added into the table in rank order (one sequential scatter-add on the CPU: the
        # same bits on every rank), then divided like the vector: the dense exchange's gradient
        for k, (i, t) in enumerate(zip(self.table_at, self.tables)):
            ids, rows = tables[2 * k], tables[2 * k + 1]
            grads[i] = tf.cast(tf.math.unsorted_segment_sum(rows, ids, t.rows) / total, self.trainables[i].dtype)
        self.model.optimizer.apply_gradients(zip(grads, self.trainables))

    def trace(self, batch: tuple) -> bool:
        """Trace the gradient step for ``batch``'s signature with any number of rows, so that a
        short batch (a partition's last) reuses the trace instead of tracing again; returns
        whether it traced (``False``: that signature was traced before)."""
        before = self._gradients.experimental_get_tracing_count()
        self._gradients.get_concrete_function(*open_rows_spec(tuple(batch)))
        return self._gradients.experimental_get_tracing_count() > before

    def gradients(self, batch: tuple, out: np.ndarray, ready: Any = None) -> int:
        """Write this rank's weighted, fused gradient into ``out`` (and its sparse tables' rows into
        ``touched``); returns the batch's rows. With buckets, each is written as the backward pass
        produces it and ``ready(k)`` called for it (from TensorFlow's thread: it must not block)."""
        x, y, w = batch
        if not self.bucket_bounds:
            flat, tables = self._gradients(x, y, w)
            np.copyto(out, flat.numpy())
        else:
            if ready is None:
                raise ValueError("a bucketed fused step needs ready(k) to hand its buckets to")
            self._out, self._ready = out, ready
            try:
                done, tables = self._gradients(x, y, w)
                done.numpy()
            finally:
                self._out = self._ready = None
        self.touched = [(ids.numpy(), rows.numpy()) for ids, rows in tables]
        return int(_rows(x))

    def apply(self, summed: np.ndarray, tables: Any = ()) -> None:
        """Apply the summed vector and, per sparse table, every rank's ``(ids, rows)`` (rank order)."""
        self.check_tables(tables)
        self._apply(summed, *(a for pair in tables for a in pair))


def _rows(x: Any) -> int:
    return int(np.shape(first_input(x))[0])


# -- parameter-server pushes ----------------------------------------------------------------------

_IO_CACHE: "weakref.WeakKeyDictionary[Any, tuple[tuple, VariableIO]]" = weakref.WeakKeyDictionary()


class VariableIO(FlatLayout):
    """A push's and a reply's work on the worker's variables, in one compiled TensorFlow call
    each: every dense weight read (one flat vector) with the touched rows' deltas, and every
    dense weight and pulled row assigned. The tables' delta bases (their rows as last pulled)
    live beside the tables as variables on the same device, so a push's rows are gathered and
    subtracted, and a reply's rows written into the table and its base, without leaving compiled
    code (on the host, numpy's fancy indexing of the bases cost the CTR model's push about 6 ms
    of its 19); they take the tables' size again on that device, for as long as the worker keeps
    the model (the host copies they replace lasted a task). Eager, a push cost one op dispatch per variable and per table (about 5 ms per
    push for the CTR model, against 8 ms of compute per step). The dense weights cross as one flat
    vector, so a call converts one array, not one per weight (each conversion costs Python
    0.06 ms). Built once per model and per split of its weights (the worker keeps the model
    between tasks), or ``None`` where the weights are not TensorFlow variables or the dense ones
    differ in dtype (then the eager path of :mod:`sparkdl_train.worker.row_sync` runs)."""

    def __init__(self, dense: list[Any], tables: list[Any], id_dtypes: list[Any], dtype: Any):
        import tensorflow as tf

        self.shapes = [tuple(int(d) for d in v.shape) for v in dense]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.dtype = np.dtype(dtype)
        sizes, shapes = self.sizes, self.shapes
        bases = []
        for t in tables:  # the delta bases, on the tables' devices
            with tf.device(t.device):
                bases.append(tf.Variable(tf.zeros(t.shape, t.dtype), trainable=False))
        self._bases = bases  # (the compiled calls hold them too)

        def read(ids, scale):
            flat = tf.concat([tf.reshape(v.read_value(), [-1]) for v in dense], 0) if dense else tf.zeros([0], dtype)
            return flat, [(tf.gather(t, i) - tf.gather(b, i)) * tf.cast(scale, t.dtype)
                          for t, b, i in zip(tables, bases, ids)]

        def write(flat, ids, rows):
            for v, part, shape in zip(dense, tf.split(flat, sizes) if dense else [], shapes):
                v.assign(tf.reshape(part, shape))
            for t, b, i, r in zip(tables, bases, ids, rows):
                t.scatter_update(tf.IndexedSlices(r, i))
                b.scatter_update(tf.IndexedSlices(r, i))
            return tf.constant(0)

        def rebase():
            for t, b in zip(tables, bases):
                b.assign(t.read_value())
            return tf.constant(0)

        id_specs = [tf.TensorSpec([None], d) for d in id_dtypes]
        row_specs = [tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in tables]
        flat_spec = tf.TensorSpec([sum(sizes)], dtype)
        # concrete functions: a call skips the polymorphic function's matching of its arguments'
        # types (a push's read 0.61 to 0.21 ms, its write 0.76 to 0.43 ms)
        self._read = tf.function(read, input_signature=[id_specs, tf.TensorSpec([], tf.float64)],
                                 autograph=False).get_concrete_function()
        self._write = tf.function(write, input_signature=[flat_spec, id_specs, row_specs], autograph=False).get_concrete_function()
        self._rebase = tf.function(rebase, input_signature=[], autograph=False).get_concrete_function()

    @classmethod
    def of(cls, model: Any, dense: list[int], tables: list[int]) -> "VariableIO | None":
        weights = list(model.weights)
        values = [getattr(weights[i], "value", None) for i in [*dense, *tables]]
        if not all(hasattr(v, "scatter_update") and hasattr(v, "read_value") for v in values):
            return None
        dtypes = {np.dtype(weights[i].dtype) for i in dense}
        if len(dtypes) > 1:  # one flat vector holds one dtype
            return None
        key = (tuple(dense), tuple(tables), tuple(id(v) for v in values))
        cached = _IO_CACHE.get(model)
        if cached is not None and cached[0] == key:
            return cached[1]
        import tensorflow as tf

        id_dtypes = [tf.int32 if int(weights[i].shape[0]) < 2**31 else tf.int64 for i in tables]
        io = cls(values[: len(dense)], values[len(dense):], id_dtypes, dtypes.pop() if dtypes else np.float32)
        _IO_CACHE[model] = (key, io)
        return io

    def rebase(self) -> None:
        """Every table's delta base := the table as it is now (a whole table was assigned, or a task begins)."""
        self._rebase()

    def read(self, ids: list[np.ndarray], scale: float = 1.0) -> tuple[np.ndarray, list[np.ndarray]]:
        """The dense weights as one flat vector (read-only) and the rows ``ids`` less their bases, times ``scale``."""
        flat, rows = self._read(list(ids), scale)
        return flat.numpy(), [r.numpy() for r in rows]

    def write(self, flat: np.ndarray, ids: list[np.ndarray], rows: list[np.ndarray]) -> None:
        """The dense weights from ``flat``; rows ``ids`` of each table, and of its base, from ``rows``."""
        self._write(flat, list(ids), list(rows))


def variable_io(model: Any, dense: list[int], tables: list[int]) -> "VariableIO | None":
    return VariableIO.of(model, dense, tables)


def scatter_rows(var: Any, ids: np.ndarray, rows: np.ndarray) -> None:
    """``var[ids] = rows`` in place."""
    if len(ids) == 0:
        return
    value = getattr(var, "value", None)
    if hasattr(value, "scatter_update"):
        import tensorflow as tf

        value.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(rows), tf.convert_to_tensor(ids)))
        return
    full = np.array(var.numpy(), copy=True)
    full[ids] = rows
    var.assign(full)


# -- placement ------------------------------------------------------------------------------------


def read_values(variables: list[Any]) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in variables]


def assign_values(variables: list[Any], arrays: list[np.ndarray]) -> None:
    for v, a in zip(variables, arrays):
        v.assign(a)


def gpu_count() -> int:
    """GPUs TensorFlow sees (memory growth on for each, so idle ones cost no memory)."""
    import tensorflow as tf

    global _memory_growth_set
    gpus = tf.config.list_physical_devices("GPU")
    if not _memory_growth_set:
        for g in gpus:
            try:
                tf.config.experimental.set_memory_growth(g, True)
            except RuntimeError:  # already initialised: keep TF's setting
                pass
        _memory_growth_set = True
    return len(gpus)


def device_name(ordinal: int | None) -> str:
    return "/CPU:0" if ordinal is None else f"/GPU:{ordinal}"


@contextlib.contextmanager
def device_scope(device: str) -> Iterator[None]:
    """``tf.device(device)`` while the block runs."""
    import tensorflow as tf

    with tf.device(device):
        yield


def device_of(variable: Any) -> str:
    """Where a Keras variable's value lives (TensorFlow's device string)."""
    return str(getattr(getattr(variable, "value", None), "device", ""))
