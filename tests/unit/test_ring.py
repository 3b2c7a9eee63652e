"""Ring allreduce, broadcast and the TCP ring without Spark (threads as ranks)."""

import os
import socket
import time

import numpy as np
import pytest
from helpers import poke_listener, run_ranks

from sparkdl_train import halfwidth
from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce.local import MemoryRing, ThreadGroup
from sparkdl_train.allreduce.transport import FRAME, MAGIC, PeerAborted, RingError, RingTimeout, rendezvous

SECRET = b"0123456789abcdef0123456789abcdef"


def tcp_ring(size, timeout=10.0, secrets=None, connect_timeout=10.0):
    groups = ThreadGroup.create(size)
    links = [None] * size

    def connect(r):
        links[r] = rendezvous(groups[r], "127.0.0.1", (secrets or [SECRET] * size)[r], timeout, connect_timeout)
        return links[r]

    return connect


# -- pure schedule ------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7])
def test_schedule_gives_each_rank_a_distinct_finished_segment(size):
    owned = {ring.owned_segment(r, size) for r in range(size)}
    assert owned == set(range(size))
    for r in range(size):
        rs = ring.reduce_scatter_schedule(r, size)
        ag = ring.allgather_schedule(r, size)
        assert len(rs) == len(ag) == size - 1
        # what a rank receives at step s is what its previous rank sends at step s
        prev = (r - 1) % size
        assert [recv for _, recv in rs] == [send for send, _ in ring.reduce_scatter_schedule(prev, size)]
        assert [recv for _, recv in ag] == [send for send, _ in ring.allgather_schedule(prev, size)]
        # allgather starts by sending the owned segment
        if size > 1:
            assert ag[0][0] == ring.owned_segment(r, size)


@pytest.mark.parametrize("n,size", [(0, 3), (1, 4), (10, 3), (1001, 5), (7, 7)])
def test_segments_cover_the_buffer(n, size):
    b = ring.segment_bounds(n, size)
    assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(size - 1))
    assert max(hi - lo for lo, hi in b) - min(hi - lo for lo, hi in b) <= 1


# -- allreduce over in-memory links -------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 3, 17, 1001, 65537])
def test_allreduce_mean_equals_numpy_mean(size, n):
    rng = np.random.default_rng(size * 1000 + n)
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    bufs = [d.copy() for d in data]
    mem = MemoryRing(size)
    _, errs = run_ranks(size, lambda r: ring.allreduce_sum(bufs[r], mem.link(r), r, size, chunk_bytes=4096))
    assert errs == [None] * size
    expected = np.mean(np.stack(data), axis=0)
    for b in bufs:
        np.testing.assert_allclose(b / size, expected, rtol=1e-5, atol=1e-6)
        assert np.array_equal(b, bufs[0])  # bitwise identical on every rank


@pytest.mark.parametrize("size", [2, 3, 5])
def test_bytes_moved_are_two_n_minus_one_over_n(size):
    n = 10_000
    bufs = [np.ones(n, np.float32) for _ in range(size)]
    mem = MemoryRing(size)
    links = [mem.link(r) for r in range(size)]
    run_ranks(size, lambda r: ring.allreduce_sum(bufs[r], links[r], r, size))
    bounds = ring.segment_bounds(n, size)
    for r, link in enumerate(links):
        sent_segments = [s for s, _ in ring.reduce_scatter_schedule(r, size) + ring.allgather_schedule(r, size)]
        assert link.bytes_sent == sum(4 * (bounds[i][1] - bounds[i][0]) for i in sent_segments)
        assert link.bytes_sent <= ring.bytes_per_rank(4 * n, size)
    assert sum(lk.bytes_sent for lk in links) == 2 * (size - 1) * 4 * n  # every segment crosses 2(N-1) links
    assert np.all(bufs[0] == size)


def test_fp16_wire_halves_the_bytes_and_keeps_ranks_identical():
    size, n = 3, 4099
    rng = np.random.default_rng(1)
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    results = {}
    for wire in (None, np.float16):
        bufs = [d.copy() for d in data]
        mem = MemoryRing(size)
        links = [mem.link(r) for r in range(size)]
        run_ranks(size, lambda r: ring.allreduce_sum(bufs[r], links[r], r, size, wire_dtype=wire))
        assert all(np.array_equal(b, bufs[0]) for b in bufs)
        results[wire] = (bufs[0].copy(), sum(lk.bytes_sent for lk in links))
    exact, fp32_bytes = results[None]
    approx, fp16_bytes = results[np.float16]
    assert fp16_bytes * 2 == fp32_bytes
    np.testing.assert_allclose(approx, exact, atol=0.02 * size, rtol=0.01)


def test_bf16_bits_round_like_ml_dtypes():
    """to_bf16 rounds to nearest even exactly as ml_dtypes' bfloat16 (what TensorFlow, JAX and the
    accelerators use), keeps NaN, inf and signed zeros, and overflows to inf."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    u = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    finite = u.view(np.float32)[np.isfinite(u.view(np.float32))]
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4e38, -3.4e38, 1e-45, 65504.0, 1e30,
                        1.00390625, 1.01171875], np.float32)  # the last two: ties, to even
    for a in (finite, special):
        got = halfwidth.to_bf16(a, np.empty(a.size, np.uint16))
        want = a.astype(ml_dtypes.bfloat16).view(np.uint16)
        both_nan = np.isnan(a)
        assert np.array_equal(got[~both_nan], want[~both_nan])
        back = halfwidth.from_bf16(got, np.empty(a.size, np.float32))
        assert np.isnan(back[both_nan]).all()
        np.testing.assert_array_equal(back[~both_nan], want[~both_nan].view(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_wire_halves_the_bytes_keeps_ranks_identical_and_float32_range():
    """bfloat16 on the wire, float32 sums: half the bytes of float32, every rank bitwise identical,
    within bfloat16's 2^-8 relative step of the exact sum, and gradients past float16's 65504
    stay finite (float16 turns them into inf)."""
    size, n = 3, 4099
    rng = np.random.default_rng(1)
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    data[0][:10] = 1e6  # a large gradient: 3e6 summed
    results = {}
    for wire in (None, np.float16, halfwidth.BF16):
        bufs = [d.copy() for d in data]
        mem = MemoryRing(size)
        links = [mem.link(r) for r in range(size)]
        run_ranks(size, lambda r: ring.allreduce_sum(bufs[r], links[r], r, size, wire_dtype=wire))
        assert all(np.array_equal(b, bufs[0]) for b in bufs)
        results[str(wire)] = (bufs[0].copy(), sum(lk.bytes_sent for lk in links))
    exact, fp32_bytes = results["None"]
    approx, bf16_bytes = results[halfwidth.BF16]
    assert bf16_bytes * 2 == fp32_bytes
    np.testing.assert_allclose(approx, exact, rtol=3 * 2**-8, atol=3 * 2**-8 * size)
    assert np.isfinite(approx).all() and abs(approx[0] - exact[0]) <= exact[0] * 2**-7
    assert np.isinf(results[str(np.float16)][0][:10]).all()  # float16 could not carry them
    with pytest.raises(ValueError, match="float32 buffer"):
        ring.allreduce_sum(np.ones(8, np.float64), MemoryRing(2).link(0), 0, 2, wire_dtype=halfwidth.BF16)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_broadcast_copies_root_bytes(size):
    payload = np.frombuffer(os.urandom(3 * 1024 + 5), np.uint8)
    bufs = [payload.copy() if r == 0 else np.zeros_like(payload) for r in range(size)]
    mem = MemoryRing(size)
    run_ranks(size, lambda r: ring.broadcast(bufs[r], mem.link(r), r, size, chunk_bytes=1000))
    assert all(np.array_equal(b, payload) for b in bufs)


# -- the same over TCP ----------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_tcp_ring_allreduce_and_broadcast(size):
    connect = tcp_ring(size)
    rng = np.random.default_rng(size)
    n = 300_001  # odd, and segments larger than one receive chunk
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    bufs = [d.copy() for d in data]
    blob = np.frombuffer(os.urandom(100_000), np.uint8)
    blobs = [blob.copy() if r == 0 else np.zeros_like(blob) for r in range(size)]

    def work(r):
        link = connect(r)
        try:
            ring.allreduce_sum(bufs[r], link, r, size, chunk_bytes=65536)
            ring.broadcast(blobs[r], link, r, size, chunk_bytes=30_000)
            return (link.bytes_sent, link.bytes_received) if link else (0, 0)
        finally:
            if link:
                link.close()

    out, errs = run_ranks(size, work)
    assert errs == [None] * size, errs
    np.testing.assert_allclose(bufs[0] / size, np.mean(np.stack(data), axis=0), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(b, bufs[0]) for b in bufs)
    assert all(np.array_equal(b, blob) for b in blobs)
    if size > 1:
        assert all(sent >= ring.bytes_per_rank(4 * n, size) - 4 * size for sent, _ in out)


def test_wrong_secret_is_refused_without_hanging():
    size = 3
    connect = tcp_ring(size, timeout=3.0, secrets=[SECRET, SECRET, b"x" * 32], connect_timeout=3.0)
    start = time.monotonic()
    _, errs = run_ranks(size, connect, timeout=30)
    assert time.monotonic() - start < 9  # every rank gives up within its timeouts, none hangs
    assert all(isinstance(e, (RingError, ConnectionError)) for e in errs if e is not None)
    assert any("authentication failed" in str(e) for e in errs if e is not None), errs


def test_stray_connection_to_a_listener_is_dropped():
    groups = ThreadGroup.create(2)
    # rank 1 reads the garbage and drops the connection, answering nothing, before the ring forms
    answers = poke_listener(groups, b"GET / HTTP/1.0\r\n\r\n")
    bufs = [np.full(10, r + 1.0, np.float32) for r in range(2)]

    def work(r):
        link = rendezvous(groups[r], "127.0.0.1", SECRET, 10.0, 10.0)
        with link:
            ring.allreduce_sum(bufs[r], link, r, 2)

    _, errs = run_ranks(2, work)
    assert errs == [None, None], errs
    assert answers == [b""]
    assert np.all(bufs[0] == 3.0) and np.all(bufs[1] == 3.0)


def test_slow_rank_times_out_with_its_rank_named():
    size = 3
    connect = tcp_ring(size, timeout=1.0)
    bufs = [np.ones(1000, np.float32) for _ in range(size)]

    def work(r):
        link = connect(r)
        try:
            if r == 2:
                time.sleep(4)  # never sends in time
            ring.allreduce_sum(bufs[r], link, r, size)
        finally:
            link.close()

    start = time.monotonic()
    _, errs = run_ranks(size, work)
    assert time.monotonic() - start < 10
    # the peer's address too: on a cluster, the host whose process or link failed
    assert isinstance(errs[0], RingTimeout) and "rank 2 at 127.0.0.1:" in str(errs[0]), errs
    assert "spark.sparkdl_train.allreduce.timeout" in str(errs[0])


def test_ring_listeners_bind_in_the_port_range():
    """network.ports: every rank's listener takes a port of the range (below the system's ephemeral
    ports, which other tests' sockets take from)."""
    groups = ThreadGroup.create(3)
    ports = (24311, 24315)
    seen = []

    def work(r):
        link = rendezvous(groups[r], "127.0.0.1", SECRET, 10.0, 10.0, ports=ports)
        try:
            seen.append(link.to_next.getpeername()[1])
            buf = np.full(10, float(r), np.float32)
            ring.allreduce_sum(buf, link, r, 3)
            return buf
        finally:
            link.close()

    bufs, errs = run_ranks(3, work)
    assert errs == [None] * 3, errs
    assert len(set(seen)) == 3 and all(24311 <= p <= 24315 for p in seen), seen
    assert all(np.all(b == 3.0) for b in bufs)


def test_abort_names_the_failing_rank_on_its_neighbour():
    size = 3
    connect = tcp_ring(size)
    bufs = [np.ones(50_000, np.float32) for _ in range(size)]

    def work(r):
        link = connect(r)
        try:
            if r == 1:
                link.abort(1, "Traceback: ValueError: bad batch on rank 1")
                raise ValueError("bad batch on rank 1")
            ring.allreduce_sum(bufs[r], link, r, size)
        finally:
            link.close()

    _, errs = run_ranks(size, work)
    assert isinstance(errs[1], ValueError)
    assert isinstance(errs[2], PeerAborted) and errs[2].origin == 1 and "bad batch" in errs[2].detail
    assert isinstance(errs[0], (RingError, PeerAborted))  # its next rank went away


def test_out_of_step_frame_is_rejected():
    a, b = socket.socketpair()
    from sparkdl_train.allreduce.transport import TcpLink

    link = TcpLink(1, 2, a, b, timeout=2.0)
    b2 = link.from_prev
    peer = socket.socket(fileno=os.dup(a.fileno()))
    peer.sendall(FRAME.pack(MAGIC, 1, 7, 16) + b"\0" * 16)  # sequence 7, expected 1
    buf = np.empty(4, np.float32)
    with pytest.raises(RingError, match="out-of-step"):
        link.recv_into(memoryview(buf).cast("B"))
    peer.close()
    link.close()
    assert b2.fileno() == -1
