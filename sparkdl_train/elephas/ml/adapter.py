"""numpy arrays and RDDs to and from DataFrames (``elephas.ml.adapter``).

Differences from Elephas, both deliberate: ``to_data_frame`` makes a ``pyspark.ml`` vector column
(what Spark ML stages such as ``StandardScaler`` accept; Elephas made MLlib vectors, which
sparkdl_train also reads), and regression labels keep their fractions (Elephas' ``from_data_frame``
truncated them to integers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import DataError
from ..utils.rdd_utils import encode_label

__all__ = ["df_to_simple_rdd", "from_data_frame", "to_data_frame"]


def to_data_frame(sc: Any, features: Any, labels: Any, categorical: bool = False) -> Any:
    """A DataFrame of ``features`` (ML vector) and ``label`` (double; the argmax of one-hot rows when ``categorical``)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DoubleType, StructField, StructType

    from ..utils.rdd_utils import to_labeled_point

    schema = StructType([StructField("features", VectorUDT(), False), StructField("label", DoubleType(), False)])
    points = to_labeled_point(sc, features, labels, categorical)
    rows = points.map(lambda lp: (lp.features.asML(), float(lp.label)))
    return SparkSession.builder.getOrCreate().createDataFrame(rows, schema)


def _as_array(value: Any) -> np.ndarray:
    return value.toArray() if hasattr(value, "toArray") else np.asarray(value, dtype=np.float64)


def df_to_simple_rdd(df: Any, categorical: bool = False, nb_classes: int | None = None,
                     features_col: str = "features", label_col: str = "label") -> Any:
    """An RDD of ``(features array, label)`` rows from two DataFrame columns (labels one-hot when ``categorical``)."""
    for col in (features_col, label_col):
        if col not in df.columns:
            raise DataError(f"column {col!r} is not in the DataFrame (columns: {df.columns})")
    pairs = df.select(features_col, label_col).rdd.map(lambda row: (_as_array(row[0]), row[1]))
    if not categorical:
        return pairs
    if not nb_classes:
        nb_classes = int(pairs.map(lambda p: p[1]).max()) + 1
    n = nb_classes
    return pairs.map(lambda p: (p[0], encode_label(p[1], n)))


def from_data_frame(df: Any, categorical: bool = False, nb_classes: int | None = None,
                    features_col: str = "features", label_col: str = "label") -> tuple[np.ndarray, np.ndarray]:
    """Collect a DataFrame's features and labels into numpy arrays (labels one-hot when ``categorical``)."""
    pairs = df_to_simple_rdd(df, categorical, nb_classes, features_col, label_col).collect()
    if not pairs:
        raise DataError("the DataFrame is empty")
    return np.stack([x for x, _ in pairs]), np.array([y for _, y in pairs], dtype=np.float64)
