import numpy as np
import pytest
from helpers import wait_until

from sparkdl_train.data.batching import num_rows, rebatch, rows_to_chunks


def _chunks(n, sizes):
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    y = np.arange(n)
    out, s = [], 0
    for k in sizes:
        out.append((x[s : s + k], y[s : s + k], None))
        s += k
    return out


def test_rebatch_preserves_order_and_sizes_without_shuffle():
    batches = list(rebatch(_chunks(23, [5, 0, 7, 11]), 4))
    assert [num_rows(b) for b in batches] == [4, 4, 4, 4, 4, 3]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), np.arange(23))


def test_rebatch_shuffles_within_buffer_and_keeps_every_row_once():
    rng = np.random.default_rng(0)
    batches = list(rebatch(_chunks(100, [30, 30, 40]), 8, shuffle=True, buffer_rows=32, rng=rng))
    sizes = [num_rows(b) for b in batches]
    assert all(s == 8 for s in sizes[:-1]) and sum(sizes) == 100
    seen = np.concatenate([b[1] for b in batches])
    assert sorted(seen.tolist()) == list(range(100))
    assert not np.array_equal(seen, np.arange(100))
    # x and y stay aligned through the permutation
    for b in batches:
        np.testing.assert_array_equal(b[0][:, 0], b[1].astype(np.float32))


def test_rebatch_is_streaming():
    consumed = []

    def source():
        for i, c in enumerate(_chunks(1000, [100] * 10)):
            consumed.append(i)
            yield c

    it = rebatch(source(), 50)
    next(it)
    assert consumed == [0]  # one chunk pulled for the first batch, not the whole partition


def test_rows_to_chunks_formats():
    rows = [(np.full(3, i, np.float32), i) for i in range(5)]
    (x, y, w), (x2, y2, _) = list(rows_to_chunks(iter(rows), 3))
    assert x.shape == (3, 3) and y.tolist() == [0, 1, 2] and w is None and x2.shape == (2, 3)
    weighted = [(np.zeros(2), 1.0, 0.5)] * 4
    (_, _, w), = list(rows_to_chunks(weighted, 10))
    assert w.tolist() == [0.5] * 4
    multi = [((np.zeros(2), np.ones(3)), 1)] * 2
    (x, _, _), = list(rows_to_chunks(multi, 10))
    assert isinstance(x, list) and x[0].shape == (2, 2) and x[1].shape == (2, 3)
    named = [({"a": np.zeros(2), "b": 1}, 0)] * 3
    (x, _, _), = list(rows_to_chunks(named, 10))
    assert x["a"].shape == (3, 2) and x["b"].shape == (3,)
    with pytest.raises(ValueError, match=r"\(x, y\)"):
        list(rows_to_chunks([np.zeros(3)], 10))
    with pytest.raises(ValueError, match="different shapes"):
        list(rows_to_chunks([(np.zeros(2), 0), (np.zeros(3), 1)], 10))


# -- prefetch (pure) ---------------------------------------------------------------------------

def test_prefetch_keeps_order_bounds_the_queue_and_reraises_in_the_consumer():
    import threading

    from sparkdl_train.data.prefetch import prefetch

    produced = []

    def items(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"bad row {i}")
            produced.append(i)
            yield i

    assert list(prefetch(items(50), depth=3)) == list(range(50))
    # a slow consumer: the producer runs at most depth (+1 in hand) items ahead
    produced.clear()
    it = prefetch(items(100), depth=3)
    assert next(it) == 0
    wait_until(lambda: len(produced) >= 4, what="the producer to fill its queue")  # depth 3 + the one in hand
    assert len(produced) <= 5
    it.close()  # the consumer stops early: so does the producer thread
    wait_until(lambda: not any(t.name == "sparkdl_train-prefetch" for t in threading.enumerate()), what="the producer to stop")
    assert len(produced) <= 6
    with pytest.raises(ValueError, match="bad row 7"):
        list(prefetch(items(20, fail_at=7), depth=2))
    assert list(prefetch(iter([1, 2]), depth=0)) == [1, 2]


def test_stack_batches_keeps_structure_and_a_single_batch_is_a_view():
    from sparkdl_train.data.batching import stack_batches

    a = ({"ids": np.arange(6).reshape(3, 2), "x": np.ones((3, 4), np.float32)}, np.arange(3), None)
    b = ({"ids": np.arange(6, 12).reshape(3, 2), "x": np.zeros((3, 4), np.float32)}, np.arange(3, 6), None)
    (x, y, w) = stack_batches([a, b])
    assert x["ids"].shape == (2, 3, 2) and x["x"].shape == (2, 3, 4) and y.shape == (2, 3) and w is None
    np.testing.assert_array_equal(x["ids"][1], b[0]["ids"])
    np.testing.assert_array_equal(y, [[0, 1, 2], [3, 4, 5]])
    one = stack_batches([([a[0]["x"], a[1]], a[1], a[1])])
    assert one[0][0].shape == (1, 3, 4) and isinstance(one[0], list)
    assert np.shares_memory(one[0][0], a[0]["x"])  # no copy of a lone batch
