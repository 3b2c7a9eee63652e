"""Raw ids to embedding rows, on the executors: the mapping half of ``fit_stream(dynamic_ids=...)``.

The driver decides which id holds which row (:class:`sparkdl_train.models.dynamic_ids.DynamicIds`) and ships
the held ids and their rows as two sorted arrays (a Spark broadcast); :func:`map_batches` rewrites each record
batch's id columns (integers, or arrays of integers) to rows, in the same Arrow type: an id without a row of its
own gets row 0, the shared row. Only numpy and pyarrow: nothing of the driver's is imported here.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa


def lookup(keys: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each of ``ids``' row: ``rows[i]`` where ``keys[i] == id`` (``keys`` sorted), else 0."""
    ids = np.asarray(ids, np.int64)
    if not len(keys):
        return np.zeros(ids.shape, np.int64)
    pos = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
    return np.where(keys[pos] == ids, rows[pos], 0)


def _map_array(arr: pa.Array, keys: np.ndarray, rows: np.ndarray, name: str) -> pa.Array:
    if arr.null_count:
        raise ValueError(f"column {name!r} holds null ids; give them a value (an id of their own) before training")
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        flat = arr.flatten()
        if flat.null_count:
            raise ValueError(f"column {name!r} holds arrays with null ids; give them a value before training")
        mapped = pa.array(lookup(keys, rows, flat.to_numpy(zero_copy_only=False)), flat.type)
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
        offsets = offsets - offsets[0]
        cls = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
        return cls.from_arrays(pa.array(offsets, pa.int64() if cls is pa.LargeListArray else pa.int32()), mapped,
                               type=arr.type)
    return pa.array(lookup(keys, rows, arr.to_numpy(zero_copy_only=False)), arr.type)


def map_batches(batches: Iterable[pa.RecordBatch], columns: Sequence[str], tables: Any) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: ``tables`` is a broadcast (or a plain list) of ``(keys, rows)`` per column."""
    tables = getattr(tables, "value", tables)
    for rb in batches:
        arrays = list(rb.columns)
        for name, (keys, rows) in zip(columns, tables):
            i = rb.schema.get_field_index(name)
            arrays[i] = _map_array(arrays[i], keys, rows, name)
        yield pa.RecordBatch.from_arrays(arrays, schema=rb.schema)
