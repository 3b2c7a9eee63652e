"""The JAX backend: Keras' stateless steps under ``jax.jit``, called statefully on numpy batches.

Keras on JAX keeps no state inside its compiled functions: ``train_step(state, data)`` takes
the trainable, non-trainable, optimizer and metric variables' values and returns new ones.
:class:`_Stateful` reads them from the model's variables before a call and assigns the results
after it, so every caller (the partition pass, parameter-server pushes reading the weights, the
metric merge) sees the variables as it does on TensorFlow. A group of batches (``grouped``) runs
as one ``lax.scan`` over their stacked leading dimension: one compiled call per group, as Keras'
``steps_per_execution``.

JAX compiles per input shape. Each compiled function keeps its executables by the shapes and
dtypes of its data (a partition's short last batch and a short last group are shapes of their
own), compiled ahead of time (``lower().compile()``) so that :func:`instantiate` (a prepare task)
can compile the shapes an epoch will use before it starts, and ``stats["traced"]`` is exact.
On accelerators the state's buffers are donated to the call (updated in place). Numpy arguments
are copied to the device first (:func:`_owned`): JAX may read them in place, asynchronously.
String inputs cannot enter a JAX function: refused with a ConfigError.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from .. import _compat
from .._folders import private_folder
from ..errors import ConfigError
from ..trees import Batch, tree_leaves, tree_map, zero_rows
from . import capabilities
from .flat import FlatLayout, FusedLayout, first_input

NAME = "jax"
# XLA compiles an executable per input shape (a pass runs a short last group batch by batch); a jitted
# step is one XLA program, which hands no gradient bucket over before it returns
CAPABILITIES = capabilities(NAME)
_ATTRIBUTE = "_sparkdl_train_jax_steps"


# XLA's persistent compilation cache (spark.sparkdl_train.jax.compilationCache): the driver gives a fit's stages
# the setting in these variables; a worker resolves them into JAX's own before it imports JAX
CACHE_SETTING_ENV = "SPARKDL_TRAIN_JAX_CACHE"
CACHE_BYTES_ENV = "SPARKDL_TRAIN_JAX_CACHE_BYTES"
_cache_configured: str | None = None


def default_cache_dir() -> str:
    """'auto': a folder of this user's in this host's temporary directory."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"sparkdl_train-jax-cache-{os.getuid()}")


def configure_cache(setting: str | None = None, max_bytes: int | None = None) -> str | None:
    """Point this process's JAX at its persistent compilation cache: ``setting`` ('auto', 'off' or a folder;
    default: what the driver gave this worker in SPARKDL_TRAIN_JAX_CACHE), ``max_bytes`` its size (0: no
    limit). Before JAX is imported through JAX's environment variables, after it through its config. An
    application's own JAX_COMPILATION_CACHE_DIR wins. Returns the folder in use (None: none)."""
    global _cache_configured
    import logging

    setting = setting if setting is not None else os.environ.get(CACHE_SETTING_ENV)
    if _cache_configured is None and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]  # the application's own (spark.executorEnv, the shell)
    if not setting or setting == "off":
        return None
    folder = default_cache_dir() if setting == "auto" else setting
    if _cache_configured == folder:
        return folder
    why = private_folder(folder)
    if why is not None:
        logging.getLogger(__name__).warning("JAX's compilation cache is off in this process: %s cannot hold it (%s); "
                                            "spark.sparkdl_train.jax.compilationCache names another folder", folder, why)
        return None
    if max_bytes is None:
        max_bytes = int(os.environ.get(CACHE_BYTES_ENV) or 1 << 30)
    if max_bytes:
        try:
            import filelock  # noqa: F401 - JAX evicts under its lock
        except ImportError:
            logging.getLogger(__name__).warning("JAX's compilation cache grows without limit in this process: evicting "
                                                "needs the filelock package (pip install filelock)")
            max_bytes = 0
    values = {"jax_compilation_cache_dir": folder, "jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": 0, "jax_compilation_cache_max_size": max_bytes or -1}
    if "jax" in sys.modules:
        import jax

        fresh = not jax.config.jax_compilation_cache_dir
        for key, value in values.items():
            jax.config.update(key, value)
        if fresh:  # a compile before this may have found no cache and remembered it
            with contextlib.suppress(Exception):
                from jax.experimental.compilation_cache import compilation_cache

                compilation_cache.reset_cache()
    else:
        for key, value in values.items():
            os.environ[key.upper()] = str(value)
    _cache_configured = folder
    return folder


def import_framework() -> float:
    configure_cache()
    if "jax" in sys.modules:
        return 0.0
    start = time.perf_counter()
    import jax  # noqa: F401

    return time.perf_counter() - start


def configure_threads(threads: int) -> int:
    """XLA's CPU client sizes its pools as it starts, at a process's first computation (XLA reads ``XLA_FLAGS``
    then, not at JAX's import, which a worker forked from the daemon has behind it): with one thread a task,
    Eigen's multi-threading is turned off. Set once the client has started, the flag changes nothing."""
    if threads == 1:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    return threads


def _donate() -> tuple[int, ...]:
    import jax

    return (0,) if jax.default_backend() != "cpu" else ()  # on CPU numpy views of the old values may live on


def _key(data: Any) -> tuple:
    return tuple((np.shape(a), np.asarray(a).dtype.str if not hasattr(a, "dtype") else str(a.dtype)) for a in tree_leaves(data))


def _check_numeric(batch: Batch) -> None:
    for a in tree_leaves(batch):
        if np.asarray(a).dtype.kind in "OSU":
            raise ConfigError("the JAX backend takes numeric inputs only: a model input is strings (use the TensorFlow "
                              "backend, or map the strings to ids in Spark)")


class _Compiled:
    """``fn(state, *data)`` jitted, one executable per data signature and device, compiled ahead."""

    def __init__(self, fn: Callable, donate: tuple[int, ...]):
        import jax

        self._jit = jax.jit(fn, donate_argnums=donate)
        self.executables: dict[tuple, Any] = {}

    def executable(self, state: Any, *data: Any) -> tuple[Any, bool]:
        key = self._signature(data)
        exe = self.executables.get(key)
        if exe is not None:
            return exe, False
        exe = self.executables[key] = self._jit.lower(state, *data).compile()
        return exe, True

    def has(self, *data: Any) -> bool:
        """Whether a call on ``data`` finds its executable compiled."""
        return self._signature(data) in self.executables

    @staticmethod
    def _signature(data: tuple) -> tuple:
        """What an executable is compiled for: the data's shapes and dtypes, and the default device."""
        import jax

        return _key(data), str(jax.config.jax_default_device or "")

    def __call__(self, state: Any, *data: Any) -> Any:
        exe, _ = self.executable(state, *data)
        return exe(state, *_owned(data))


def _owned(data: Any) -> Any:
    """``data`` with every numpy array copied to the default device, the copy finished on return
    (:func:`_to_device`). JAX may read a numpy argument of a compiled call in place (CPU), or copy
    it to the device after the call returned (transfers are asynchronous), while callers reuse
    their buffers: the allreduce's gradient vector (summed in place by the ring, zeroed for the
    next step) was read half-changed by the last ``apply`` (one rank's weights NaN, the ranks'
    digests apart), and a push reply's receive buffer is the next request's."""
    leaves = [a for a in tree_leaves(data) if isinstance(a, np.ndarray)]
    if not leaves:
        return data
    moved = iter(_to_device(leaves))
    return tree_map(lambda a: next(moved) if isinstance(a, np.ndarray) else a, data)


def _default_device() -> Any:
    import jax

    device = jax.config.jax_default_device
    if isinstance(device, str):
        return jax.local_devices(backend=device)[0]
    # this process's: in a JAX job of several processes (allreduce.collectives='xla') jax.devices()[0] is rank 0's
    return device if device is not None else jax.local_devices()[0]


#: Whether large device-to-host copies (a model's state read for the driver, the allreduce's
#: fused gradient vector) land in pinned (page-locked) host memory: ``None`` (the default) where the
#: platform has it, ``False`` never. On an H200 (2026-11-27, ``bench/gpu/check.py``): the flagship
#: model's 108 MB state in 3.9 ms against 25 ms through pageable memory, the averaging task's pass
#: at batch 4096 0.85x the time. Writes were measured too and gained nothing (9.7 against 9.1 ms):
#: host-to-device copies stay plain.
PINNED_READS: bool | None = None


def _pinned(device: Any) -> Any:
    """The pinned-host sharding for ``device``'s reads, or None (a CPU, :data:`PINNED_READS` off,
    a jaxlib or platform without pinned host memory)."""
    import jax

    if PINNED_READS is False or device.platform == "cpu":
        return None
    if device not in _PINNED:
        try:
            kinds = {m.kind for m in device.addressable_memories()}
        except Exception:  # noqa: BLE001 - a capability probe: a jaxlib or plugin without memory kinds reads plainly
            kinds = set()
        _PINNED[device] = (jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
                           if "pinned_host" in kinds else None)
    return _PINNED[device]


_PINNED: dict[Any, Any] = {}  # device -> its pinned-host sharding, or None


def _to_host(values: list[Any], own: bool = True) -> list[np.ndarray]:
    """Device arrays on the host, the copies started together, never written into by the caller.
    On an accelerator with pinned host memory they land there and come back as views of those
    buffers (no second copy into pageable memory: 26 ms more for 100 MB). On the CPU ``own``
    copies them out of the arrays' own buffers (which JAX may reuse once the arrays are gone)."""
    import jax

    devices = {d for a in values for d in a.devices()}
    pinned = _pinned(next(iter(devices))) if len(devices) == 1 else None
    if pinned is not None:
        return [np.asarray(a) for a in jax.block_until_ready(jax.device_put(values, pinned))]
    got = jax.device_get(values)
    return [np.require(a, requirements="W") for a in got] if own else [np.asarray(a) for a in got]


def _to_device(arrays: list[np.ndarray]) -> list[Any]:
    """Host arrays copied to the default device, finished on return, aliasing nothing of the
    caller's (who may reuse them). On the CPU, ``jax.device_put`` keeps a 64-byte-aligned numpy
    buffer as the array's storage even with ``may_alias=False`` (JAX 0.10): JAX gets a private
    copy there. That aliasing, by the alignment of whatever buffer the ring or a receive had, was
    the cause of the allreduce's occasional NaN rank (tests/scripts/jax_aliasing.py)."""
    import jax

    device = _default_device()
    if device.platform == "cpu":
        arrays = [np.array(a, copy=True) for a in arrays]
    return jax.block_until_ready(jax.device_put(arrays, device, may_alias=False))


def _groups(model: Any, kind: str) -> list[list[Any]]:
    """The variables a ``{kind}_step`` takes as its state, in its order."""
    groups = [list(model.trainable_variables), list(model.non_trainable_variables)]
    if kind == "train" and not model.optimizer.built:  # as fit builds it before its first step
        model.optimizer.build(model.trainable_variables)
    if kind == "train":
        groups.append(list(model.optimizer.variables))
    if kind in ("train", "test"):
        groups.append(list(model.metrics_variables))
    return groups


def _read(groups: list[list[Any]]) -> tuple:
    return tuple([v.value for v in g] for g in groups)


def _write(groups: list[list[Any]], values: Any) -> None:
    for g, vals in zip(groups, values):
        for v, x in zip(g, vals):
            _compat.assign_raw(v, x)


class _Stateful:
    """A model's ``{kind}_step`` (``grouped``: a ``lax.scan`` of it) called with the model's
    variables as its state, which it then assigns."""

    def __init__(self, model: Any, kind: str, grouped: bool):
        import jax

        self.model, self.kind, self.grouped = model, kind, grouped
        step = getattr(model, f"{kind}_step")

        if kind == "predict":
            def one(state, data):
                out, non_trainable = step(tuple(state), data)
                return out, (state[0], non_trainable)
        else:
            def one(state, data):
                _, new = step(tuple(state), data)
                return None, list(new)

        if grouped:
            def fn(state, data):
                def body(carry, batch):
                    return one(carry, batch)[1], None

                new, _ = jax.lax.scan(body, list(state), data)
                return None, new
        else:
            fn = one
        self.compiled = _Compiled(fn, _donate() if kind != "predict" else ())
        self._groups: list[list[Any]] | None = None

    def groups(self) -> list[list[Any]]:
        if self._groups is None:  # after the first build (symbolic_build): the metrics' variables exist
            self._groups = _groups(self.model, self.kind)
        return self._groups

    def compile(self, data: Batch) -> bool:
        _, compiled = self.compiled.executable(list(_read(self.groups())), data)
        return compiled

    def __call__(self, data: Batch) -> Any:
        groups = self.groups()
        out, new = self.compiled(list(_read(groups)), data)
        _write(groups, new)
        return out


def _cache(model: Any) -> dict:
    return model.__dict__.setdefault(_ATTRIBUTE, {})  # past Keras' attribute tracking


def _step_key(model: Any, kind: str, grouped: bool) -> tuple:
    return (kind, id(getattr(model, "optimizer", None)), grouped)


def compiled_step(model: Any, kind: str, batch: Batch, stats: dict[str, Any] | None = None,
                  grouped: bool = False) -> Callable[[Batch], Any]:
    _check_numeric(batch)
    if kind != "predict" and not _compat.compiled_metrics_built(model):
        _compat.symbolic_build(model, batch)  # the step's state includes the compiled metrics' variables
    # run_eagerly too: the step is compiled (and kept) all the same
    cache = _cache(model)
    key = _step_key(model, kind, grouped)
    step = cache.get(key)
    if step is None:
        step = cache[key] = _Stateful(model, kind, grouped)
    if stats is not None:  # whether the first call compiles (a pass's first call is a group of one batch)
        first = tree_map(lambda a: np.asarray(a)[np.newaxis], batch) if grouped else batch
        stats["traced"] = not step.compiled.has(first)
    return step


def traces(model: Any, kind: str, grouped: bool = False) -> int:
    step = _cache(model).get(_step_key(model, kind, grouped))
    return len(step.compiled.executables) if step is not None else 0


def instantiate(model: Any, kind: str, batch: Batch, sizes: tuple[int, ...] = (1,)) -> bool:
    """Compile the grouped step for groups of ``sizes`` batches shaped like ``batch`` (XLA compiles
    per shape: the shapes of a pass's calls); runs nothing. Returns whether anything was compiled."""
    step = compiled_step(model, kind, batch, grouped=True)
    compiled = False
    for n in sorted(set(sizes) | {1}):
        stacked = tree_map(lambda a, n=n: np.repeat(np.asarray(a)[np.newaxis], n, axis=0), batch)
        compiled = step.compile(stacked) or compiled
    return compiled


def check_test_step(model: Any, batch: Batch) -> None:
    """One ``test_step`` of ``batch``, its metric state assigned, jitted as one program: op by op, each op is an
    XLA compile (or a persistent cache's load) of its own, 3-4x the time of the whole step's (0.5 s against 1.9 s
    cold for the MLP of bench.e2e.cold_first_fit, 0.14 s against 0.44 s from the cache). Not the model's own
    ``test_function``: that stays as it was."""
    import jax

    _check_numeric(batch)
    if not _compat.compiled_metrics_built(model):
        _compat.symbolic_build(model, batch)
    groups = _groups(model, "test")
    _, new = jax.jit(model.test_step)(_read(groups), batch)
    _write(groups, new)


# -- the fused (allreduce) step -------------------------------------------------------------------


class FusedStep(FusedLayout):
    """The train step split around the allreduce (see :mod:`sparkdl_train.worker.fused_step`).

    Sparse tables: JAX's gradient of a lookup is the dense table, built on the device; the jitted
    step hands back only its rows that are not zero (``jnp.nonzero`` with the table's bound on a
    batch's rows as its static size: the rows the batch looked up, less any whose gradient is exactly
    zero, which add nothing), so the host reads those instead of the table. The apply adds every
    rank's rows once combined on the host (:func:`sparkdl_train.table_rows.combine`: each id
    once, so the device's scatter has no repeated index to order), padded to a power of two so that
    a handful of executables serve every step."""

    def __init__(self, model: Any, batch_size: int, bucket_bytes: int = 0, sparse: tuple[tuple[int, int], ...] = ()):
        import jax
        import jax.numpy as jnp

        if bucket_bytes:
            raise ConfigError(CAPABILITIES.buckets_refused)
        super().__init__(model, batch_size, sparse)
        self.bucket_bounds: list = []
        offsets = np.cumsum([0, *self.sizes])
        shapes, sizes, dense_at, table_at, tables = self.shapes, self.sizes, self.dense_at, self.table_at, self.tables

        def gradients(state, x, y, sample_weight, w):
            trainable, non_trainable, metrics, optimizer_vars = state
            grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
            (_, aux), grads = grad_fn(trainable, non_trainable, metrics, x, y, sample_weight, training=True,
                                      optimizer_variables=optimizer_vars)
            unscaled, y_pred, non_trainable, metrics = aux
            metrics = _compat.jax_update_metrics(model, metrics, unscaled, x, y, y_pred, sample_weight)
            parts = [jnp.reshape(grads[i].astype(jnp.float32), (-1,)) for i in dense_at]
            flat = jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.float32)
            rows = []
            for i, t in zip(table_at, tables):
                g = grads[i].astype(jnp.float32)
                hit = jnp.any(g != 0, axis=1)
                (ids,) = jnp.nonzero(hit, size=t.limit, fill_value=0)
                rows.append((jnp.sum(hit), ids.astype(t.id_dtype), g[ids] * w))
            return jnp.concatenate([flat * w, jnp.reshape(w, (1,))]), [non_trainable, metrics], rows

        def apply(state, summed, table_rows):
            trainable, optimizer_vars = state
            total = summed[-1]
            mean = summed[:-1] / total
            grads: list[Any] = [None] * len(trainable)
            for k, (i, n, s) in enumerate(zip(dense_at, sizes, shapes)):
                grads[i] = jnp.reshape(mean[offsets[k]:offsets[k] + n], s).astype(trainable[i].dtype)
            for i, t, (ids, rows) in zip(table_at, tables, table_rows):
                dense = jnp.zeros((t.rows, t.dim), jnp.float32).at[ids].add(rows, mode="drop")
                grads[i] = (dense / total).astype(trainable[i].dtype)
            trainable, optimizer_vars = model.optimizer.stateless_apply(optimizer_vars, grads, trainable)
            return [trainable, optimizer_vars]

        self._gradients = _Compiled(gradients, ())
        self._apply = _Compiled(apply, _donate())

    def _grad_groups(self) -> list[list[Any]]:
        """The gradient step's state: trainable, non-trainable, metric and optimizer variables; the
        lists are kept once the compiled metrics are built (Keras' variable properties walk every
        layer: not per step)."""
        cached = getattr(self, "_state_groups", None)
        if cached is not None:
            return cached
        m = self.model
        if not m.optimizer.built:
            m.optimizer.build(self.trainables)
        groups = [self.trainables, list(m.non_trainable_variables), list(m.metrics_variables), list(m.optimizer.variables)]
        if _compat.compiled_metrics_built(m):
            self._state_groups = groups
        return groups

    def _args(self, batch: tuple) -> tuple:
        x, y, sw = batch
        rows = int(np.shape(first_input(x))[0])
        return x, y, sw, np.float32(rows / self.batch_size)

    def trace(self, batch: tuple) -> bool:
        """Compile the gradient step for full batches of ``batch``'s signature (it may have no rows)."""
        _check_numeric(batch)
        if int(np.shape(first_input(batch[0]))[0]) == 0:
            batch = zero_rows(tuple(batch), int(self.batch_size))
        _, compiled = self._gradients.executable(list(_read(self._grad_groups())), *self._args(tuple(batch)))
        return compiled

    def gradients(self, batch: tuple, out: np.ndarray, ready: Any = None) -> int:
        """Write this rank's weighted, fused gradient into ``out`` (and its sparse tables' rows into
        ``touched``); returns the batch's rows."""
        groups = self._grad_groups()
        args = self._args(tuple(batch))
        flat, new, rows = self._gradients(list(_read(groups)), *args)
        _write(groups[1:3], new)
        host = _to_host([flat, *(a for r in rows for a in r)], own=False)
        np.copyto(out, host[0])  # copied into ``out`` right away
        touched = []
        for k, t in enumerate(self.tables):
            count, ids, values = host[1 + 3 * k: 4 + 3 * k]
            if int(count) > t.limit:
                raise ValueError(f"allreduce.sparseGradients: {int(count)} rows of embedding table "
                                 f"{self.trainables[self.table_at[k]].path!r} have a gradient, more than the {t.limit} "
                                 "its batch can look up (a regularizer or another use of the table?); set "
                                 "sparse_gradients=False")
            touched.append((np.array(ids[: int(count)]), np.array(values[: int(count)])))
        self.touched = touched
        return int(np.shape(first_input(batch[0]))[0])

    def apply(self, summed: np.ndarray, tables: Any = ()) -> None:
        """Apply the summed vector and, per sparse table, every rank's ``(ids, rows)`` (rank order)."""
        from ..table_rows import combine

        self.check_tables(tables)
        padded = []
        for t, (ids, rows) in zip(self.tables, tables):
            ids, rows = combine(np.asarray(ids), np.asarray(rows, np.float32).reshape(-1, t.dim))
            size = min(t.rows, 1 << max(0, int(len(ids) - 1).bit_length())) if len(ids) else 1
            size = max(size, len(ids))
            p_ids = np.full(size, t.rows, t.id_dtype)  # out of range: dropped by the scatter
            p_ids[: len(ids)] = ids
            p_rows = np.zeros((size, t.dim), np.float32)
            p_rows[: len(ids)] = rows
            padded.append((p_ids, p_rows))
        groups = [self.trainables, self._grad_groups()[3]]
        # not waited for: ``summed`` is on the device, copied (the ring reuses the buffer at once)
        _write(groups, self._apply(list(_read(groups)), *_to_device([summed]), padded))


# -- parameter-server pushes ----------------------------------------------------------------------

_IO_CACHE: "weakref.WeakKeyDictionary[Any, tuple[tuple, VariableIO]]" = weakref.WeakKeyDictionary()


def _id_bucket(n: int) -> int:
    """Ids of a push padded to this many (at least 1,024; four sizes per power of two): a compiled
    gather or scatter is one executable per shape, and a push's count of distinct rows differs
    every time (one compile per push, tens of milliseconds, without buckets)."""
    if n <= 1024:
        return 1024
    top = 1 << (n - 1).bit_length()  # the power of two at or above n
    step = top // 8  # top/2 .. top in quarters: at most 25% padding
    return -(-n // step) * step


def _padded_ids(ids: np.ndarray, fill: int) -> np.ndarray:
    out = np.full(_id_bucket(len(ids)), fill, dtype=ids.dtype)
    out[: len(ids)] = ids
    return out


class VariableIO(FlatLayout):
    """A push's and a reply's work on the worker's variables, in one compiled call each: every
    dense weight read (one flat vector) with the touched rows less their delta bases (the rows as
    last pulled, kept on the device beside the tables), and every dense weight, pulled row and its
    base assigned. Ids are padded to a few sizes (:func:`_id_bucket`): one executable per size."""

    def __init__(self, dense: list[Any], tables: list[Any], dtype: Any):
        import jax
        import jax.numpy as jnp

        self.dense, self.tables = dense, tables
        self.shapes = [tuple(int(d) for d in v.shape) for v in dense]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.dtype = np.dtype(dtype)
        offsets = np.cumsum([0, *self.sizes])
        shapes, sizes = self.shapes, self.sizes

        def read(dense_values, table_values, bases, ids, scale):
            flat = jnp.concatenate([jnp.reshape(v, (-1,)) for v in dense_values]) if dense_values else jnp.zeros((0,), dtype)
            return flat, [(jnp.take(t, i, axis=0) - jnp.take(b, i, axis=0)) * scale.astype(t.dtype)
                          for t, b, i in zip(table_values, bases, ids)]

        def write(table_values, bases, flat, ids, rows):  # padding ids lie past the tables' rows: dropped
            dense_new = [jnp.reshape(flat[offsets[k]:offsets[k] + n], s) for k, (n, s) in enumerate(zip(sizes, shapes))]
            return (dense_new, [t.at[i].set(r.astype(t.dtype), mode="drop") for t, i, r in zip(table_values, ids, rows)],
                    [b.at[i].set(r.astype(b.dtype), mode="drop") for b, i, r in zip(bases, ids, rows)])

        self._read = jax.jit(read)
        # on an accelerator the old tables and bases are given up: no copy of a whole table per reply. On the
        # CPU nothing is (numpy views of a table's old value may live on; giving up the bases alone was
        # measured slower there: bench/ps/push.py, 25-27 ms against 38-41 ms a push of 1M-row tables)
        self._write = jax.jit(write, donate_argnums=(0, 1) if _donate() else ())
        self._copy = jax.jit(lambda xs: [jnp.copy(x) for x in xs])
        self._bases: list[Any] = []  # set by rebase(), which a TableSync calls before its first push

    @classmethod
    def of(cls, model: Any, dense: list[int], tables: list[int]) -> "VariableIO | None":
        weights = list(model.weights)
        dtypes = {np.dtype(weights[i].dtype) for i in dense}
        if len(dtypes) > 1:  # one flat vector holds one dtype
            return None
        key = (tuple(dense), tuple(tables), tuple(id(weights[i]) for i in [*dense, *tables]))
        cached = _IO_CACHE.get(model)
        if cached is not None and cached[0] == key:
            return cached[1]
        io = cls([weights[i] for i in dense], [weights[i] for i in tables], dtypes.pop() if dtypes else np.float32)
        _IO_CACHE[model] = (key, io)
        return io

    def rebase(self) -> None:
        """Every table's delta base := the table as it is now (a copy: a train step may donate the table's buffer)."""
        self._bases = list(self._copy([t.value for t in self.tables])) if self.tables else []

    def read(self, ids: list[np.ndarray], scale: float = 1.0) -> tuple[np.ndarray, list[np.ndarray]]:
        """The dense weights as one flat vector and the rows ``ids`` less their bases, times ``scale``."""
        counts = [len(i) for i in ids]
        flat, rows = self._read([v.value for v in self.dense], [t.value for t in self.tables], self._bases,
                                _owned([_padded_ids(np.asarray(i), 0) for i in ids]), np.float32(scale))
        host = _to_host([flat, *rows])
        return host[0], [r[:n] for r, n in zip(host[1:], counts)]

    def write(self, flat: np.ndarray, ids: list[np.ndarray], rows: list[np.ndarray]) -> None:
        """The dense weights from ``flat``; rows ``ids`` of each table, and of its base, from ``rows``."""
        padded_ids, padded_rows = [], []
        for t, i, r in zip(self.tables, ids, rows):
            i, r = np.asarray(i), np.asarray(r)
            padded_ids.append(_padded_ids(i, int(t.shape[0])))  # past the table's rows: dropped
            pad = np.zeros((len(padded_ids[-1]), *r.shape[1:]), r.dtype)
            pad[: len(r)] = r
            padded_rows.append(pad)
        dense_new, tables_new, self._bases = self._write([t.value for t in self.tables], self._bases,
                                                         *_owned((flat, padded_ids, padded_rows)))
        for v, x in zip(self.dense, dense_new):
            _compat.assign_raw(v, x)
        for t, x in zip(self.tables, tables_new):
            _compat.assign_raw(t, x)


def variable_io(model: Any, dense: list[int], tables: list[int]) -> "VariableIO | None":
    return VariableIO.of(model, dense, tables)


def scatter_rows(var: Any, ids: np.ndarray, rows: np.ndarray) -> None:
    """``var[ids] = rows``."""
    if len(ids) == 0:
        return
    ids, rows = _owned((np.asarray(ids), np.asarray(rows, dtype=np.dtype(var.dtype))))
    _compat.assign_raw(var, var.value.at[ids].set(rows))


# -- placement ------------------------------------------------------------------------------------


def read_values(variables: list[Any]) -> list[np.ndarray]:
    """Every variable on the host (callers never write into them): the copies started together
    (``v.numpy()`` per variable waits for each in turn: 40 copies, 108 MB, for the flagship model's
    state after an averaging task), through pinned host memory on an accelerator (:func:`_to_host`)."""
    return _to_host([v.value for v in variables])


def assign_values(variables: list[Any], arrays: list[np.ndarray]) -> None:
    """``v.assign(a)`` for each pair, the host-to-device copies started together and finished before
    return (the caller may reuse its arrays: see :func:`_owned`)."""
    host = [np.asarray(a, dtype=np.dtype(v.dtype)) for v, a in zip(variables, arrays)]
    for v, x in zip(variables, _to_device(host)):
        _compat.assign_raw(v, x)


def gpu_count() -> int:
    import jax

    try:
        return len(jax.devices("gpu"))
    except RuntimeError:  # no GPU platform in this jaxlib
        return 0


def device_name(ordinal: int | None) -> str:
    return "cpu:0" if ordinal is None else f"gpu:{ordinal}"


@contextlib.contextmanager
def device_scope(device: str) -> Iterator[None]:
    """``jax.default_device`` of ``device`` (``"gpu:1"``, ``"cpu:0"``) while the block runs."""
    import jax

    platform, _, ordinal = device.partition(":")
    with jax.default_device(jax.local_devices(backend=platform)[int(ordinal or 0)]):
        yield


def device_of(variable: Any) -> str:
    """Where a Keras variable's value lives (``"gpu:0"``, ``"cpu:0"``)."""
    devices = getattr(variable.value, "devices", None)
    if devices is None:
        return ""
    return ",".join(sorted(f"{d.platform}:{d.id}" for d in devices()))
