"""Turning what the user passed (DataFrame, RDD, arrays) into a DataAdapter."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.adapters import ArrayAdapter, DataAdapter, DataFrameAdapter, RDDAdapter, is_dataframe, is_rdd
from ..data.rdd import CONNECT_DATAFRAME
from ..data.spec import resolve_columns
from ..data.transform import BatchTransform
from ..errors import DataError
from ..model_io import input_infos
from .connect import active_connect_session


def make_adapter(
    data: Any,
    model: Any,
    *,
    labelled: bool,
    feature_cols: Any = "features",
    label_col: Any = "label",
    sample_weight_col: str | None = None,
    chunk_rows: int = 1024,
    what: str = "data",
    transform: BatchTransform | None = None,
) -> DataAdapter:
    """``transform`` applies to DataFrames; arrays and RDD elements are taken as the model's inputs
    (map an RDD with ``rdd.map`` instead: its elements are already Python objects)."""
    if isinstance(data, DataAdapter):
        return data
    if is_dataframe(data):
        mapping = resolve_columns(input_infos(model), feature_cols, label_col, sample_weight_col, with_labels=labelled)
        if transform is not None:
            mapping = mapping.with_transform(transform, data.columns)
        return DataFrameAdapter(data, mapping)
    if is_rdd(data):
        return RDDAdapter(data, labelled=labelled)
    if isinstance(data, tuple) and labelled and len(data) in (2, 3):
        x, y, *w = data
        arrays = ArrayAdapter(x, np.asarray(y), np.asarray(w[0]) if w else None, chunk_rows=chunk_rows)
        return arrays
    if isinstance(data, (np.ndarray, list, dict)) and not labelled:
        return ArrayAdapter(data, chunk_rows=chunk_rows)
    if active_connect_session() is not None:
        raise DataError(f"{what}: {CONNECT_DATAFRAME}; got {type(data).__module__}.{type(data).__name__}")
    if labelled:
        expected = "a DataFrame, an RDD of (x, y) rows or a tuple (x, y[, sample_weight]) of arrays"
    else:
        expected = "a DataFrame, an RDD of feature rows or an array"
    raise DataError(f"{what} must be {expected}; got {type(data).__module__}.{type(data).__name__}")
