"""Parameter server without Spark: update rules, protocol hardening, concurrency, shutdown."""

import socket
import struct
import threading
import time

import numpy as np
import pytest
from helpers import wait_until

from sparkdl_train import net
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import RoundTimeout, ServerState, straggler

W = [np.zeros((4, 3), np.float32), np.zeros(3, np.float32)]


def ones(k=1.0):
    return [np.full(w.shape, k, np.float32) for w in W]


# -- update rules ----------------------------------------------------------------------

def test_async_applies_each_delta_and_records_staleness():
    s = ServerState(W, "asynchronous")
    s.begin_epoch(2)
    s.join(0), s.join(1)
    s.push(0, 0, ones(1), 10)
    snap = s.push(1, 0, ones(2), 10)  # based on version 0, applied at version 1: staleness 1
    assert snap.version == 2 and np.all(snap.arrays[0] == 3)
    st = s.stats.as_dict()
    assert st["updates"] == 2 and st["mean_staleness"] == 0.5 and st["worker_steps"] == {0: 1, 1: 1}


def test_stats_count_workers_active_at_each_push():
    """mean_concurrency and solo_updates show whether asynchronous workers really overlapped."""
    s = ServerState(W, "asynchronous")
    s.begin_epoch(2)
    s.join(0)
    s.push(0, 0, ones(), 1)  # alone: the other worker has not joined yet
    s.join(1)
    s.push(0, 1, ones(), 1)
    s.push(1, 1, ones(), 1)
    s.leave(0)
    s.push(1, 3, ones(), 1)  # alone again
    st = s.stats.as_dict()
    assert st["solo_updates"] == 2 and st["mean_concurrency"] == (1 + 2 + 2 + 1) / 4


def test_async_pull_never_sees_a_half_applied_update():
    s = ServerState(W, "asynchronous")
    before = s.pull()  # being sent
    for k in range(5):
        s.release(s.push(0, k, ones(1), 1))
    assert np.all(before.arrays[0] == 0) and before.version == 0  # never recycled while in use
    s.release(before)
    assert before.snap.arrays is None  # recycled once released


def test_async_steady_state_recycles_buffers():
    s = ServerState(W, "asynchronous")
    seen = set()
    for k in range(10):
        snap = s.push(0, k, ones(1), 1)
        seen.add(id(snap.arrays[0]))
        s.release(snap)
    assert len(seen) <= 3  # current + at most two free buffer sets, not one allocation per update
    assert np.all(s.snapshot()[0] == 10)


def test_sync_applies_weighted_mean_once_all_workers_pushed():
    s = ServerState(W, "synchronous", join_timeout=5)
    s.begin_epoch(2)
    s.join(0), s.join(1)
    out = {}

    def push(worker, k, n):
        out[worker] = s.push(worker, 0, ones(k), n)

    t = threading.Thread(target=push, args=(0, 1.0, 30))
    t.start()
    wait_until(lambda: s.waiting() == 1, what="worker 0 to wait for worker 1's push")
    assert t.is_alive() and 0 not in out
    push(1, 4.0, 10)
    t.join(5)
    assert out[0].version == out[1].version == 1
    np.testing.assert_allclose(out[0].arrays[0], (1.0 * 30 + 4.0 * 10) / 40)
    assert s.stats.rounds == 1


def _rounds_held_by_worker_1(s, rounds=4, hold=0.05):
    """``rounds`` synchronous rounds in which worker 0 pushes first and waits ``hold`` s for worker 1's push."""
    for _ in range(rounds):
        t = threading.Thread(target=s.push, args=(0, s.version, ones(1.0), 5))
        t.start()
        wait_until(lambda: s.waiting() == 1, what="worker 0 to wait in the round")
        time.sleep(hold)
        s.push(1, s.version, ones(1.0), 5)
        t.join(5)


def test_sync_rounds_name_the_worker_they_waited_for():
    """Every round waits for worker 1's push: it comes last in each, the others' wait is counted, and
    straggler() names it; a worker leaving completes a round without counting as its last."""
    s = ServerState(W, "synchronous", join_timeout=5)
    s.begin_epoch(2)
    s.join(0), s.join(1)
    _rounds_held_by_worker_1(s)
    st = s.stats.as_dict()
    assert st["last_in_round"] == {1: 4} and st["held_seconds"][1] >= 0.2, st
    assert straggler(st["last_in_round"], st["held_seconds"], st["rounds"], seconds=0.5) == (1, 4, st["held_seconds"][1])
    # not when the waits are a small share of the pass, nor over too few rounds, nor when the last one varies
    assert straggler(st["last_in_round"], st["held_seconds"], st["rounds"], seconds=100.0) is None
    assert straggler({1: 3}, {1: 9.0}, 3, seconds=10.0) is None
    assert straggler({0: 2, 1: 2}, {0: 5.0, 1: 5.0}, 4, seconds=10.0) is None
    t = threading.Thread(target=s.push, args=(0, s.version, ones(1.0), 5))
    t.start()
    wait_until(lambda: s.waiting() == 1, what="worker 0 to wait in the round")
    s.leave(1)
    t.join(5)
    assert s.stats.as_dict()["last_in_round"] == {1: 4} and s.stats.rounds == 5


def test_sync_rounds_span_leaves_out_what_comes_before_the_first_push():
    """The rounds' span (the straggler's measure) runs from an epoch's first push to its last round's end:
    a slow start before the first push (a job's launch, the first step's trace) is not in it, so the same
    waits name the same straggler however long the epoch took to start."""
    s = ServerState(W, "synchronous", join_timeout=5)
    for epoch in range(2):
        s.begin_epoch(2)
        s.join(0), s.join(1)
        before = s.stats.as_dict()
        delay = 0.3 if epoch else 0.0  # the second epoch starts slowly
        started = time.monotonic()
        time.sleep(delay)
        _rounds_held_by_worker_1(s)
        elapsed = time.monotonic() - started
        st = s.stats.as_dict()
        span = st["round_span_seconds"] - before["round_span_seconds"]
        held = st["held_seconds"][1] - before["held_seconds"].get(1, 0.0)
        assert held <= span + 1e-3 and span <= elapsed - delay + 1e-3, (epoch, held, span, elapsed)
        last = {1: st["last_in_round"][1] - before["last_in_round"].get(1, 0)}
        assert straggler(last, {1: held}, 4, span) == (1, 4, held), (epoch, held, span)


def test_sync_round_completes_when_the_other_worker_finishes():
    s = ServerState(W, "synchronous")
    s.begin_epoch(2)
    s.join(0), s.join(1)
    res = []
    t = threading.Thread(target=lambda: res.append(s.push(0, 0, ones(2), 5)))
    t.start()
    wait_until(lambda: s.waiting() == 1, what="worker 0 to wait in the round")
    s.leave(1)  # worker 1 ran out of data
    t.join(5)
    assert res and np.all(res[0].arrays[0] == 2)


def test_sync_round_times_out_instead_of_hanging_naming_the_worker_it_waited_for_and_its_host():
    s = ServerState(W, "synchronous", round_timeout=0.5)
    s.begin_epoch(3)
    s.join(0, "10.0.0.11"), s.join(1, "10.0.0.12"), s.join(2)
    other = []

    def push_2():  # worker 2 pushes too; worker 1 never does
        try:
            s.push(2, 0, ones(), 1)
        except RoundTimeout as exc:
            other.append(str(exc))

    t = threading.Thread(target=push_2, daemon=True)
    t.start()
    with pytest.raises(RoundTimeout) as err:
        s.push(0, 0, ones(), 1)
    t.join(5)
    # whichever wait timed out first, the other fails with it at once
    got = sorted([str(err.value), *other])
    assert len(got) == 2 and got[1] == "this epoch already failed: " + got[0], got
    assert got[0] == ("synchronous round 0 timed out after 0.5 s (spark.sparkdl_train.ps.roundTimeout): worker 1 "
                              "(its executor at 10.0.0.12) did not push in time; that host, its link or its executor is down or stuck")


def test_a_round_waits_for_a_worker_still_starting_as_long_as_the_join_window_not_the_round_timeout():
    """ps.roundTimeout shorter than a worker's start: the first round waits for it until ps.joinTimeout
    (from the epoch's start), then goes on without it, and a worker that connects within it takes part."""
    s = ServerState(W, "synchronous", round_timeout=0.2, join_timeout=0.8)
    s.begin_epoch(2)
    s.join(0)
    late = threading.Timer(0.4, lambda: (s.join(1), s.push(1, 0, ones(), 1)))
    late.start()
    t = time.monotonic()
    reply = s.push(0, 0, ones(), 1)  # no RoundTimeout at 0.2 s: worker 1 may still connect
    late.join(5)
    assert 0.35 < time.monotonic() - t < 0.8 and s.stats.rounds == 1 and np.all(reply.arrays[0] == 1)
    s.begin_epoch(2)
    s.join(0)  # worker 1 never connects: the round goes on without it once the window closes
    t = time.monotonic()
    s.push(0, 0, ones(), 1)
    assert 0.7 < time.monotonic() - t < 1.5 and s.stats.rounds == 2


def test_a_round_timeout_past_the_join_window_names_only_the_workers_it_waited_for():
    s = ServerState(W, "synchronous", round_timeout=0.2, join_timeout=0.0)
    s.begin_epoch(3)
    s.join(0, "10.0.0.11"), s.join(1, "10.0.0.12")  # worker 2 never connects (not waited for); worker 1 never pushes
    with pytest.raises(RoundTimeout, match=r": worker 1 \(its executor at 10.0.0.12\) did not push in time;"):
        s.push(0, 0, ones(), 1)


def test_after_a_round_timed_out_a_retried_push_fails_with_that_timeout_not_as_a_second_push():
    """Spark retries a failed task: the retry of the worker whose wait timed out pushes into the same
    round again, and must learn why the epoch failed (not that it pushed twice)."""
    s = ServerState(W, "synchronous", round_timeout=0.3)
    s.begin_epoch(2)
    s.join(0, "10.0.0.11"), s.join(1, "10.0.0.12")
    with pytest.raises(RoundTimeout):
        s.push(0, 0, ones(), 1)
    t = time.monotonic()
    with pytest.raises(RoundTimeout, match=r"^this epoch already failed: synchronous round 0 timed out after 0.3 s .*"
                                           r"worker 1 \(its executor at 10.0.0.12\) did not push in time"):
        s.push(0, 0, ones(), 1)
    assert time.monotonic() - t < 0.2  # at once, not after another timeout
    s.begin_epoch(2)  # a new epoch starts clean
    s.join(0), s.join(1)
    done = threading.Thread(target=lambda: s.push(1, 0, ones(), 1), daemon=True)
    done.start()
    assert s.push(0, 0, ones(), 1).arrays[0].shape == W[0].shape
    done.join(5)


def test_a_staleness_wait_that_times_out_names_the_slow_worker():
    s = ServerState(W, "asynchronous", staleness_bound=0, round_timeout=0.3)
    s.begin_epoch(2)
    s.join(0, "10.0.0.11"), s.join(1, "10.0.0.12")
    s.push(0, 0, ones(), 1)
    with pytest.raises(RoundTimeout, match=r"staleness bound 0\) timed out after 0.3 s \(spark.sparkdl_train.ps.roundTimeout\): "
                                           r"worker 1 \(its executor at 10.0.0.12\) did not push in time"):
        s.push(0, 1, ones(), 1)


def test_staleness_bound_makes_a_fast_worker_wait():
    s = ServerState(W, "asynchronous", staleness_bound=1, round_timeout=5)
    s.begin_epoch(2)
    s.join(0), s.join(1)
    s.push(0, 0, ones(), 1)
    s.push(0, 1, ones(), 1)  # 2 ahead of worker 1 after this one would exceed... clock 1 vs 0: allowed
    done = threading.Event()
    threading.Thread(target=lambda: (s.push(0, 2, ones(), 1), done.set())).start()
    wait_until(lambda: s.waiting() == 1, what="the staleness bound to hold worker 0")
    assert not done.is_set()  # clock 2 vs 0 > bound 1
    s.push(1, 0, ones(), 1)
    assert done.wait(5)
    assert s.stats.staleness_waits == 1 and s.stats.wait_seconds > 0


def test_hogwild_adds_in_place_without_losing_updates_sequentially():
    s = ServerState(W, "hogwild")
    for i in range(5):
        s.push(i % 2, i, ones(1), 1)
    assert np.all(s.snapshot()[0] == 5) and s.stats.updates == 5


@pytest.mark.parametrize("shards", [1, 2])
def test_hogwild_pushes_from_many_threads_lose_no_row_addition(shards):
    """Hogwild! assumes component-wise atomic additions: concurrent pushes to the same rows of a table all land."""
    from sparkdl_train.ps.state import SparseRows

    s = ServerState([np.zeros((6, 4), np.float32), np.zeros(2, np.float32)], "hogwild", sparse=[0], shards=shards)
    ids, pushes, threads = np.array([0, 2, 3, 5]), 400, 4

    def worker(w):
        for _ in range(pushes):
            s.release(s.push(w, 0, [SparseRows(ids, np.ones((4, 4), np.float32)), np.zeros(2, np.float32)], 1))

    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two numpy calls, as a busy server's do now and then
    try:
        ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    table = s.snapshot()[0]
    assert np.all(table[ids] == pushes * threads) and np.all(table[[1, 4]] == 0)


def test_bad_deltas_are_rejected():
    s = ServerState(W, "asynchronous")
    with pytest.raises(ValueError, match="1 arrays, the model has 2"):
        s.push(0, 0, [np.zeros((4, 3), np.float32)], 1)
    with pytest.raises(ValueError, match="shape"):
        s.push(0, 0, [np.zeros((3, 3), np.float32), np.zeros(3, np.float32)], 1)
    with pytest.raises(ValueError, match="floating"):
        s.push(0, 0, [np.zeros((4, 3), np.int32), np.zeros(3, np.float32)], 1)


# -- protocol over real sockets ------------------------------------------------------------

@pytest.fixture
def server():
    srv = ParameterServer(ServerState(W, "asynchronous"), "127.0.0.1", b"k" * 32).start()
    yield srv
    srv.stop()


def _client(srv, worker=0, secret=b"k" * 32):
    return PSClient(*srv.address, secret, worker, timeout=10)


def test_push_pull_roundtrip_and_byte_counts(server):
    with _client(server) as c:
        v, w = c.pull()
        assert v == 0 and [a.shape for a in w] == [a.shape for a in W]
        v, w = c.push(ones(0.5), v, 8)
        assert v == 1 and np.all(w[1] == 0.5)
        c.done()
    st = server.state.stats.as_dict()
    assert st["bytes_in"] >= 60 * 4 and st["bytes_out"] >= 2 * 60  # payload floats both ways
    assert st["worker_samples"] == {0: 8}


def test_wrong_secret_is_refused_and_server_keeps_serving(server):
    with pytest.raises(net.AuthError):
        _client(server, secret=b"x" * 32)
    with _client(server) as c:
        assert c.pull()[0] == 0
    wait_until(lambda: server.state.stats.rejected_connections == 1, what="the server to count the refusal")  # on its own thread


def _closed(s):
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def _raw(server):
    s = socket.create_connection(server.address, timeout=5)
    return s


def test_garbage_truncated_and_oversized_frames_are_rejected(server):
    s = _raw(server)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 20)
    assert _closed(s)  # closed, nothing served
    s.close()
    s = _raw(server)  # pre-auth frame above the 4 KiB limit: refused before allocating
    s.sendall(net.HEADER.pack(net.MAGIC, net.VERSION, int(net.Msg.HELLO), 0, 1 << 40))
    assert _closed(s)
    s.close()
    s = _raw(server)  # truncated: header promises 100 bytes, sends 10 and hangs up
    s.sendall(net.HEADER.pack(net.MAGIC, net.VERSION, int(net.Msg.HELLO), 0, 100) + b"0123456789")
    s.close()
    s = _raw(server)  # unknown type
    s.sendall(struct.pack("<4sBBHQ", net.MAGIC, net.VERSION, 99, 0, 0))
    assert _closed(s)
    s.close()
    wait_until(lambda: server.state.stats.rejected_connections == 4, what="the server to refuse all four")
    with _client(server) as c:
        assert c.pull()[0] == 0
    assert server.state.stats.rejected_connections == 4


def test_authenticated_but_malformed_push_is_dropped(server):
    c = _client(server)
    with pytest.raises(net.ProtocolError, match="shape"):
        c.push([np.zeros(7, np.float32)] * 2, 0, 1)
    c.close()
    with _client(server, 1) as c2:
        assert c2.pull()[0] == 0


def test_concurrent_clients_all_updates_applied(server):
    errors = []

    def run(worker):
        try:
            with _client(server, worker) as c:
                v, _ = c.pull()
                for _ in range(20):
                    v, _ = c.push(ones(1), v, 1)
                c.done()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert server.state.stats.updates == 120
    assert np.all(server.state.snapshot()[0] == 120)


def test_stop_releases_port_and_threads():
    srv = ParameterServer(ServerState(W, "synchronous"), "127.0.0.1", b"s" * 32).start()
    srv.state.begin_epoch(2)
    c = PSClient(*srv.address, b"s" * 32, 0, timeout=10)
    result = []
    t = threading.Thread(target=lambda: result.append(_try(lambda: c.push(ones(), 0, 1))))
    t.start()
    wait_until(lambda: srv.state.waiting() == 1, what="worker 0 to block in a round waiting for worker 1")
    srv.stop()
    t.join(5)
    assert not t.is_alive() and isinstance(result[0], Exception)  # released, not hung
    assert srv.threads_alive() == 0
    with pytest.raises(OSError):
        socket.create_connection(srv.address, timeout=1)


def test_stop_wakes_the_accept_loop_instead_of_waiting_for_its_poll():
    srv = ParameterServer(ServerState(W, "synchronous"), "127.0.0.1", b"s" * 32).start()
    srv._listener.settimeout(None)  # from its next accept() on, only stop() can wake the accept loop
    wait_until(lambda: srv._threads[0].is_alive(), what="the accept loop")
    time.sleep(0.6)  # past the poll already under way, into a blocking accept()
    srv.stop(timeout=5)
    assert srv.threads_alive() == 0


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return exc
