import numpy as np
import pytest

from sparkdl_train.merge import Partial, WeightedMean, sum_states


def _state(rng):
    # a matrix, a vector, a 0-d float (like the optimizer's learning rate) and a 0-d counter
    return [
        rng.normal(size=(3, 4)).astype(np.float32),
        rng.normal(size=5).astype(np.float32),
        np.array(rng.normal(), dtype=np.float32),
        np.array(rng.integers(0, 100), dtype=np.int64),
    ]


def test_weighted_mean_matches_numpy_average_and_counters_take_max():
    rng = np.random.default_rng(1)
    states = [_state(rng) for _ in range(4)]
    weights = [10, 0, 3, 7]
    acc = WeightedMean()
    for s, w in zip(states, weights):
        acc = acc.merge(WeightedMean.of(s, w))
    out = acc.result()
    for i in range(3):
        want = np.average(np.stack([s[i] for s in states]), axis=0, weights=weights)
        np.testing.assert_allclose(out[i], want, rtol=1e-6)
        assert out[i].dtype == np.float32
    # integer state: max over contributing workers (the zero-weight worker is ignored)
    assert out[2].shape == ()
    assert out[3] == max(int(s[3]) for s, w in zip(states, weights) if w > 0)
    assert out[3].dtype == np.int64 and out[3].shape == ()


def test_equal_scalars_average_to_themselves():
    lr = np.array(0.003, dtype=np.float32)
    acc = WeightedMean.of([lr], 7).merge(WeightedMean.of([lr], 3)).merge(WeightedMean.of([lr], 5))
    assert acc.result()[0] == pytest.approx(0.003)


def test_merge_is_associative_and_order_free():
    rng = np.random.default_rng(2)
    parts = [WeightedMean.of(_state(rng), w) for w in (1, 2, 5)]

    def copy(p):
        return WeightedMean(p.total_weight, [a.copy() for a in p.sums], list(p.dtypes))

    left = copy(parts[0]).merge(copy(parts[1])).merge(copy(parts[2])).result()
    right = copy(parts[2]).merge(copy(parts[0]).merge(copy(parts[1]))).result()
    for a, b in zip(left, right):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_zero_total_weight_is_an_error_not_a_silent_zero_model():
    with pytest.raises(ValueError, match="zero samples"):
        WeightedMean.of([np.ones(2)], 0).result()


def test_metric_states_sum():
    a = [np.array([1.0, 2.0]), np.array(3.0)]
    b = [np.array([10.0, 20.0]), np.array(30.0)]
    out = sum_states(a, b)
    np.testing.assert_array_equal(out[0], [11, 22])
    assert sum_states(None, b) is b
    with pytest.raises(ValueError):
        sum_states(a, b[:1])


def test_partial_binary_roundtrip_and_duplicate_partition_detection():
    rng = np.random.default_rng(3)
    p = Partial(samples=12, batches=2, model=WeightedMean.of(_state(rng), 12), metrics=[np.array([4.0, 12.0])], partitions={3: {"samples": 12}})
    q = Partial.from_bytes(p.to_bytes())
    assert (q.samples, q.batches, q.partitions) == (12, 2, {3: {"samples": 12}})
    for a, b in zip(p.model.result(), q.model.result()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(q.metrics[0], [4.0, 12.0])
    empty = Partial.from_bytes(Partial(partitions={5: {"samples": 0}}).to_bytes())
    assert empty.metrics is None and empty.model.sums is None and empty.empty_partitions == [5]
    with pytest.raises(ValueError, match="reported twice"):
        q.merge(Partial(partitions={3: {"samples": 1}}))


def test_one_workers_float32_state_travels_in_half_the_bytes_and_merges_bit_for_bit():
    """A worker's partial carries its float32 arrays, not their float64 weighted sums: half the
    bytes on the wire every epoch, and the driver's merge is bit-for-bit the one of the sums."""
    rng = np.random.default_rng(4)
    big = [rng.normal(size=(200, 50)).astype(np.float32), np.array(7, dtype=np.int64)]
    other = [rng.normal(size=(200, 50)).astype(np.float32), np.array(9, dtype=np.int64)]
    one = Partial(samples=37, model=WeightedMean.of(big, 37), partitions={0: {}})
    two = Partial(samples=5, model=WeightedMean.of(other, 5), partitions={1: {}})
    sent = one.to_bytes()
    assert 200 * 50 * 4 <= len(sent) < 200 * 50 * 8  # float32 on the wire, not the float64 sums
    got = Partial.from_bytes(sent).merge(Partial.from_bytes(two.to_bytes())).model.result()
    want = WeightedMean.of(big, 37).merge(WeightedMean.of(other, 5)).result()
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    # merged partials (a tree reduce's) carry the float64 sums: rounding them would lose bits
    merged = Partial(samples=37, model=WeightedMean.of(big, 37), partitions={0: {}}).merge(
        Partial(samples=5, model=WeightedMean.of(other, 5), partitions={1: {}}))
    assert len(merged.to_bytes()) >= 200 * 50 * 8
    for a, b in zip(Partial.from_bytes(merged.to_bytes()).model.result(), want):
        np.testing.assert_array_equal(a, b)
