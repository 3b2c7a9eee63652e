"""Executor-side batch transforms: user code from a batch's columns to the model's inputs.

Decoding images, tokenising text or parsing raw fields is work per row that belongs on
the executors, beside the data, overlapped with training. ``fit`` / ``evaluate`` /
``predict`` (and ``KerasEstimator``) take ``transform=fn``; the contract:

* ``fn(columns) -> dict``. ``columns`` maps each column name of the DataFrame (select the
  ones it needs first: all are read) to a numpy array with one entry per row, converted
  only when ``fn`` reads it: numbers -> 1-D array; arrays and ML vectors -> 2-D array;
  binary -> object array of ``bytes``; string -> object array of ``str``; struct (Spark's
  ``image`` source) -> dict of its fields. ``columns.arrow(name)`` gives the raw Arrow
  array instead (no Python object per row). Nulls in a converted column are an error naming it.
* The returned dict adds or replaces columns: ``feature_cols``, ``label_col`` and
  ``sample_weight_col`` name its keys, and a name it does not return is read from the
  input columns (so a transform that only decodes ``content`` into ``image`` keeps
  ``label`` as it is). Its values are arrays (or lists) with one entry per row; it may
  drop rows, and then every column used must be in its output.
* It runs on the executors, on the data thread that prefetches batches while the model
  trains; ``transform_threads`` > 1 runs it on a pool of that many threads, on slices of
  ``transform_rows`` rows, keeping the order. It must be a pure function of its input
  (it runs again every epoch) and thread-safe when ``transform_threads`` > 1.
* It is shipped with cloudpickle, so what it uses must import on the executors.
* An exception inside it fails the fit with a :class:`~sparkdl_train.errors.TransformError`
  naming the partition, the row range and the original exception (chained, with its
  traceback); the driver first runs it on a few sample rows, so most mistakes fail there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, TransformError
from .arrow import column_values, is_vector_type


class ArrowColumns(Mapping):
    """A record batch's columns as numpy arrays, converted on first access."""

    def __init__(self, rb: pa.RecordBatch):
        self._rb = rb
        self._names = list(rb.schema.names)
        self._cache: dict[str, Any] = {}

    @property
    def num_rows(self) -> int:
        return self._rb.num_rows

    def arrow(self, name: str) -> pa.Array:
        """The column as Arrow holds it (no conversion, no Python object per row)."""
        return self._rb.column(self._index(name))

    def _index(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise KeyError(f"no column {name!r} in the batch; its columns are {self._names}") from None

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            self._cache[name] = _convert(self.arrow(name), name)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _convert(arr: pa.Array, name: str) -> Any:
    if pa.types.is_struct(arr.type) and not is_vector_type(arr.type):
        return {arr.type.field(i).name: _convert(arr.field(i), f"{name}.{arr.type.field(i).name}") for i in range(arr.type.num_fields)}
    return column_values(arr, name)


def _rows(value: Any) -> int:
    return len(value) if not isinstance(value, dict) else _rows(next(iter(value.values())))


@dataclass(frozen=True)
class BatchTransform:
    """The user's function and how it runs (plain data, shipped to executors)."""

    fn: Callable[[Mapping], dict]
    threads: int = 1
    rows: int = 0  # rows per call (0: one call per Arrow record batch)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"transform must be a function of the batch's columns, got {type(self.fn).__name__}")

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or type(self.fn).__name__

    def apply(self, columns: ArrowColumns, where: str) -> "Transformed":
        try:
            out = self.fn(columns)
        except Exception as exc:  # noqa: BLE001 - re-raised with where it happened, chained
            raise TransformError(f"transform {self.name} failed on {where}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, Mapping):
            raise TransformError(
                f"transform {self.name} returned {type(out).__name__} on {where}; it must return a dict of columns "
                "(e.g. {'image': array, 'label': labels})"
            )
        sizes = {}
        values = {}
        for k, v in out.items():
            if not isinstance(k, str):
                raise TransformError(f"transform {self.name} returned a non-string key {k!r} on {where}")
            v = v if isinstance(v, (np.ndarray, dict)) else np.asarray(v)
            if isinstance(v, np.ndarray) and v.ndim == 0:
                raise TransformError(f"transform {self.name} returned a scalar for {k!r} on {where}; each value needs one entry per row")
            values[k] = v
            sizes[k] = _rows(v)
        if len(set(sizes.values())) > 1:
            raise TransformError(f"transform {self.name} returned columns with different row counts on {where}: {sizes}")
        return Transformed(values, columns, next(iter(sizes.values()), columns.num_rows), self.name, where)


@dataclass
class Transformed:
    """A transform's output, falling back to the input columns for names it did not return."""

    out: dict[str, Any]
    inputs: ArrowColumns
    num_rows: int
    name: str
    where: str

    def __getitem__(self, key: str) -> Any:
        if key in self.out:
            return self.out[key]
        if key in self.inputs:
            if self.num_rows != self.inputs.num_rows:
                raise TransformError(
                    f"transform {self.name} changed the row count ({self.inputs.num_rows} -> {self.num_rows}) on "
                    f"{self.where}, so column {key!r} must be in its output (it returned {sorted(self.out)})"
                )
            return self.inputs[key]
        raise TransformError(
            f"column {key!r} is neither returned by transform {self.name} (keys {sorted(self.out)}) nor in the "
            f"DataFrame (columns {list(self.inputs)}); feature_cols, label_col and sample_weight_col name them"
        )


def slices(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first row in the stream, slice)`` of at most ``rows`` rows (zero-copy Arrow slices)."""
    offset = 0
    for rb in batches:
        step = rows or rb.num_rows or 1
        for start in range(0, rb.num_rows, step):
            yield offset + start, rb.slice(start, step)
        offset += rb.num_rows
