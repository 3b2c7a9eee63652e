"""Model outputs -> Arrow columns for ``predict`` (pure pyarrow/numpy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class OutputColumn:
    """One prediction column: which model output (key) and its per-row rank.

    Rank 0 (a scalar per row, including shape ``(n, 1)``) becomes a double
    column, so Spark ML evaluators accept it directly; rank r >= 1 becomes
    r nested arrays of floats.
    """

    name: str
    key: Any  # None: the single output; int: list position; str: dict key
    rank: int

    def select(self, outputs: Any) -> np.ndarray:
        return outputs if self.key is None else outputs[self.key]

    def to_arrow(self, outputs: Any) -> pa.Array:
        a = np.asarray(self.select(outputs))
        n = a.shape[0]
        if self.rank == 0:
            return pa.array(a.reshape(n).astype(np.float64, copy=False), type=pa.float64())
        return _nested(a.astype(np.float32, copy=False))

    def spark_type(self):
        from pyspark.sql import types as T

        if self.rank == 0:
            return T.DoubleType()
        t = T.FloatType()
        for _ in range(self.rank):
            t = T.ArrayType(t, containsNull=False)
        return t


def _nested(a: np.ndarray) -> pa.Array:
    if a.ndim == 1:
        return pa.array(a, type=pa.float32())
    n, width = a.shape[0], a.shape[1]
    inner = _nested(a.reshape((n * width,) + a.shape[2:]))
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, inner)


def output_columns(sample_outputs: Any, prediction_col: str) -> list[OutputColumn]:
    """Columns for a model whose outputs on a sample batch are ``sample_outputs``."""

    def rank(a: Any) -> int:
        shape = np.shape(a)[1:]
        return 0 if shape in ((), (1,)) else len(shape)

    if isinstance(sample_outputs, dict):
        return [OutputColumn(f"{prediction_col}_{k}", k, rank(v)) for k, v in sample_outputs.items()]
    if isinstance(sample_outputs, (list, tuple)):
        return [OutputColumn(f"{prediction_col}_{i}", i, rank(v)) for i, v in enumerate(sample_outputs)]
    return [OutputColumn(prediction_col, None, rank(sample_outputs))]
