"""numpy arrays to and from ``pyspark.mllib.linalg`` vectors and matrices (``elephas.mllib.adapter``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import DataError


def to_vector(array: Any) -> Any:
    """A dense MLlib ``Vector`` from a one-dimensional array."""
    from pyspark.mllib.linalg import Vectors

    array = np.asarray(array)
    if array.ndim != 1:
        raise DataError(f"an MLlib Vector is made from a one-dimensional array; got shape {array.shape}")
    return Vectors.dense(array)


def from_vector(vector: Any) -> np.ndarray:
    """An MLlib (or ML) ``Vector`` as a numpy array."""
    return vector.toArray()


def to_matrix(array: Any) -> Any:
    """A dense MLlib ``Matrix`` from a two-dimensional array (same rows and columns)."""
    from pyspark.mllib.linalg import Matrices

    array = np.asarray(array)
    if array.ndim != 2:
        raise DataError(f"an MLlib Matrix is made from a two-dimensional array; got shape {array.shape}")
    rows, cols = array.shape
    return Matrices.dense(rows, cols, array.ravel(order="F"))  # MLlib matrices are column-major


def from_matrix(matrix: Any) -> np.ndarray:
    """An MLlib ``Matrix`` as a two-dimensional numpy array."""
    return matrix.toArray()
