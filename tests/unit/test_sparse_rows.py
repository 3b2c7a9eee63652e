"""Sparse embedding updates: the server's row rules, the wire, and the worker's bookkeeping (no Spark)."""

import threading

import keras
import numpy as np
import pytest
from helpers import run_ranks

from sparkdl_train import net
from sparkdl_train.allreduce.local import MemoryRing
from sparkdl_train.driver.sparse_tables import find_tables
from sparkdl_train.errors import DataError
from sparkdl_train.ps import protocol as P
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState, SparseRows, _sum_rows
from sparkdl_train.worker.allreduce_task import _average_state
from sparkdl_train.worker.row_sync import Lookahead, TableSync, TouchCounts, unique_ids

TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)
BIAS = np.zeros(4, np.float32)


def state(mode, **kw):
    return ServerState([TABLE, BIAS], mode, sparse=[0], **kw)


def rows(ids, value, dim=4):
    ids = np.asarray(ids, np.int32)
    return SparseRows(ids, np.full((len(ids), dim), value, np.float32))


def test_async_push_touches_only_its_rows_and_reply_carries_only_wanted_rows():
    s = state("asynchronous")
    r = s.push(0, 0, [rows([1, 7], 1.0), np.ones(4, np.float32)], 5, want={0: np.array([7, 2])})
    assert r.version == 1
    np.testing.assert_array_equal(r.arrays[0], np.stack([TABLE[7] + 1, TABLE[2]]))  # in the order asked
    np.testing.assert_array_equal(r.arrays[1], 1)
    s.release(r)
    full = s.snapshot()[0]
    expect = TABLE.copy()
    expect[[1, 7]] += 1
    np.testing.assert_array_equal(full, expect)
    assert s.pull().arrays[0].shape == (10, 4)  # no want: the whole table


def test_a_reply_is_a_copy_that_later_pushes_do_not_change():
    s = state("asynchronous")
    before = s.pull(want={0: np.array([3])})
    s.release(s.push(0, 0, [rows([3], 5.0), np.zeros(4, np.float32)], 1))
    np.testing.assert_array_equal(before.arrays[0], TABLE[[3]])


def test_sync_round_of_rows_equals_the_dense_mean_with_zeros():
    sparse, dense = state("synchronous", join_timeout=0.1), ServerState([TABLE, BIAS], "synchronous", join_timeout=0.1)
    pushes = [(0, rows([0, 4], 2.0), 30), (1, rows([4, 9], -1.0), 10)]
    for s, as_dense in ((sparse, False), (dense, True)):
        s.begin_epoch(2)
        s.join(0), s.join(1)
        out = []

        def go(worker, r, n, s=s, as_dense=as_dense):
            d = np.zeros_like(TABLE)
            d[r.ids] = r.rows
            out.append(s.push(worker, 0, [d if as_dense else r, np.full(4, worker, np.float32)], n))

        ts = [threading.Thread(target=go, args=p) for p in pushes]
        [t.start() for t in ts]
        [t.join(10) for t in ts]
        assert len(out) == 2 and s.stats.rounds == 1
    np.testing.assert_allclose(sparse.snapshot()[0], dense.snapshot()[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(sparse.snapshot()[0][4], TABLE[4] + (2.0 * 30 - 1.0 * 10) / 40)
    np.testing.assert_allclose(sparse.snapshot()[0][0], TABLE[0] + 2.0 * 30 / 40)


def test_hogwild_rows_and_dense_delta_for_a_table():
    s = state("hogwild")
    s.release(s.push(0, 0, [rows([2], 1.0), BIAS], 1))
    s.release(s.push(1, 0, [np.ones_like(TABLE), BIAS], 1))  # a table may still be sent whole
    expect = TABLE + 1
    expect[2] += 1
    np.testing.assert_array_equal(s.snapshot()[0], expect)


@pytest.mark.parametrize(
    "delta,want,message",
    [
        ([rows([3, 1], 1.0), BIAS], None, "strictly increasing"),
        ([rows([1, 10], 1.0), BIAS], None, r"lie in \[0, 10\)"),
        ([SparseRows(np.array([1]), np.zeros((1, 3), np.float32)), BIAS], None, "rows have shape"),
        ([SparseRows(np.array([1.0]), np.zeros((1, 4), np.float32)), BIAS], None, "1-D integer"),
        ([TABLE, rows([0], 1.0)], None, "not a sparse table"),
        ([TABLE, BIAS], {1: np.array([0])}, "not a sparse table"),
        ([TABLE, BIAS], {0: np.array([-1])}, r"lie in \[0, 10\)"),
        ([TABLE, BIAS], {0: np.zeros(11, np.int64)}, "11 row ids for a table of 10 rows"),
    ],
)
def test_bad_rows_are_refused_with_the_reason(delta, want, message):
    with pytest.raises(ValueError, match=message):
        state("asynchronous").push(0, 0, delta, 1, want=want)


def test_sum_rows_adds_equal_ids_across_parts():
    ids, summed = _sum_rows([(np.array([1, 5]), np.ones((2, 2))), (np.array([0, 5]), 2 * np.ones((2, 2)))])
    assert ids.tolist() == [0, 1, 5]
    assert summed[:, 0].tolist() == [2, 1, 3]


# -- over sockets --------------------------------------------------------------------------

def test_rows_over_the_wire_cost_a_fraction_of_the_dense_push():
    big = np.zeros((50_000, 8), np.float32)
    weights = [big, np.zeros(16, np.float32)]
    srv = ParameterServer(ServerState(weights, "asynchronous", sparse=[0]), "127.0.0.1", b"k" * 32).start()
    try:
        with PSClient(*srv.address, b"k" * 32, 0, timeout=10) as c:
            ids = np.arange(0, 50_000, 500, dtype=np.int32)  # 100 touched rows
            want = {0: np.array([5, 500], np.int32)}
            before = c.bytes_sent + c.bytes_received
            v, got = c.push([SparseRows(ids, np.ones((100, 8), np.float32)), np.ones(16, np.float32)], 0, 4, want)
            used = c.bytes_sent + c.bytes_received - before
            assert v == 1 and got[0].shape == (2, 8)
            np.testing.assert_array_equal(got[0][:, 0], [0, 1])  # row 5 untouched, row 500 pushed
            np.testing.assert_array_equal(got[1], 1)
            dense = P.dense_exchange_bytes(weights)
            assert dense > 2 * big.nbytes and used < 5000 and dense / used > 300
            v, full = c.pull()  # a plain pull still gets the whole table
            assert full[0].shape == (50_000, 8) and full[0][500, 0] == 1
            with pytest.raises(net.ProtocolError, match="strictly increasing"):
                c.push([SparseRows(ids[::-1].copy(), np.ones((100, 8), np.float32)), np.ones(16, np.float32)], v, 1)
    finally:
        srv.stop()
    assert srv.threads_alive() == 0


def test_frames_announcing_the_wrong_number_of_arrays_are_refused():
    meta = {"rows": [0], "want": [0]}
    with pytest.raises(net.ProtocolError, match="announces 4"):
        P.unpack_update(meta, [np.zeros(1)] * 3, 2)
    with pytest.raises(net.ProtocolError, match="list of array indices"):
        P.unpack_update({"rows": [5]}, [np.zeros(1)] * 3, 2)
    with pytest.raises(net.ProtocolError, match="twice"):
        P.unpack_update({"rows": [0, 0]}, [np.zeros(1)] * 4, 2)


# -- worker side ---------------------------------------------------------------------------

def _two_input_model():
    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int32", name="ids")
    num = keras.Input((2,), name="num")
    shifted = keras.layers.Lambda(lambda t: t + 1, name="shift")(ids)
    e1 = keras.layers.Embedding(20, 4, name="direct")(ids)
    e2 = keras.layers.Embedding(30, 2, name="computed")(shifted)
    h = keras.layers.Concatenate()([keras.layers.Flatten()(e1), keras.layers.Flatten()(e2), num])
    out = keras.layers.Dense(1, activation="sigmoid")(h)
    m = keras.Model({"num": num, "ids": ids}, out)
    m.compile(keras.optimizers.SGD(0.5), "binary_crossentropy")
    return m


def test_only_embeddings_read_straight_from_an_input_are_sparse():
    m = _two_input_model()
    (t,) = find_tables(m)
    assert t.name == "direct" and t.rows == 20 and t.input_key == "ids"
    assert m.weights[t.index] is m.get_layer("direct").embeddings
    assert t.ids({"ids": np.array([[1, 2, 2]]), "num": np.zeros((1, 2))}).tolist() == [1, 2, 2]
    assert find_tables(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])) == ()


def test_lookahead_reads_ahead_without_losing_or_reordering_batches():
    la = Lookahead(iter(range(7)))
    assert la.peek(3) == [0, 1, 2]
    got = []
    for b in la:
        got.append(b)
        if b == 1:
            assert la.peek(4) == [2, 3, 4, 5]
    assert got == list(range(7)) and la.peek(2) == []


def test_table_sync_pushes_touched_rows_and_takes_wanted_rows():
    m = _two_input_model()
    (t,) = find_tables(m)
    sync = TableSync(m, [t])
    weights = [np.asarray(w.numpy()) for w in m.weights]
    sync.receive(weights, None)  # whole tables
    x = {"ids": np.array([[3, 3, 5], [5, 7, 7]], np.int32), "num": np.ones((2, 2), np.float32)}
    batch = (x, np.array([1.0, 0.0], np.float32), None)
    assert sync.want([batch])[t.index].tolist() == [3, 5, 7]
    for b in sync.track([batch]):
        m.train_on_batch(*b[:2])
    delta = sync.delta(scale=0.5)
    d = delta[t.index]
    assert isinstance(d, SparseRows) and d.ids.tolist() == [3, 5, 7]
    after = np.asarray(m.weights[t.index].numpy())
    np.testing.assert_allclose(d.rows, 0.5 * (after[[3, 5, 7]] - weights[t.index][[3, 5, 7]]), rtol=1e-6)
    assert np.abs(d.rows).sum() > 0
    # untouched rows did not move (SGD), dense weights travel whole
    np.testing.assert_array_equal(np.delete(after, [3, 5, 7], axis=0), np.delete(weights[t.index], [3, 5, 7], axis=0))
    assert all(delta[i].shape == weights[i].shape for i in range(len(weights)) if i != t.index)
    # a reply with two wanted rows overwrites exactly those rows
    fresh = [np.asarray(w.numpy()) for w in m.weights]
    fresh[t.index] = np.full((2, 4), 9.0, np.float32)
    sync.receive(fresh, {t.index: np.array([0, 7], np.int32)})
    now = np.asarray(m.weights[t.index].numpy())
    assert (now[[0, 7]] == 9).all() and (now[3] == after[3]).all()
    assert sync.delta(1.0)[t.index].ids.tolist() == []  # nothing touched since


@pytest.mark.parametrize("ids, rows", [
    ([5, 3, 5, 0, 9], 10),  # a small table: the mask
    ([7, 7, 1_000_000, 2], 2_000_000),  # a large one beside few ids: sorted
    ([3, 12], 10), ([-1, 4], 10),  # ids outside the table: sorted, left for the lookup to refuse
    ([], 10),
])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_unique_ids_are_numpys_unique_whichever_way(ids, rows, dtype):
    a = np.asarray(ids, dtype)
    got = unique_ids(a, rows)
    assert got.tolist() == np.unique(a).tolist() and got.dtype == np.unique(a).dtype


def test_tables_read_by_one_input_share_the_wanted_ids():
    inp = keras.Input((3,), dtype="int32", name="ids")
    a = keras.layers.Flatten()(keras.layers.Embedding(20, 4, name="embed")(inp))
    b = keras.layers.Flatten()(keras.layers.Embedding(20, 1, name="linear")(inp))
    m = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    m.compile("sgd", "mse")
    tables = find_tables(m)
    assert len(tables) == 2
    batch = ({"ids": np.array([[4, 4, 9], [1, 9, 0]], np.int32)}, np.zeros(2, np.float32), None)
    want = TableSync(m, tables).want([batch])
    assert [want[t.index].tolist() for t in tables] == [[0, 1, 4, 9]] * 2


def _sync_rounds(compiled: bool, tables: bool = True):
    """Five push/receive rounds of a table sync; ``compiled`` False forces the eager path;
    ``tables`` False syncs every weight whole (a model whose ids are computed inside it)."""
    keras.utils.set_random_seed(3)
    m = _two_input_model()
    (t,) = find_tables(m)
    sync = TableSync(m, [t] if tables else [], compiled=compiled)
    assert (sync._io is not None) == compiled
    writes = []
    if compiled:
        real = sync._io.write
        sync._io.write = lambda *a: writes.append(1) or real(*a)
    rng = np.random.default_rng(0)
    server = [np.asarray(w.numpy()) for w in m.weights]
    sync.receive(server, None)
    deltas = []
    for step in range(5):
        x = {"ids": rng.integers(0, t.rows, (4, 3)).astype(np.int32), "num": rng.random((4, 2), np.float32)}
        batch = (x, rng.integers(0, 2, 4).astype(np.float32), None)
        for b in sync.track([batch]):
            m.train_on_batch(*b[:2])
        deltas.append(sync.delta(0.5))
        if not tables:
            sync.receive([a + 0.1 * step for a in server], None)
            continue
        want = sync.want([batch]) if step != 3 else {t.index: np.zeros(0, np.int32)}  # step 3: no rows
        sync.receive([a + 0.1 if i != t.index else a[want[i]] + 0.2 for i, a in enumerate(server)], want)
    assert len(writes) == (0 if not compiled else 6 if not tables else 5)  # the first receive of whole tables: eager
    return deltas, [np.asarray(w.numpy()) for w in m.weights]


@pytest.mark.parametrize("tables", [True, False])
def test_the_compiled_push_path_moves_exactly_what_the_eager_one_does(tables):
    """A push reads every dense weight and the touched rows, a reply assigns them, in one compiled
    call each (one op dispatch per variable cost a worker about 5 ms per push): same deltas, same
    weights as assigning variable by variable; so does a model with no table, every weight whole."""
    fast, fast_weights = _sync_rounds(compiled=True, tables=tables)
    slow, slow_weights = _sync_rounds(compiled=False, tables=tables)
    for a, b in zip(fast, slow):
        for x, y in zip(a, b):
            if isinstance(x, SparseRows):
                assert x.ids.tolist() == y.ids.tolist()
                np.testing.assert_allclose(x.rows, y.rows, rtol=1e-6)
            else:
                np.testing.assert_allclose(x, y, rtol=1e-6)
    for x, y in zip(fast_weights, slow_weights):
        np.testing.assert_allclose(x, y, rtol=1e-6)


@pytest.mark.parametrize("window", ["exact", "copies", "other"])
def test_a_push_after_the_window_it_pulled_sends_that_windows_rows_without_finding_them_again(window):
    """A worker pulls the rows of the window it reads ahead, trains exactly those batches, and pushes:
    the rows it touched are the rows it pulled (reused, nothing recomputed, the bases on the device
    beside the tables). Equal batches that are other objects, or other batches, are found from the
    batches' own ids: the same deltas either way, compiled or eager."""
    import push_rounds

    runs = {c: push_rounds.run(compiled=c, window=window) for c in (True, False)}
    assert runs[True]["reused"] == runs[False]["reused"] == (6 if window == "exact" else 0)
    assert push_rounds.compare(runs[True], runs[False]) <= 1e-6
    if window != "other":  # what a push sends is what the window pulled
        assert push_rounds.compare(runs[True], push_rounds.run(compiled=True, window="exact" if window == "copies" else "copies")) == 0.0
        for deltas, pulled in zip(runs[True]["deltas"], runs[True]["pulled"]):
            assert [deltas[i][0] for i in runs[True]["tables"]] == [pulled[i] for i in runs[True]["tables"]]
    else:  # the rows trained, not the rows pulled
        assert any(d[0][0] != p[0] for d, p in zip(runs[True]["deltas"], runs[True]["pulled"]))


@pytest.mark.parametrize("compiled", [True, False])
def test_a_reply_with_other_rows_than_asked_is_refused_before_anything_is_assigned(compiled):
    import push_rounds

    m = push_rounds.model()
    tables = find_tables(m)
    sync = TableSync(m, tables, compiled=compiled)
    before = [np.array(w.numpy()) for w in m.weights]
    want = {t.index: np.array([1, 2, 3], np.int32) for t in tables}
    reply = [a + 1.0 if i not in want else (a + 1.0)[:2] for i, a in enumerate(before)]  # 2 rows for 3 ids
    with pytest.raises(ValueError, match="server sent 2 rows of table 'embed', 3 were asked for"):
        sync.receive(reply, want)
    for w, b in zip(m.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_jax_pushes_pad_their_ids_to_a_few_sizes():
    """A compiled gather or scatter is one executable per shape: ids padded to at most four sizes per
    power of two, at most 25% more."""
    from sparkdl_train.backend.jax import _id_bucket

    sizes = [_id_bucket(n) for n in range(1, 70000)]
    assert all(b >= n and (n <= 1024 or b <= 1.25 * n) for n, b in enumerate(sizes, 1))
    assert sizes[0] == sizes[1023] == 1024 and len(set(sizes)) <= 1 + 4 * 7


def test_sparse_embeddings_config_is_validated():
    from sparkdl_train import ConfigError
    from sparkdl_train.config import EngineConfig

    with pytest.raises(ConfigError, match="sparse_embeddings applies to the modes .*only, not mode='allreduce'"):
        EngineConfig(mode="allreduce", sparse_embeddings=True)
    with pytest.raises(ConfigError, match="sparse_embeddings must be True, False or None"):
        EngineConfig(mode="asynchronous", sparse_embeddings="yes")
    assert EngineConfig.from_spark_conf({"spark.sparkdl_train.ps.sparseEmbeddings": "false"}).sparse_embeddings is False
    with pytest.raises(ConfigError, match="ps.sparseEmbeddings='nope'"):
        EngineConfig.from_spark_conf({"spark.sparkdl_train.ps.sparseEmbeddings": "nope"})


def test_a_replys_dense_weights_are_one_flat_view_of_the_receive_buffer():
    """The compiled path moves the dense weights as one flat vector: a reply's arrays lie back to
    back in the receive buffer, so the vector is a view of it (no copy); arrays elsewhere are copied."""
    from sparkdl_train import wire
    from sparkdl_train.backend.tensorflow import VariableIO as _VariableIO

    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    io = _VariableIO.of(m, [0, 1, 2, 3], [])
    arrays = [np.random.default_rng(i).random(w.shape).astype(np.float32) for i, w in enumerate(m.weights)]
    _, reply = wire.decode(wire.encode({}, arrays))
    flat = io.flat_view(reply)
    assert np.shares_memory(flat, reply[0]) and np.shares_memory(flat, reply[3])
    np.testing.assert_array_equal(flat, np.concatenate([a.ravel() for a in arrays]))
    copied = io.flat_view(arrays)
    assert not np.shares_memory(copied, arrays[0]) and np.array_equal(copied, flat)
    assert [a.shape for a in io.unflatten(flat)] == [tuple(w.shape) for w in m.weights]
    io.write(flat, [], [])
    for w, a in zip(m.weights, arrays):
        np.testing.assert_array_equal(w.numpy(), a)
    assert _VariableIO.of(keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, dtype="float64"), keras.layers.Dense(2)]),
                          [0, 1, 2, 3], []) is None  # dense weights of two dtypes: the eager path


def test_touch_counts_count_lookups_per_input_and_find_the_tables_optimizer_slots():
    m = _two_input_model()
    m.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
    tables = find_tables(m)
    counts = TouchCounts(tables)
    batches = [({"ids": np.array([[1, 2, 2]]), "num": np.zeros((1, 2))}, np.zeros(1), None),
               ({"ids": np.array([[2, 19, 0], [0, 0, 5]]), "num": np.zeros((2, 2))}, np.zeros(2), None)]
    assert list(counts.track(iter(batches))) == batches  # passed through unchanged
    expected = np.zeros(20)
    np.add.at(expected, [1, 2, 2, 2, 19, 0, 0, 0, 5], 1)
    np.testing.assert_array_equal(counts.of(tables[0]), expected)
    m.fit({"ids": np.zeros((2, 3), np.int32), "num": np.zeros((2, 2))}, np.zeros(2), verbose=0)  # builds Adam's slots
    (positions, c), = counts.state_rows(m)
    state = [*m.weights, *m.optimizer.variables]
    assert positions[0] == tables[0].index and len(positions) == 3  # the table, Adam's m and v for it
    assert all(tuple(state[i].shape) == (20, 4) for i in positions) and c is counts.of(tables[0])
    assert all("direct" in state[i].name for i in positions[1:])
    bad = ({"ids": np.array([[1, 20, 2]]), "num": np.zeros((1, 2))}, np.zeros(1), None)
    with pytest.raises(DataError, match="input 'ids' holds id 20, outside embedding table 'direct'"):
        list(TouchCounts(tables).track(iter([bad])))


@pytest.mark.parametrize("sums", ["float64", "float32"])
def test_touch_weighted_average_weights_each_row_by_the_ranks_lookups(sums):
    """Ranks' tables (and a slot of the same shape) averaged row by row, weighted by lookups; rows no
    rank looked up and the other arrays by samples; the counter takes the maximum."""
    rng = np.random.default_rng(3)
    size, rows = 3, 6
    samples = [10, 30, 0]
    tables = [rng.standard_normal((rows, 2)).astype(np.float32) for _ in range(size)]
    slots = [rng.standard_normal((rows, 2)).astype(np.float32) for _ in range(size)]
    dense = [rng.standard_normal(5).astype(np.float32) for _ in range(size)]
    counts = [np.array([4, 0, 1, 0, 0, 2.0]), np.array([0, 0, 3, 7, 0, 2.0]), np.zeros(rows)]
    counters = [np.array(5, np.int64), np.array(9, np.int64), np.array(99, np.int64)]  # rank 2 had no samples
    mem = MemoryRing(size)
    out, errs = run_ranks(size, lambda r: _average_state(
        [tables[r], dense[r], slots[r], counters[r]], mem.link(r), r, size, samples[r], np.dtype(sums),
        rows=[([0, 2], counts[r])]))
    assert errs == [None] * size
    c = np.stack(counts)
    touched = c.sum(axis=0) > 0
    for arrays, got in ((tables, 0), (slots, 2)):
        a = np.stack(arrays)
        by_rows = (a * c[:, :, None]).sum(axis=0) / np.maximum(c.sum(axis=0), 1)[:, None]
        by_samples = np.tensordot(np.array(samples, float), a, axes=1) / sum(samples)
        expected = np.where(touched[:, None], by_rows, by_samples)
        for r in range(size):
            np.testing.assert_allclose(out[r][got], expected, rtol=1e-5, atol=1e-6)
    for r in range(size):
        np.testing.assert_allclose(out[r][1], (10 * dense[0] + 30 * dense[1]) / 40, rtol=1e-6)
        assert int(out[r][3]) == 9 and out[r][0].dtype == np.float32
        for a, b in zip(out[r], out[0]):
            np.testing.assert_array_equal(a, b)  # the same on every rank


@pytest.mark.parametrize("mode", ["asynchronous", "hogwild"])
def test_table_shards_give_the_same_replies_and_state_as_one_lock(mode):
    """ps.tableShards: rows added and gathered range by range under each range's lock, outside the
    state's lock. One worker after another, every reply and the final state equal the unsharded
    server's bit for bit: tables whose rows do not divide evenly, ids at every range's edges,
    repeated and unsorted wanted ids, whole-table pulls."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((23, 3)).astype(np.float32)
    other = rng.standard_normal((7, 2)).astype(np.float32)
    weights = [big, np.zeros(5, np.float32), other]
    one = ServerState(weights, mode, sparse=[0, 2])
    three = ServerState(weights, mode, sparse=[0, 2], shards=3)
    assert three.shards == 3 and ServerState([BIAS], mode, shards=3).shards == 1  # no table: nothing to shard
    for step in range(30):
        ids0 = np.unique(rng.integers(0, 23, rng.integers(0, 12)))
        ids2 = np.unique(rng.integers(0, 7, 3))
        delta = [SparseRows(ids0.astype(np.int64), rng.standard_normal((len(ids0), 3)).astype(np.float32)),
                 rng.standard_normal(5).astype(np.float32),
                 SparseRows(ids2.astype(np.int64), rng.standard_normal((len(ids2), 2)).astype(np.float32))]
        want = {0: rng.integers(0, 23, 9), 2: np.array([6, 0, 6])} if step % 3 else None
        a, b = one.push(step % 2, step, delta, 4, want=want), three.push(step % 2, step, delta, 4, want=want)
        assert a.version == b.version
        for x, y in zip(a.arrays, b.arrays):
            np.testing.assert_array_equal(x, y)
        one.release(a), three.release(b)
        p, q = one.pull({0: np.array([22, 0, 7, 8, 15, 16])}), three.pull({0: np.array([22, 0, 7, 8, 15, 16])})
        np.testing.assert_array_equal(p.arrays[0], q.arrays[0])
        np.testing.assert_array_equal(p.arrays[2], q.arrays[2])  # not asked for: the whole table
        one.release(p), three.release(q)
    for x, y in zip(one.snapshot(), three.snapshot()):
        np.testing.assert_array_equal(x, y)


def test_table_shards_lose_no_addition_under_concurrent_pushes_and_sync_rounds_stay_whole():
    """Four threads push overlapping rows into a 4-shard asynchronous server: every addition lands
    (float64 table, integer-valued deltas: exact); the replies to a synchronous round's pushes hold all its rows."""
    table = np.zeros((101, 2), np.float64)
    s = ServerState([table, np.zeros(1, np.float64)], "asynchronous", sparse=[0], shards=4)
    ids = np.arange(0, 101, 2, dtype=np.int64)

    def worker(w):
        for _ in range(50):
            s.release(s.push(w, 0, [SparseRows(ids, np.ones((len(ids), 2))), np.ones(1)], 1, want={0: ids[::-1]}))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    final = s.snapshot()
    np.testing.assert_array_equal(final[0][ids], 200.0)
    np.testing.assert_array_equal(final[0][1::2], 0.0)
    assert final[1][0] == 200.0 and s.version == 200

    sync = ServerState([np.zeros((10, 1)), np.zeros(1)], "synchronous", sparse=[0], shards=3, join_timeout=0.1)
    sync.begin_epoch(2)
    sync.join(0), sync.join(1)
    replies = {}

    def push(w):
        replies[w] = sync.push(w, 0, [SparseRows(np.arange(10), np.full((10, 1), 2.0 * (w + 1))), np.zeros(1)], 1)

    threads = [threading.Thread(target=push, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for r in replies.values():  # the round's mean (2 and 4 by equal samples): every row, every range
        np.testing.assert_array_equal(r.arrays[0], 3.0)
        sync.release(r)
    with pytest.raises(ValueError, match="at least 1"):
        ServerState([table], "asynchronous", sparse=[0], shards=0)
