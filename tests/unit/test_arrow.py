import numpy as np
import pyarrow as pa
import pytest

from sparkdl_train.data.arrow import column_to_numpy
from sparkdl_train.errors import DataError


def _vector_array(rows):
    """Spark ML vector struct: (type, size, indices, values); type 0 sparse, 1 dense."""
    t = pa.struct([
        pa.field("type", pa.int8(), nullable=False), pa.field("size", pa.int32()),
        pa.field("indices", pa.list_(pa.field("element", pa.int32(), nullable=False))),
        pa.field("values", pa.list_(pa.field("element", pa.float64(), nullable=False))),
    ])
    return pa.array(rows, type=t)


def test_scalars_bools_and_arrays():
    np.testing.assert_array_equal(column_to_numpy(pa.array([1.5, 2.5]), "a"), [1.5, 2.5])
    np.testing.assert_array_equal(column_to_numpy(pa.array([True, False]), "b"), [1, 0])
    arr = column_to_numpy(pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.float32())), "c")
    assert arr.shape == (2, 3) and arr.dtype == np.float32
    nested = column_to_numpy(pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]]), "d")
    assert nested.shape == (2, 2, 2) and nested[1, 1, 0] == 7
    fixed = column_to_numpy(pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6.0)), 3), "e")
    assert fixed.shape == (2, 3)
    sliced = column_to_numpy(pa.array([[1, 2], [3, 4], [5, 6]]).slice(1, 2), "f")
    np.testing.assert_array_equal(sliced, [[3, 4], [5, 6]])


def test_chunked_columns_are_combined():
    ch = pa.chunked_array([pa.array([1.0]), pa.array([2.0, 3.0])])
    np.testing.assert_array_equal(column_to_numpy(ch, "a"), [1, 2, 3])


def test_dense_and_sparse_vectors():
    rows = [
        {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
        {"type": 0, "size": 3, "indices": [2], "values": [9.0]},
        {"type": 0, "size": 3, "indices": [0, 1], "values": [4.0, 5.0]},
    ]
    out = column_to_numpy(_vector_array(rows), "v")
    np.testing.assert_array_equal(out, [[1, 2, 3], [0, 0, 9], [4, 5, 0]])
    all_dense = column_to_numpy(_vector_array(rows[:1] * 2), "v")
    assert all_dense.shape == (2, 3)


def test_errors_name_the_column():
    with pytest.raises(DataError, match="'n'.*null"):
        column_to_numpy(pa.array([1.0, None]), "n")
    with pytest.raises(DataError, match="'r' is ragged"):
        column_to_numpy(pa.array([[1.0, 2.0], [3.0]]), "r")
    with pytest.raises(DataError, match="'s' has type string"):
        column_to_numpy(pa.array(["a"]), "s")
    bad = [{"type": 0, "size": 2, "indices": [5], "values": [1.0]}]
    with pytest.raises(DataError, match="'v' has an index outside"):
        column_to_numpy(_vector_array(bad), "v")
