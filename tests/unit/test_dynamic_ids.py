"""sparkdl_train.models.dynamic_ids without Spark: admission after k sightings, least-recently-seen eviction,
memory bounded under an id stream ten times the table's capacity, state round trip."""

import numpy as np
import pytest

from sparkdl_train.models.dynamic_ids import DynamicIds


def test_an_id_gets_a_row_after_k_sightings_and_others_share_row_0():
    t = DynamicIds(capacity=8, admit_after=3)
    assert t.observe([5, 5, 9]).admitted.tolist() == []  # 5 seen twice, 9 once
    o = t.observe([5, 9, 11])
    assert o.admitted.tolist() == [5] and o.reassigned.tolist() == [] and o.rows.tolist() == [1]
    assert t.lookup(np.array([[5, 9], [11, 5]])).tolist() == [[1, 0], [0, 1]]
    assert t.observe([9]).admitted.tolist() == [9] and t.lookup([9]).tolist() == [2]


def test_a_full_table_gives_the_row_of_the_id_seen_least_recently_and_only_an_idle_one():
    t = DynamicIds(capacity=3, admit_after=1, min_idle=1)  # two rows of its own
    t.observe([1])
    t.observe([2])
    o = t.observe([3])  # step 3: id 1 last seen at step 1 (idle), id 2 at step 2 (not idle for one step)
    assert o.admitted.tolist() == [3] and o.reassigned.tolist() == [1] and t.lookup([1, 2, 3]).tolist() == [0, 2, 1]
    o = t.observe([2, 3, 4])  # both held ids seen now: 4 waits, nothing evicted
    assert o.admitted.tolist() == [] and o.waiting == 1 and t.lookup([4]).tolist() == [0]


def test_memory_stays_bounded_and_frequent_ids_keep_their_rows_under_ten_times_capacity_distinct_ids():
    capacity, rng = 2_000, np.random.default_rng(0)
    t = DynamicIds(capacity=capacity, admit_after=3, min_idle=2, sketch_width=1 << 14, decay_every=20)
    hot = np.arange(200)  # the ids that matter: most of the traffic
    seen, sizes = set(), []
    for step in range(60):
        cold = rng.integers(1_000, 10_000_000, size=3_000)  # mostly never seen again
        batch = np.concatenate([rng.choice(hot, size=3_000), cold, step * 10_000 + rng.integers(0, 400, 600)])
        seen.update(batch.tolist())
        t.observe(batch)
        sizes.append(t.nbytes)
    assert len(seen) > 10 * capacity * 5  # ids far beyond the table
    assert max(sizes) <= t.max_nbytes and t.size <= capacity - 1, (max(sizes), t.max_nbytes, t.size)  # bounded
    assert len(set(sizes[-30:])) == 1  # and flat once the table is full, however many new ids come
    assert (t.lookup(hot) > 0).all()  # every hot id holds a row
    # the newest step: its trending ids seen 3 times or more took rows (from ids idle for two steps), its ids seen
    # once mostly did not (the sketch may over-count one by its cells' collisions)
    trend_ids, trend_counts = np.unique(batch[6_000:], return_counts=True)
    assert (t.lookup(trend_ids[trend_counts >= 3]) > 0).all()
    once = np.setdiff1d(cold, trend_ids)
    assert (t.lookup(once) > 0).mean() < 0.1


def test_the_sketch_never_counts_an_id_fewer_times_than_seen():
    rng = np.random.default_rng(1)
    t = DynamicIds(capacity=2, admit_after=10**9, sketch_width=64, sketch_depth=2)  # nothing admitted: all counted
    ids = rng.integers(0, 5_000, size=20_000)
    values, counts = np.unique(ids, return_counts=True)
    t.observe(ids)
    estimate = t._count(values, np.zeros(len(values), np.int64))
    assert (estimate >= counts).all()


def test_state_round_trip_maps_and_evolves_identically():
    rng = np.random.default_rng(2)
    a = DynamicIds(capacity=50, admit_after=2, min_idle=1, sketch_width=256, decay_every=3)
    for _ in range(5):
        a.observe(rng.integers(0, 200, size=300))
    b = DynamicIds.from_state(a.state())
    probe = np.arange(200)
    assert (a.lookup(probe) == b.lookup(probe)).all()
    nxt = rng.integers(0, 200, size=300)
    oa, ob = a.observe(nxt), b.observe(nxt)
    assert oa.admitted.tolist() == ob.admitted.tolist() and oa.reassigned.tolist() == ob.reassigned.tolist()


@pytest.mark.parametrize("kwargs", [{"capacity": 1}, {"capacity": 4, "admit_after": 0}, {"capacity": 4, "sketch_depth": 9}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        DynamicIds(**kwargs)
