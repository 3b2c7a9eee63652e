"""Elephas-compatible helpers for RDDs of ``(x, y)`` rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DataError

CONNECT_DATAFRAME = (
    "a Spark Connect session has no RDDs (no SparkContext): pass the data as a DataFrame, e.g. "
    "spark.createDataFrame(pandas.DataFrame({'features': list(x), 'label': y})), with feature_cols/label_col naming its columns"
)


def to_simple_rdd(sc: Any, features: np.ndarray, labels: np.ndarray, num_slices: int | None = None) -> Any:
    """An RDD of ``(x_row, y_row)`` pairs from two arrays of the same length.

    Rows are sliced lazily per partition (``numSlices`` of them), so the driver
    ships each partition's arrays once rather than one pickled object per row.
    """
    from .sessions import is_connect_session

    if is_connect_session(sc) or is_connect_session(getattr(sc, "session", None)):
        raise DataError(CONNECT_DATAFRAME)
    features = np.asarray(features)
    labels = np.asarray(labels)
    if len(features) != len(labels):
        raise DataError(f"features has {len(features)} rows but labels has {len(labels)}")
    n = len(features)
    slices = num_slices or sc.defaultParallelism
    edges = np.linspace(0, n, slices + 1).astype(int)
    blocks = [(features[lo:hi], labels[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]

    def rows(block):
        x, y = block
        return zip(x, y)

    return sc.parallelize(blocks, len(blocks)).flatMap(rows)
