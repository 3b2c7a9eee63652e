"""Sparse gradients through the ring (allreduce.sparseGradients) without Spark: packing, the
variable-length allgather over memory and TCP rings, the bytes moved, malformed blocks."""

import numpy as np
import pytest
from helpers import run_ranks
from test_ring import tcp_ring

from sparkdl_train import table_rows
from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce import row_gather as sparse
from sparkdl_train.allreduce.local import MemoryRing
from sparkdl_train.allreduce.transport import RingError
from sparkdl_train.halfwidth import BF16, Codec

SHAPES = [table_rows.TableShape(50, 3), table_rows.TableShape(50, 1), table_rows.TableShape(7, 5)]


def touched(rng, size, empty=()):
    """Per rank, per table: unique ids in random order and random rows (rank ``empty``: none)."""
    out = []
    for r in range(size):
        tables = []
        for s in SHAPES:
            k = 0 if r in empty else int(rng.integers(1, s.rows))
            ids = rng.permutation(s.rows)[:k].astype(s.id_dtype)
            tables.append((ids, rng.standard_normal((k, s.dim)).astype(np.float32)))
        out.append(tables)
    return out


def dense(shape, ids, rows):
    g = np.zeros((shape.rows, shape.dim), np.float32)
    np.add.at(g, ids, rows)
    return g


@pytest.mark.parametrize("wire", [None, np.float16, BF16])
def test_pack_and_unpack_round_trip(wire):
    rng = np.random.default_rng(0)
    tables = touched(rng, 1)[0]
    tables[1] = (tables[1][0][:0], tables[1][1][:0])  # a table with no rows
    w = Codec(np.dtype(np.float32), wire)
    block = sparse.pack(SHAPES, tables, w)
    assert block.nbytes == sparse.block_bytes(SHAPES, [len(i) for i, _ in tables], w) and block.nbytes % 8 == 0
    for s, (ids, rows), (got_ids, got_rows) in zip(SHAPES, tables, sparse.unpack(SHAPES, block, w)):
        np.testing.assert_array_equal(got_ids, ids)
        back = sparse._widen(got_rows, w, s)
        if wire is None:
            np.testing.assert_array_equal(back, rows)
        else:
            np.testing.assert_allclose(back, rows, rtol=1e-2, atol=1e-3)
    assert table_rows.TableShape(2**31, 1).id_dtype == np.int64 and SHAPES[0].id_dtype == np.int32


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_exchange_gives_every_rank_the_dense_sum_in_rank_order(size):
    """Every rank ends with the same ids and rows (rank order), whose scatter-add is the sum of the
    ranks' dense table gradients; a rank with no rows (out of data) takes part; the bytes each rank
    receives are the other ranks' blocks and the lengths."""
    rng = np.random.default_rng(size)
    data = touched(rng, size, empty=(size - 1,) if size > 2 else ())
    memory = MemoryRing(size)
    links = [memory.link(r) for r in range(size)]

    def work(r):
        return sparse.exchange(SHAPES, data[r], links[r] if size > 1 else None, r, size)

    out, errs = run_ranks(size, work)
    assert errs == [None] * size, errs
    for t, s in enumerate(SHAPES):
        expect = sum(dense(s, *data[r][t]) for r in range(size))
        np.testing.assert_allclose(dense(s, *out[0][t]), expect, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(out[0][t][0], np.concatenate([data[r][t][0] for r in range(size)]))
        for r in range(1, size):
            np.testing.assert_array_equal(out[r][t][0], out[0][t][0])
            np.testing.assert_array_equal(out[r][t][1], out[0][t][1])
    counts = [[len(ids) for ids, _ in data[r]] for r in range(size)]
    assert links[0].bytes_received == sparse.bytes_per_rank(SHAPES, counts)
    if size > 1:
        table_bytes = sum(4 * s.rows * s.dim for s in SHAPES)
        assert links[0].bytes_received < ring.bytes_per_rank(table_bytes, size) * size  # checks the formula is sane


def test_two_ranks_sum_the_same_pair_of_floats_as_the_dense_ring():
    rng = np.random.default_rng(7)
    data = touched(rng, 2)
    memory = MemoryRing(2)
    out, errs = run_ranks(2, lambda r: sparse.exchange(SHAPES, data[r], memory.link(r), r, 2))
    assert errs == [None, None]
    bufs = [np.concatenate([dense(s, *data[r][t]).ravel() for t, s in enumerate(SHAPES)]) for r in range(2)]
    dense_ring = MemoryRing(2)
    _, errs = run_ranks(2, lambda r: ring.allreduce_sum(bufs[r], dense_ring.link(r), r, 2))
    summed = np.concatenate([dense(s, *out[0][t]).ravel() for t, s in enumerate(SHAPES)])
    np.testing.assert_array_equal(summed, bufs[0])


@pytest.mark.parametrize("wire", [np.float16, BF16])
def test_narrow_wire_keeps_ranks_identical(wire):
    rng = np.random.default_rng(3)
    data = touched(rng, 3)
    memory = MemoryRing(3)
    out, errs = run_ranks(3, lambda r: sparse.exchange(SHAPES, data[r], memory.link(r), r, 3, wire))
    assert errs == [None] * 3
    for t, s in enumerate(SHAPES):
        assert out[0][t][1].dtype == np.float32
        assert all(np.array_equal(out[r][t][1], out[0][t][1]) for r in (1, 2))
        expect = sum(dense(s, *data[r][t]) for r in range(3))
        np.testing.assert_allclose(dense(s, *out[0][t]), expect, rtol=2e-2, atol=2e-2)


def test_tcp_ring_exchanges_blocks_of_any_length_including_none():
    size = 3
    connect = tcp_ring(size)
    rng = np.random.default_rng(11)
    data = touched(rng, size, empty=(1,))

    def work(r):
        link = connect(r)
        try:
            return sparse.exchange(SHAPES, data[r], link, r, size), link.bytes_received
        finally:
            link.close()

    out, errs = run_ranks(size, work)
    assert errs == [None] * size, errs
    counts = [[len(ids) for ids, _ in data[r]] for r in range(size)]
    assert out[0][1] == sparse.bytes_per_rank(SHAPES, counts)
    for t, s in enumerate(SHAPES):
        expect = sum(dense(s, *data[r][t]) for r in range(size))
        for r in range(size):
            np.testing.assert_allclose(dense(s, *out[r][0][t]), expect, rtol=1e-6, atol=1e-6)


def test_a_block_too_large_for_the_tables_fails_naming_its_rank():
    memory = MemoryRing(2, timeout=0.5)  # rank 1 then waits for a block rank 0 never sends

    def work(r):
        block = np.zeros(64 if r == 0 else 4096, np.uint8)
        return sparse.allgather_blocks(block, memory.link(r), r, 2, limit=1024)

    _, errs = run_ranks(2, work)
    assert isinstance(errs[0], RingError) and "rank 1 announced a sparse block of 4096 bytes" in str(errs[0])
    w = Codec(np.dtype(np.float32), None)
    bad = sparse.pack(SHAPES, touched(np.random.default_rng(1), 1)[0], w)
    bad[:8].view(np.int64)[0] = 51  # more rows than table 0 has
    with pytest.raises(RingError, match="rank 4 sent row counts"):
        sparse.unpack(SHAPES, bad, w, origin=4)
    for table, bad_id in ((0, 50), (2, 7), (1, -1)):  # ids outside a table: never scattered, on any rank
        block = sparse.pack(SHAPES, touched(np.random.default_rng(2), 1)[0], w)
        sparse.unpack(SHAPES, block, w, origin=5)[table][0][-1] = bad_id  # the views write into the block
        with pytest.raises(RingError, match=f"rank 5 sent row id {bad_id} for a table of {SHAPES[table].rows} rows"):
            sparse.unpack(SHAPES, block, w, origin=5)
    with pytest.raises(RingError, match="rank 2 sent a sparse block of 32 bytes for row counts"):
        sparse.unpack(SHAPES, np.zeros(32, np.uint8), w, origin=2)
    with pytest.raises(RingError, match="from rank 3 lacks its header"):
        sparse.unpack(SHAPES, np.zeros(8, np.uint8), w, origin=3)


def test_pays_compares_the_allgather_with_the_dense_ring():
    # the CTR job's field embedding: 1M x 8, batch 512 x 26 ids
    assert sparse.pays(1_000_000, 8, 2, 512 * 26)
    assert sparse.pays(1_000_000, 8, 64, 512 * 26)  # 64 x 13k x 9 < 2 x 8M
    assert not sparse.pays(1_000_000, 8, 256, 512 * 26)
    assert not sparse.pays(100, 8, 2, 512)  # a small table is touched everywhere: dense
