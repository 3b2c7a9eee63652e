"""Which DataFrame columns feed which model input, and how they become tensors.

``feature_cols`` may be

* a column name: the model's single input (scalar, array or ML vector column);
* a list of names: for a single-input model the columns are concatenated along
  the feature axis; for a model with *k* inputs it must have *k* entries (each a
  name or a list of names) mapped to the inputs in order;
* a dict ``{input_name: column or [columns]}`` for named multi-input models.

Defaults follow Spark ML: ``feature_cols="features"``, ``label_col="label"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from ..errors import DataError
from .arrow import column_to_numpy
from .batching import Batch

ColumnsArg = "str | Sequence[str | Sequence[str]] | dict[str, str | Sequence[str]]"


@dataclass(frozen=True)
class InputInfo:
    """What the model says about one of its inputs (shape excludes the batch axis)."""

    name: str
    shape: tuple[int | None, ...] | None
    dtype: str


@dataclass(frozen=True)
class TensorSpec:
    """One tensor built from one or more columns."""

    name: str
    columns: tuple[str, ...]
    dtype: str = "float32"
    shape: tuple[int | None, ...] | None = None

    def describe(self) -> str:
        cols = self.columns[0] if len(self.columns) == 1 else list(self.columns)
        return f"{self.name!r} (column {cols!r})" if len(self.columns) == 1 else f"{self.name!r} (columns {cols!r})"

    def from_arrow(self, rb: pa.RecordBatch) -> np.ndarray:
        arrays = [column_to_numpy(rb.column(c), c) for c in self.columns]
        return self.assemble(arrays, rb.num_rows)

    def assemble(self, arrays: list[np.ndarray], n: int) -> np.ndarray:
        if len(arrays) == 1:
            a = arrays[0]
        else:
            a = np.concatenate([x.reshape(n, -1) for x in arrays], axis=1)
        a = a.astype(self.dtype, copy=False)
        return self._fit_shape(a, n)

    def _fit_shape(self, a: np.ndarray, n: int) -> np.ndarray:
        if self.shape is None:
            return a
        got = a.shape[1:]
        if None not in self.shape:
            want = tuple(int(s) for s in self.shape)
            if got == want:
                return a
            if int(np.prod(got, dtype=np.int64)) == int(np.prod(want, dtype=np.int64)):
                return a.reshape((n,) + want)
        elif len(got) == len(self.shape) and all(w is None or w == g for w, g in zip(self.shape, got)):
            return a
        elif len(got) == 0 and len(self.shape) == 1:
            return a.reshape(n, 1)
        raise DataError(
            f"input {self.describe()} gives rows of shape {got}, but the model expects {tuple(self.shape)}"
        )


@dataclass(frozen=True)
class ColumnMapping:
    inputs: tuple[TensorSpec, ...]
    structure: str  # "single" | "list" | "dict"
    label: TensorSpec | None = None
    sample_weight: TensorSpec | None = None

    def feature_columns(self) -> list[str]:
        return _unique(c for spec in self.inputs for c in spec.columns)

    def columns(self) -> list[str]:
        extra = [c for spec in (self.label, self.sample_weight) if spec is not None for c in spec.columns]
        return _unique([*self.feature_columns(), *extra])

    def without_labels(self) -> "ColumnMapping":
        return ColumnMapping(self.inputs, self.structure)

    def x_from_arrow(self, rb: pa.RecordBatch) -> Any:
        tensors = [spec.from_arrow(rb) for spec in self.inputs]
        if self.structure == "single":
            return tensors[0]
        if self.structure == "dict":
            return {spec.name: t for spec, t in zip(self.inputs, tensors)}
        return tensors

    def batch_from_arrow(self, rb: pa.RecordBatch) -> Batch:
        x = self.x_from_arrow(rb)
        y = self.label.from_arrow(rb) if self.label is not None else None
        w = self.sample_weight.from_arrow(rb) if self.sample_weight is not None else None
        return (x, y, w)


def _unique(items) -> list[str]:
    seen: dict[str, None] = {}
    for c in items:
        seen.setdefault(c, None)
    return list(seen)


def _as_columns(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, str) for c in value):
        return tuple(value)
    raise DataError(f"{what} must be a column name or a non-empty list of column names, got {value!r}")


def resolve_columns(
    inputs: Sequence[InputInfo] | None,
    feature_cols: Any = "features",
    label_col: Any = "label",
    sample_weight_col: str | None = None,
    with_labels: bool = True,
) -> ColumnMapping:
    """Build the mapping, checking it against the model's inputs (when known)."""
    if feature_cols is None:
        feature_cols = "features"
    n_inputs = len(inputs) if inputs else None

    def spec(info: InputInfo | None, cols: tuple[str, ...], default_name: str) -> TensorSpec:
        if info is None:
            return TensorSpec(default_name, cols)
        dtype = info.dtype if np.dtype(info.dtype).kind in "biuf" else "float32"
        return TensorSpec(info.name, cols, dtype, info.shape)

    if isinstance(feature_cols, dict):
        if n_inputs is None:
            raise DataError("feature_cols is a dict but the model's input names are unknown (build the model first)")
        names = [i.name for i in inputs]
        missing = [n for n in names if n not in feature_cols]
        extra = [k for k in feature_cols if k not in names]
        if missing or extra:
            raise DataError(
                f"feature_cols keys must be the model's input names {names}; "
                f"missing {missing}, unknown {extra}"
            )
        specs = tuple(spec(i, _as_columns(feature_cols[i.name], f"feature_cols[{i.name!r}]"), i.name) for i in inputs)
        structure = "dict"
    elif isinstance(feature_cols, str) or (
        isinstance(feature_cols, (list, tuple)) and (n_inputs in (None, 1)) and all(isinstance(c, str) for c in feature_cols)
    ):
        if n_inputs is not None and n_inputs > 1:
            raise DataError(
                f"the model has {n_inputs} inputs {[i.name for i in inputs]}; pass feature_cols as a list "
                f"with one entry per input or a dict keyed by input name, not {feature_cols!r}"
            )
        info = inputs[0] if inputs else None
        specs = (spec(info, _as_columns(feature_cols, "feature_cols"), "features"),)
        structure = "single"
    elif isinstance(feature_cols, (list, tuple)):
        if n_inputs is not None and len(feature_cols) != n_inputs:
            raise DataError(
                f"feature_cols has {len(feature_cols)} entries but the model has {n_inputs} inputs "
                f"{[i.name for i in inputs]}"
            )
        specs = tuple(
            spec(inputs[k] if inputs else None, _as_columns(c, f"feature_cols[{k}]"), f"input_{k}")
            for k, c in enumerate(feature_cols)
        )
        structure = "list"
    else:
        raise DataError(f"feature_cols must be a column name, a list or a dict, got {type(feature_cols).__name__}")

    label = sample_weight = None
    if with_labels:
        if label_col is None:
            raise DataError("label_col is required to train or evaluate on a DataFrame")
        label = TensorSpec("label", _as_columns(label_col, "label_col"))
        if sample_weight_col is not None:
            sample_weight = TensorSpec("sample_weight", _as_columns(sample_weight_col, "sample_weight_col"))
    return ColumnMapping(specs, structure, label, sample_weight)
