"""The server's row gather and scatter-add (sparkdl_train/ps/rows.py) against numpy's fancy indexing."""

import numpy as np
import pytest

from sparkdl_train.ps import rows as R
from sparkdl_train.ps.state import ServerState, SparseRows


@pytest.mark.parametrize("shape,dtype", [((50, 9), np.float32), ((50,), np.float64), ((40, 3, 2), np.float16), ((7, 1), np.float32)])
def test_scatter_add_and_gather_equal_fancy_indexing(shape, dtype):
    rng = np.random.default_rng(0)
    table = rng.normal(size=shape).astype(dtype)
    expected = table.copy()
    view = R.row_view(table)
    for n in (0, 1, 5, shape[0]):
        ids = np.sort(rng.choice(shape[0], n, replace=False))
        rows = rng.normal(size=(n, *shape[1:]))  # float64 rows into any table dtype, as a synchronous round sends
        R.scatter_add(table, view, ids, rows)
        expected[ids] = expected[ids] + rows  # added in float64, stored in the table's dtype
        np.testing.assert_array_equal(table, expected)
        want = rng.integers(0, shape[0], 2 * n)  # wanted ids may repeat and come in any order
        got = R.gather(table, want)
        np.testing.assert_array_equal(got, expected[want])
        got += 1  # a copy: the table does not change
        np.testing.assert_array_equal(table, expected)


def test_row_view_refuses_a_strided_table():
    with pytest.raises(ValueError, match="C-contiguous"):
        R.row_view(np.zeros((10, 4), np.float32)[:, :2])


def test_server_rows_after_many_pushes_equal_a_reference_sum():
    rng = np.random.default_rng(1)
    table = np.zeros((1000, 4), np.float32)
    state = ServerState([np.zeros(3, np.float32), table], "asynchronous", sparse=(1,))
    state.begin_epoch(1)
    state.join(0)
    expected = table.astype(np.float64)
    for _ in range(20):
        ids = np.unique(rng.integers(0, 1000, 300))
        rows = rng.normal(size=(len(ids), 4)).astype(np.float32)
        expected[ids] += rows
        reply = state.push(0, state.version, [np.zeros(3, np.float32), SparseRows(ids, rows)], 1, {1: ids[::-1]})
        np.testing.assert_allclose(reply.arrays[1], expected[ids[::-1]], rtol=1e-5, atol=1e-5)
        state.release(reply)
    np.testing.assert_allclose(state.snapshot()[1], expected, rtol=1e-5, atol=1e-5)
