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


# -- the pieces fit_stream(dynamic_ids=...) adds around it: the executors' mapping, the rows' reset, the server's copy


def test_map_batches_rewrites_id_columns_to_rows_in_their_own_types_sliced_or_not():
    import pyarrow as pa

    from sparkdl_train.data.id_map import map_batches

    t = DynamicIds(capacity=4, admit_after=1)
    t.observe([7, -3, 2**40])
    rows = dict(zip([7, -3, 2**40], t.lookup([7, -3, 2**40]).tolist()))
    assert sorted(rows.values()) == [1, 2, 3]
    rb = pa.RecordBatch.from_pydict({"item": pa.array([7, 5, 2**40, -3], pa.int64()),
                                     "cats": pa.array([[7, 9], [], [-3, 2**40, 7], [1]], pa.list_(pa.int64())),
                                     "label": [1.0, 0.0, 1.0, 0.0]})
    for batch in (rb, rb.slice(1, 3)):  # a slice: list offsets that do not start at 0
        (out,) = list(map_batches([batch], ["item", "cats"], [t.table, t.table]))
        assert out.schema == rb.schema
        items = batch.column(0).to_pylist()
        assert out.column(0).to_pylist() == [rows.get(i, 0) for i in items]
        assert out.column(1).to_pylist() == [[rows.get(i, 0) for i in c] for c in batch.column(1).to_pylist()]
        assert out.column(2).to_pylist() == batch.column(2).to_pylist()
    with pytest.raises(ValueError, match="'item' holds null ids"):
        list(map_batches([pa.RecordBatch.from_pydict({"item": pa.array([1, None], pa.int64())})], ["item"], [t.table]))


def _embedding_model(optimizer):
    import keras

    keras.utils.set_random_seed(1)
    inp = keras.Input((1,), dtype="int32")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(6, 3, name="items")(inp)))
    m = keras.Model(inp, out)
    m.compile(optimizer=optimizer, loss="mse")
    m.fit(np.arange(6).reshape(-1, 1), np.ones(6), epochs=2, verbose=0)  # slots hold something other than their start
    return m


@pytest.mark.parametrize("optimizer,start", [("adam", 0.0), ("adagrad", 0.1)])
def test_reset_rows_gives_the_rows_fresh_weights_and_their_optimizer_slots_their_start(optimizer, start):
    from sparkdl_train.driver.stream_ids import Reset, _slots, reset_rows

    m = _embedding_model(optimizer)
    var = m.get_layer("items").embeddings
    before = var.numpy().copy()
    slots = _slots(m.optimizer, var)
    assert slots and all(tuple(s.shape) == (6, 3) for s, _ in slots)
    slot_before = [s.numpy().copy() for s, _ in slots]
    fresh = np.full((2, 3), 0.25, np.float32)
    reset_rows(m, [Reset("items", np.array([1, 4]), fresh)])
    after = var.numpy()
    assert np.array_equal(after[[1, 4]], fresh) and np.array_equal(np.delete(after, [1, 4], 0), np.delete(before, [1, 4], 0))
    for (s, st), b in zip(slots, slot_before):
        assert st == start and np.allclose(s.numpy()[[1, 4]], start)
        assert np.array_equal(np.delete(s.numpy(), [1, 4], 0), np.delete(b, [1, 4], 0))


def test_id_tables_refuse_a_layer_that_is_no_embedding_and_round_trip_their_state():
    from sparkdl_train.driver.stream_ids import DynamicTable, IdTables, read_tables
    from sparkdl_train.errors import ConfigError

    m = _embedding_model("adam")
    with pytest.raises(ConfigError, match="layer 'dense.*' is a Dense"):
        IdTables(m, [DynamicTable("item", m.layers[-1].name)])
    with pytest.raises(ConfigError, match="does not have"):
        IdTables(m, [DynamicTable("item", "nope")])
    with pytest.raises(ConfigError, match="admit_after must be an integer >= 1"):
        DynamicTable("item", "items", admit_after=0)
    tables = IdTables(m, [DynamicTable("item", "items", admit_after=1)])
    assert tables.tables["item"].capacity == 6  # the layer's input_dim
    tables.tables["item"].observe([10, 11, 12])
    back = read_tables(tables.encode())["item"]
    assert back.lookup([10, 11, 12, 13]).tolist() == tables.tables["item"].lookup([10, 11, 12, 13]).tolist()


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
def test_a_server_assigned_new_weights_between_epochs_serves_them_as_a_newer_version(mode):
    from sparkdl_train.ps.state import ServerState

    weights = [np.zeros((5, 2), np.float32), np.ones(3, np.float32)]
    st = ServerState(weights, mode, sparse=[0])
    v = st.version
    new = [np.arange(10, dtype=np.float32).reshape(5, 2), np.full(3, 2.0, np.float32)]
    st.assign(new)
    assert st.version > v and all(np.array_equal(a, b) for a, b in zip(st.snapshot(), new))
    reply = st.pull()
    assert np.array_equal(reply.arrays[1], new[1])
    st.release(reply)
    with pytest.raises(ValueError, match="array 1 has shape"):
        st.assign([new[0], np.ones(4, np.float32)])
