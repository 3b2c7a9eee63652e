"""Arrow record batches -> numpy, column by column, without per-row Python objects.

Supported column types: numeric and boolean scalars, (nested) arrays of numbers
with one length per row, and Spark ML vectors (dense and sparse). Nulls, ragged
arrays and non-numeric types raise :class:`~sparkdl_train.errors.DataError`
naming the column.

Binary and string columns (image bytes, text, raw ids) have no numeric form:
:func:`column_values` gives them as numpy object arrays of ``bytes`` / ``str`` (the
one Python object per row that a decoder or a Keras string input needs), built
by Arrow's own conversion from its offset and data buffers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import DataError

_VECTOR_FIELDS = ("type", "size", "indices", "values")


def is_vector_type(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) and tuple(t.field(i).name for i in range(t.num_fields)) == _VECTOR_FIELDS


def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def _list_to_numpy(arr: pa.Array, name: str) -> np.ndarray:
    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        flat = arr.flatten()
        inner = _to_numpy(flat, name)
        return inner.reshape((n, width) + inner.shape[1:])
    offsets = arr.offsets.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    if n and (lengths != lengths[0]).any():
        bad = int(np.flatnonzero(lengths != lengths[0])[0])
        raise DataError(
            f"column {name!r} is ragged: row 0 has {int(lengths[0])} elements but row {bad} has "
            f"{int(lengths[bad])}; every row of an array column must have the same length"
        )
    width = int(lengths[0]) if n else 0
    flat = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if n else arr.values.slice(0, 0)
    inner = _to_numpy(flat, name)
    return inner.reshape((n, width) + inner.shape[1:])


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(start, start + count)`` for every pair, vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    exclusive = np.cumsum(counts) - counts
    return np.repeat(starts - exclusive, counts) + np.arange(total)


def _vector_to_numpy(arr: pa.StructArray, name: str) -> np.ndarray:
    n = len(arr)
    kinds = arr.field("type").to_numpy(zero_copy_only=False)
    values = arr.field("values")
    if n and (kinds == 1).all():  # all dense
        return _list_to_numpy(values, name).astype(np.float64, copy=False)
    sizes = arr.field("size").to_numpy(zero_copy_only=False)
    dense_rows = kinds == 1
    val_off = values.offsets.to_numpy(zero_copy_only=False)
    val_len = np.diff(val_off)
    widths = np.where(dense_rows, val_len, np.nan_to_num(sizes.astype(np.float64), nan=-1)).astype(np.int64)
    if n and (widths != widths[0]).any():
        raise DataError(f"vector column {name!r} mixes vectors of different sizes {sorted(set(widths.tolist()))[:5]}")
    width = int(widths[0]) if n else 0
    out = np.zeros((n, width), dtype=np.float64)
    flat_vals = values.values.to_numpy(zero_copy_only=False)
    idx = arr.field("indices")
    idx_off = idx.offsets.to_numpy(zero_copy_only=False)
    flat_idx = idx.values.to_numpy(zero_copy_only=False)
    rows = np.arange(n)
    # dense rows: contiguous values
    if dense_rows.any():
        d = rows[dense_rows]
        starts = val_off[:-1][dense_rows]
        gather = starts[:, None] + np.arange(width)[None, :]
        out[d] = flat_vals[gather]
    sparse_rows = ~dense_rows
    if sparse_rows.any():
        s = rows[sparse_rows]
        counts = (idx_off[1:] - idx_off[:-1])[sparse_rows]
        row_ids = np.repeat(s, counts)
        cols = flat_idx[_ranges(idx_off[:-1][sparse_rows], counts)]
        if len(cols) and (cols.min() < 0 or cols.max() >= width):
            raise DataError(f"vector column {name!r} has an index outside [0, {width})")
        out[row_ids, cols] = flat_vals[_ranges(val_off[:-1][sparse_rows], counts)]
    return out


def _to_numpy(arr: pa.Array, name: str) -> np.ndarray:
    t = arr.type
    if arr.null_count:
        raise DataError(f"column {name!r} contains {arr.null_count} null value(s); fill or drop them before training")
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(t):
        return arr.to_numpy(zero_copy_only=False).astype(np.int8)
    if pa.types.is_decimal(t):
        return arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _list_to_numpy(arr, name)
    if is_vector_type(t):
        return _vector_to_numpy(arr, name)
    raise DataError(f"column {name!r} has type {t}, which is not numeric; only numbers, arrays of numbers and ML vectors can be fed to a model")


def column_to_numpy(arr: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """Convert one Arrow column to a numpy array of shape ``(rows, ...)``."""
    return _to_numpy(_combine(arr), name)


def is_text_type(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t)


def is_bytes_type(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or getattr(
        pa.types, "is_binary_view", lambda _: False)(t)


def _text_to_numpy(arr: pa.Array, name: str) -> np.ndarray:
    if arr.null_count:
        first = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(
            f"column {name!r} contains {arr.null_count} null value(s) (first at row {first} of its batch); "
            "fill them (e.g. df.fillna('', subset=[...])) or filter them before training"
        )
    out = arr.to_numpy(zero_copy_only=False)
    return out if out.dtype == object else out.astype(object)


def column_values(arr: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """Like :func:`column_to_numpy`, and also binary / string columns, as object arrays of
    ``bytes`` / ``str`` (``(rows,)``), or lists of them (``(rows, width)``)."""
    arr = _combine(arr)
    t = arr.type
    if is_text_type(t) or is_bytes_type(t):
        return _text_to_numpy(arr, name)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (is_text_type(t.value_type) or is_bytes_type(t.value_type)):
        if arr.null_count:
            raise DataError(f"column {name!r} contains {arr.null_count} null array(s); fill or drop them before training")
        offsets = arr.offsets.to_numpy(zero_copy_only=False)
        lengths = np.diff(offsets)
        if len(arr) and (lengths != lengths[0]).any():
            bad = int(np.flatnonzero(lengths != lengths[0])[0])
            raise DataError(f"column {name!r} is ragged: row 0 has {int(lengths[0])} elements but row {bad} has {int(lengths[bad])}")
        flat = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if len(arr) else arr.values.slice(0, 0)
        return _text_to_numpy(flat, name).reshape(len(arr), int(lengths[0]) if len(arr) else 0)
    return _to_numpy(arr, name)
