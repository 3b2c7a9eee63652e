"""Embedding tables that grow and forget under a stream: ``fit_stream(dynamic_ids=[DynamicTable(...)])``.

A stream brings ids (users, ads) the model has never seen, and most of them only once. For each
:class:`DynamicTable` the driver keeps a :class:`~sparkdl_train.models.dynamic_ids.DynamicIds` over the rows
of one ``keras.layers.Embedding`` (its ``input_dim`` is the capacity) and, per micro-batch:

1. counts the micro-batch's raw ids (a Spark ``groupBy(id).count()``, collected through Arrow: one row per
   distinct id, never the rows themselves);
2. observes them: an id gets a row after ``admit_after`` sightings; a full table gives the row of the id seen
   least recently (idle for ``min_idle`` micro-batches at least) to the newcomer;
3. resets the rows given to a new id: the layer's initializer draws their weights, the optimizer's slots for
   them go back to their start (zeros; Adagrad's accumulators to ``initial_accumulator_value``), the
   parameter server's copy follows (:meth:`~sparkdl_train.driver.engines.base.Engine.reload`);
4. maps the micro-batch's ids to rows on the executors (:mod:`sparkdl_train.data.id_map`; an id without a
   row gets row 0, shared by every such id), and the engine trains on the mapped rows.

The tables' state is committed with the model (same micro-batch id, written before the checkpoint's pointer)
and published with each model version (``dynamic_ids.bin`` in its folder: :func:`read_tables`, then
:func:`map_ids` gives a reader's DataFrame the same rows). Memory: ``capacity`` ids and stamps plus the
count-min sketch per table, whatever the number of distinct ids.

Supported: ``keras.layers.Embedding`` layers (any ``output_dim``) whose ids come from one integer column (or
an array of integers) of the stream, on every engine (averaging, the parameter-server modes, with or without
``sparse_embeddings``, allreduce) and both backends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import wire
from ..data.id_map import map_batches
from ..errors import ConfigError, DataError
from ..models.dynamic_ids import DynamicIds

log = logging.getLogger(__name__)

FILE = "dynamic_ids.bin"


@dataclass(frozen=True)
class DynamicTable:
    """Dynamic rows for embedding layer ``layer``, read through integer column ``column`` (raw ids: any int64)."""

    column: str
    layer: str
    admit_after: int = 2  # sightings before an id gets a row of its own
    min_idle: int = 1  # micro-batches an id must go unseen before its row may go to another
    sketch_width: int = 1 << 16  # count-min sketch of the ids still waiting: width x depth int32 counters
    sketch_depth: int = 4
    decay_every: int = 0  # halve the sketch's counts every this many micro-batches (0: never)

    def __post_init__(self) -> None:
        for name in ("column", "layer"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"DynamicTable: {name} must name a {'column' if name == 'column' else 'layer'}, got "
                                  f"{getattr(self, name)!r}")
        for name, low in (("admit_after", 1), ("min_idle", 0), ("sketch_width", 1), ("sketch_depth", 1), ("decay_every", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"DynamicTable({self.column!r}): {name} must be an integer >= {low}, got {value!r}")


@dataclass
class Reset:
    """Rows of one table to reset before a micro-batch trains: their new weights, drawn once (a retried pass
    resets them to the same values)."""

    layer: str
    rows: np.ndarray
    values: np.ndarray


class IdTables:
    """The driver's side of ``dynamic_ids``: one :class:`DynamicIds` per :class:`DynamicTable`."""

    def __init__(self, model: Any, specs: Sequence[DynamicTable]):
        if isinstance(specs, DynamicTable):
            specs = [specs]
        if not isinstance(specs, (list, tuple)) or not all(isinstance(s, DynamicTable) for s in specs) or not specs:
            raise ConfigError(f"fit_stream: dynamic_ids is a list of DynamicTable(column, layer, ...), got {specs!r}")
        for key in ("column", "layer"):
            names = [getattr(s, key) for s in specs]
            if len(set(names)) != len(names):
                raise ConfigError(f"fit_stream: dynamic_ids names a {key} twice: {names}")
        self.specs = list(specs)
        self.tables: dict[str, DynamicIds] = {}
        for s in self.specs:
            var = _embeddings(model, s.layer)
            self.tables[s.column] = DynamicIds(int(var.shape[0]), s.admit_after, s.min_idle, s.sketch_width, s.sketch_depth,
                                               s.decay_every)

    # ---- state, committed with the model
    def encode(self) -> bytes:
        arrays, names = [], []
        for column, t in self.tables.items():
            for key, a in t.state().items():
                names.append([column, key])
                arrays.append(a)
        return wire.encode({"format": "sparkdl_train.dynamic_ids", "arrays": names}, arrays)

    def restore(self, blob: bytes) -> None:
        tables = read_tables(blob)
        for column in self.tables:
            if column not in tables:
                raise ConfigError(f"fit_stream: the checkpoint's dynamic ids have no table for column {column!r} "
                                  f"(it holds {sorted(tables)}); use a new checkpoint location for a changed dynamic_ids")
            if tables[column].capacity != self.tables[column].capacity:
                raise ConfigError(f"fit_stream: the checkpoint's table for column {column!r} has {tables[column].capacity} rows, "
                                  f"the model's layer {self.tables[column].capacity}")
            self.tables[column] = tables[column]

    # ---- a micro-batch
    def check(self, df: Any) -> None:
        from pyspark.sql import types as T

        fields = {f.name: f.dataType for f in df.schema.fields}
        for s in self.specs:
            if s.column not in fields:
                raise DataError(f"fit_stream: dynamic_ids column {s.column!r} is not in the stream (columns: {sorted(fields)})")
            t = fields[s.column]
            inner = t.elementType if isinstance(t, T.ArrayType) else t
            if not isinstance(inner, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
                raise DataError(f"fit_stream: dynamic_ids column {s.column!r} must hold integer ids (or arrays of them), "
                                f"it is {t.simpleString()}; hash strings to integers first (e.g. xxhash64)")

    def observe(self, df: Any, model: Any) -> tuple[list[Reset], dict[str, dict[str, int]]]:
        """Count ``df``'s ids, admit and evict; the rows to reset and what changed, per column."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        resets, report = [], {}  # df's columns were checked on the stream's (start: IdTables.check)
        types = {f.name: f.dataType for f in df.schema.fields}
        for s in self.specs:
            col = F.explode(F.col(s.column)) if isinstance(types[s.column], T.ArrayType) else F.col(s.column)
            counted = df.select(col.cast("long").alias("id")).where(F.col("id").isNotNull()).groupBy("id").count()
            table = counted.toArrow()
            values, counts = table.column("id").to_numpy(), table.column("count").to_numpy()
            ids = self.tables[s.column]
            seen = ids.observe_counts(values, counts)
            if len(seen.reassigned):
                resets.append(Reset(s.layer, seen.reassigned, _fresh_rows(model, s.layer, len(seen.reassigned))))
            report[s.column] = {"distinct": int(len(values)), "admitted": int(len(seen.admitted)),
                                "reassigned": int(len(seen.reassigned)), "waiting": int(seen.waiting), "held": ids.size}
        return resets, report

    def mapped(self, df: Any) -> tuple[Any, Any]:
        """``df`` with each id column's ids replaced by their rows (same types); the broadcast to release after."""
        columns = [s.column for s in self.specs]
        shared = df.sparkSession.sparkContext.broadcast([self.tables[c].table for c in columns])
        return _map_columns(df, columns, shared), shared


def reset_rows(model: Any, resets: Sequence[Reset]) -> None:
    """Give ``resets``' rows their fresh weights, and the optimizer's slots for them their starting values."""
    import keras

    if not resets:
        return
    opt = getattr(model, "optimizer", None)
    for r in resets:
        var = _embeddings(model, r.layer)
        idx = np.asarray(r.rows, np.int32)[:, None]
        var.assign(keras.ops.scatter_update(var.value, idx, keras.ops.convert_to_tensor(r.values, var.dtype)))
        for slot, start in _slots(opt, var):
            fill = np.full((len(r.rows), *slot.shape[1:]), start, slot.dtype)
            slot.assign(keras.ops.scatter_update(slot.value, idx, keras.ops.convert_to_tensor(fill, slot.dtype)))


def read_tables(blob: bytes) -> dict[str, DynamicIds]:
    """The tables in a committed or published ``dynamic_ids.bin``, by column."""
    meta, arrays = wire.decode(blob, copy=True)
    if meta.get("format") != "sparkdl_train.dynamic_ids":
        raise ValueError("not a dynamic ids file (sparkdl_train.dynamic_ids)")
    states: dict[str, dict[str, np.ndarray]] = {}
    for (column, key), a in zip(meta["arrays"], arrays):
        states.setdefault(column, {})[key] = a
    return {c: DynamicIds.from_state(st) for c, st in states.items()}


def map_ids(df: Any, tables: dict[str, DynamicIds]) -> Any:
    """A (batch) DataFrame's raw ids as the rows a published version's tables give them (row 0: no row of its own),
    for ``predict``/``evaluate`` with that version."""
    columns = list(tables)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"map_ids: the DataFrame lacks the id columns {missing} (columns: {df.columns})")
    return _map_columns(df, columns, [tables[c].table for c in columns])


def _map_columns(df: Any, columns: list[str], tables: Any) -> Any:
    """``df`` with ``columns`` mapped on the executors by ``tables`` (a broadcast or a list of ``(keys, rows)``)."""

    def fn(batches: Any) -> Any:
        return map_batches(batches, columns, tables)

    return df.mapInArrow(fn, df.schema)


def _embeddings(model: Any, layer: str) -> Any:
    import keras

    try:
        found = model.get_layer(layer)
    except ValueError:
        found = None
    if found is None:
        raise ConfigError(f"fit_stream: dynamic_ids names layer {layer!r}, which the model does not have "
                          f"(layers: {[lay.name for lay in model.layers]})")
    if not isinstance(found, keras.layers.Embedding):
        raise ConfigError(f"fit_stream: dynamic_ids layer {layer!r} is a {type(found).__name__}; dynamic rows are for "
                          "keras.layers.Embedding layers")
    if getattr(found, "quantization_mode", None) or getattr(found, "lora_enabled", False):
        raise ConfigError(f"fit_stream: dynamic_ids layer {layer!r} is quantized or has LoRA; dynamic rows need its plain table")
    return found.embeddings


def _fresh_rows(model: Any, layer: str, n: int) -> np.ndarray:
    found = model.get_layer(layer)
    var = found.embeddings
    return np.asarray(found.embeddings_initializer((n, int(var.shape[1])), dtype=var.dtype))


def _slots(opt: Any, var: Any) -> list[tuple[Any, float]]:
    """The optimizer's variables kept per weight of ``var`` (Keras names them after its path), with their start."""
    if opt is None:
        return []
    prefix = var.path.replace("/", "_") + "_"
    out = []
    for v in opt.variables:
        if tuple(v.shape) == tuple(var.shape) and v.name.startswith(prefix):
            start = float(getattr(opt, "initial_accumulator_value", 0.0)) if v.name.endswith("accumulator") else 0.0
            out.append((v, start))
    return out
