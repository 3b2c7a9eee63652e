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
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..errors import DataError
from .arrow import column_to_numpy, column_values
from .batching import Batch
from .prefetch import ordered_map
from .transform import ArrowColumns, BatchTransform, slices

STRING = "string"  # a Keras string input: fed as an object array of str / bytes

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
        convert = column_values if self.dtype == STRING else column_to_numpy
        arrays = [convert(rb.column(c), c) for c in self.columns]
        return self.assemble(arrays, rb.num_rows)

    def from_columns(self, get: Callable[[str], Any], n: int, where: str) -> np.ndarray:
        """The tensor from a transform's output (``get(column)``), checked against the model."""
        arrays = []
        for c in self.columns:
            a = get(c)
            if isinstance(a, dict):
                raise DataError(f"{where}: column {c!r} (for {self.describe()}) is a struct; return an array for it")
            arrays.append(np.asarray(a))
        return self.assemble(arrays, n, where)

    def assemble(self, arrays: list[np.ndarray], n: int, where: str | None = None) -> np.ndarray:
        if len(arrays) == 1:
            a = arrays[0]
        else:
            a = np.concatenate([x.reshape(n, -1) for x in arrays], axis=1)
        a = self._cast(a, where)
        return self._fit_shape(a, n, where)

    def empty(self, shapes: "dict[str, tuple[int, ...] | None]") -> np.ndarray | None:
        """The tensor of zero rows whose row shape and dtype :meth:`assemble` gives every batch of
        valid data, known before any data is read: ``shapes`` holds each column's row shape as its
        type fixes it (``()`` for a scalar, ``None`` where only the data tells: arrays, vectors).
        ``None`` when only the data can tell, or when the types already contradict the model (the
        driver's sample check then names the problem)."""
        got = [shapes.get(c) for c in self.columns]
        if any(g is None for g in got):
            row = None
        elif len(got) == 1:
            row = got[0]
        else:  # columns concatenated along the feature axis
            row = (sum(int(np.prod(g, dtype=np.int64)) for g in got),)
        if self.shape is not None and None not in self.shape:
            want = tuple(int(s) for s in self.shape)
            if row is not None and int(np.prod(row, dtype=np.int64)) != int(np.prod(want, dtype=np.int64)):
                return None
            row = want
        elif row is None:
            return None
        elif self.shape is not None:
            if len(row) == 0 and len(self.shape) == 1:
                row = (1,)
            elif len(row) != len(self.shape) or any(w is not None and w != g for w, g in zip(self.shape, row)):
                return None
        return np.empty((0,) + tuple(row), dtype=object if self.dtype == STRING else np.dtype(self.dtype))

    def _cast(self, a: np.ndarray, where: str | None) -> np.ndarray:
        source = f" ({where})" if where else ""
        if self.dtype == STRING:
            if a.dtype.kind not in "OUS":
                raise DataError(f"input {self.describe()}{source} is a string input, but the data has dtype {a.dtype}")
            return a
        if a.dtype.kind in "OUSV":
            first = a.flat[0] if a.size else None
            what = "bytes" if a.dtype.kind == "S" or isinstance(first, bytes) else "strings" if isinstance(first, str) else f"dtype {a.dtype}"
            raise DataError(
                f"input {self.describe()}{source} must be numeric ({self.dtype}) but holds {what}: decode it with a "
                "transform (fit(..., transform=fn)) or give the model a string input"
            )
        return a.astype(self.dtype, copy=False)

    def _fit_shape(self, a: np.ndarray, n: int, where: str | None = None) -> np.ndarray:
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
        source = f" ({where})" if where else ""
        raise DataError(
            f"input {self.describe()}{source} gives rows of shape {got}, but the model expects {tuple(self.shape)}"
        )


@dataclass(frozen=True)
class LabelsPerOutput:
    """Labels of a model with several outputs: ``label_col={"output name": column(s), ...}`` gives ``y`` as a
    dict keyed by output name, as ``model.fit`` takes it (each output's loss and metrics get their labels)."""

    specs: tuple[TensorSpec, ...]
    name: str = "label"
    dtype: str = "float32"

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(_unique(c for spec in self.specs for c in spec.columns))

    def describe(self) -> str:
        return "labels " + ", ".join(spec.describe() for spec in self.specs)

    def from_arrow(self, rb: pa.RecordBatch) -> dict[str, np.ndarray]:
        return {spec.name: spec.from_arrow(rb) for spec in self.specs}

    def from_columns(self, get: Callable[[str], Any], n: int, where: str) -> dict[str, np.ndarray]:
        return {spec.name: spec.from_columns(get, n, where) for spec in self.specs}

    def empty(self, shapes: "dict[str, tuple[int, ...] | None]") -> dict[str, np.ndarray] | None:
        parts = {spec.name: spec.empty(shapes) for spec in self.specs}
        return None if any(p is None for p in parts.values()) else parts


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns make which tensors; with a ``transform``, the names are the transform's
    output keys (falling back to the DataFrame's columns) and ``source`` lists the DataFrame
    columns the transform is handed (:mod:`sparkdl_train.data.transform`)."""

    inputs: tuple[TensorSpec, ...]
    structure: str  # "single" | "list" | "dict"
    label: TensorSpec | LabelsPerOutput | None = None
    sample_weight: TensorSpec | None = None
    transform: BatchTransform | None = None
    source: tuple[str, ...] = ()

    def feature_columns(self) -> list[str]:
        return _unique(c for spec in self.inputs for c in spec.columns)

    def columns(self) -> list[str]:
        """The DataFrame columns to read."""
        if self.transform is not None:
            return list(self.source)
        extra = [c for spec in (self.label, self.sample_weight) if spec is not None for c in spec.columns]
        return _unique([*self.feature_columns(), *extra])

    def without_labels(self) -> "ColumnMapping":
        return ColumnMapping(self.inputs, self.structure, transform=self.transform, source=self.source)

    def with_transform(self, transform: BatchTransform | None, source: Sequence[str]) -> "ColumnMapping":
        return ColumnMapping(self.inputs, self.structure, self.label, self.sample_weight, transform, tuple(source))

    def _structure(self, tensors: list[np.ndarray]) -> Any:
        if self.structure == "single":
            return tensors[0]
        if self.structure == "dict":
            return {spec.name: t for spec, t in zip(self.inputs, tensors)}
        return tensors

    def x_from_arrow(self, rb: pa.RecordBatch, where: str = "the batch") -> Any:
        if self.transform is not None:
            return self._from_transformed(rb, where, labels=False)[0]
        return self._structure([spec.from_arrow(rb) for spec in self.inputs])

    def batch_from_arrow(self, rb: pa.RecordBatch, where: str = "the batch") -> Batch:
        if self.transform is not None:
            return self._from_transformed(rb, where, labels=True)
        x = self.x_from_arrow(rb)
        y = self.label.from_arrow(rb) if self.label is not None else None
        w = self.sample_weight.from_arrow(rb) if self.sample_weight is not None else None
        return (x, y, w)

    def empty_batch(self, shapes: "dict[str, tuple[int, ...] | None]") -> Batch | None:
        """A batch of zero rows with the structure, row shapes and dtypes every batch of valid data
        gets (:meth:`TensorSpec.empty`), from the columns' types alone; ``None`` when only the data
        (or a transform) can tell."""
        if self.transform is not None:
            return None
        x = [spec.empty(shapes) for spec in self.inputs]
        y = self.label.empty(shapes) if self.label is not None else None
        w = self.sample_weight.empty(shapes) if self.sample_weight is not None else None
        if any(t is None for t in x) or (self.label is not None and y is None) or (self.sample_weight is not None and w is None):
            return None
        return (self._structure(x), y, w)

    def _from_transformed(self, rb: pa.RecordBatch, where: str, labels: bool) -> Batch:
        t = self.transform.apply(ArrowColumns(rb), where)
        n = t.num_rows

        def build(spec: TensorSpec) -> np.ndarray:
            return spec.from_columns(t.__getitem__, n, f"output of transform {t.name} on {where}")

        x = self._structure([build(spec) for spec in self.inputs])
        y = build(self.label) if labels and self.label is not None else None
        w = build(self.sample_weight) if labels and self.sample_weight is not None else None
        return (x, y, w)

    def chunks(self, batches: Iterable[pa.RecordBatch], partition: int) -> Iterator[Batch]:
        """A partition's record batches as chunks; a transform runs on slices of ``transform.rows``
        rows, on ``transform.threads`` threads, in order."""
        if self.transform is None:
            for rb in batches:
                yield self.batch_from_arrow(rb)
            return

        def work(item: tuple[int, pa.RecordBatch]) -> Batch:
            start, rb = item
            return self.batch_from_arrow(rb, f"partition {partition}, rows {start}-{start + rb.num_rows - 1}")

        yield from ordered_map(work, slices(batches, self.transform.rows), self.transform.threads)


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
        dtype = STRING if info.dtype == STRING else info.dtype if np.dtype(info.dtype).kind in "biuf" else "float32"
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
        if isinstance(label_col, dict):  # one label per named output
            if not label_col or not all(isinstance(k, str) for k in label_col):
                raise DataError(f"label_col as a dict maps output names to columns, got {label_col!r}")
            label = LabelsPerOutput(tuple(TensorSpec(k, _as_columns(v, f"label_col[{k!r}]")) for k, v in label_col.items()))
        else:
            label = TensorSpec("label", _as_columns(label_col, "label_col"))
        if sample_weight_col is not None:
            sample_weight = TensorSpec("sample_weight", _as_columns(sample_weight_col, "sample_weight_col"))
    return ColumnMapping(specs, structure, label, sample_weight)
