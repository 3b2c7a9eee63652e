"""The driver's rendezvous server for the allreduce ranks (sparkdl_train.driver.rendezvous) and
the executors' side of it (sparkdl_train.allreduce.barrier.DriverGroup), without Spark: ranks are
threads with a stand-in BarrierTaskContext."""

import socket
import time

import pytest
from helpers import run_ranks

from sparkdl_train import net
from sparkdl_train.allreduce.barrier import DriverGroup, RendezvousSettings
from sparkdl_train.allreduce.transport import RingError, RingTimeout
from sparkdl_train.driver.rendezvous import RendezvousServer


class TaskInfo:
    address = "127.0.0.1:7337"


class FakeBarrierContext:
    def __init__(self, rank, size, attempt=0):
        self.rank, self.size, self.attempt = rank, size, attempt

    def partitionId(self):  # noqa: N802
        return self.rank

    def getTaskInfos(self):  # noqa: N802
        return [TaskInfo()] * self.size

    def stageAttemptNumber(self):  # noqa: N802
        return self.attempt


@pytest.fixture
def server():
    secret = net.new_secret()
    srv = RendezvousServer("127.0.0.1", secret, timeout=5.0).start()
    srv.secret = secret
    yield srv
    srv.stop()


def group(server, rank, size, round_="epoch-0", timeout=5.0, secret=None, attempt=0):
    settings = RendezvousSettings("127.0.0.1", server.port, secret or server.secret, round_)
    return DriverGroup(FakeBarrierContext(rank, size, attempt), timeout, settings, connect_timeout=2.0)


def test_every_rank_gets_every_message_in_rank_order(server):
    out, errs = run_ranks(4, lambda r: group(server, r, 4).all_gather(f"rank {r}"))
    assert errs == [None] * 4
    assert out == [[f"rank {i}" for i in range(4)]] * 4
    assert group(server, 0, 4).address() == "127.0.0.1"
    # the next epoch is a round of its own; the finished one is forgotten
    out, errs = run_ranks(2, lambda r: group(server, r, 2, "epoch-1").all_gather(str(r)))
    assert out == [["0", "1"], ["0", "1"]] and server.completed == 2 and server._rounds == {}


def test_a_retried_stage_is_a_new_round():
    """Attempt 0 of an epoch lost a rank (it never joined): the server's timeout ends the round, and
    the rank that came learns which rank never did and where its executor is; the stage's retry meets
    in a round of its own and completes, whatever attempt 0 left waiting."""
    secret = net.new_secret()
    with RendezvousServer("127.0.0.1", secret, timeout=1.0) as srv:
        srv.secret = secret
        lone = run_ranks(1, lambda r: _expect_timeout(group(srv, 0, 2, timeout=1.0)))[0][0]
        assert lone < 3.0
        out, errs = run_ranks(2, lambda r: group(srv, r, 2, attempt=1).all_gather(str(r)))
        assert errs == [None, None] and out == [["0", "1"], ["0", "1"]]


def _expect_timeout(g):
    t0 = time.monotonic()
    with pytest.raises(RingTimeout, match=r"rank 0: rank 1 \(its executor at 127.0.0.1\) never reached the rendezvous through "
                                          r"the driver's rendezvous server at 127.0.0.1:\d+ within 1 s \(spark.sparkdl_train.allreduce.timeout\)"):
        g.all_gather("alone")
    return time.monotonic() - t0


def test_a_round_that_never_completes_fails_every_waiting_rank_in_bounded_time():
    secret = net.new_secret()
    with RendezvousServer("127.0.0.1", secret, timeout=1.0) as srv:
        srv.secret = secret
        t0 = time.monotonic()
        with pytest.raises(RingTimeout, match=r"rank 1: rank 0 \(its executor at 127.0.0.1\), rank 2 \(its executor at 127.0.0.1\) never"):
            group(srv, 1, 3, timeout=30.0).all_gather("x")  # the server gives up after its own 1 s
        assert time.monotonic() - t0 < 5.0
        assert srv._rounds == {}


def test_a_stopping_server_closes_the_rounds_it_holds():
    secret = net.new_secret()
    srv = RendezvousServer("127.0.0.1", secret, timeout=30.0).start()
    srv.secret = secret
    errs = []

    def wait():
        try:
            group(srv, 0, 2, timeout=30.0).all_gather("x")
        except RingError as exc:
            errs.append(exc)

    import threading

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 5
    while not srv._rounds and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    srv.stop()
    t.join(10)
    assert time.monotonic() - t0 < 5.0 and len(errs) == 1 and "closed the rendezvous" in str(errs[0]), errs


def test_peers_with_the_wrong_secret_or_a_false_rank_are_refused(server):
    with pytest.raises(RingError):
        group(server, 0, 1, secret=b"x" * 32).all_gather("intruder")
    # authenticated as worker 1 but claiming rank 0: the server refuses the frame
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    net.client_handshake(sock, 1, server.secret)
    net.send(sock, net.Msg.JOIN, {"round": "r", "rank": 0, "size": 2, "message": "m"})
    kind, meta, _, _ = net.recv(sock, 65536)
    sock.close()
    assert kind == net.Msg.ERROR and "claims rank 0" in meta["error"]
    assert server._rounds == {}


def test_an_unreachable_server_names_the_setting_to_use_instead():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    settings = RendezvousSettings("127.0.0.1", port, net.new_secret(), "epoch-0")
    with pytest.raises(RingError, match="allreduce.rendezvous=spark"):
        DriverGroup(FakeBarrierContext(0, 2), 5.0, settings, connect_timeout=2.0).all_gather("x")


def test_stopping_the_server_releases_the_waiting_ranks(server):
    import threading

    box = {}

    def wait():
        try:
            group(server, 0, 2, timeout=30.0).all_gather("x")
        except RingTimeout as exc:
            box["error"] = exc

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    server.stop()
    t.join(10)
    assert not t.is_alive() and "error" in box and time.monotonic() - t0 < 10


def _partial(rank, state=None):
    import numpy as np

    from sparkdl_train.merge import Partial, WeightedMean

    model = WeightedMean.of([np.asarray(a) for a in state], 1.0) if state is not None else WeightedMean()
    return Partial(samples=10 + rank, batches=1, model=model, metrics=[np.array([float(rank), 1.0])],
                   partitions={rank: {"rank": rank}}).to_bytes()


def test_ranks_hand_the_driver_each_epoch_of_a_stage_and_wait_for_its_answer():
    """Between two epochs of one barrier stage every rank sends its partial (rank 0's with the
    state); the watcher gets them all at once, and the ranks wait until the engine decides."""
    import threading

    import numpy as np

    from sparkdl_train.merge import Partial

    secret = net.new_secret()
    srv = RendezvousServer("127.0.0.1", secret, timeout=5.0, max_epoch_bytes=1 << 20).start()
    srv.secret = secret
    try:
        watch = srv.watch("stage-0.0")
        state = [np.arange(6, dtype=np.float32).reshape(2, 3)]
        answers = {}

        def rank(r, epoch):
            answers[(r, epoch)] = group(srv, r, 2, "stage-0.0").epoch_end(epoch, _partial(r, state if r == 0 else None))

        threads = [threading.Thread(target=rank, args=(r, 0)) for r in range(2)]
        for t in threads:
            t.start()
        epoch, blobs = watch.get(timeout=5)
        assert epoch == 0 and sorted(blobs) == [0, 1]
        merged = Partial.from_bytes(blobs[0]).merge(Partial.from_bytes(blobs[1]))
        assert merged.samples == 21 and np.array_equal(merged.model.result()[0], state[0])
        time.sleep(0.2)
        assert all(t.is_alive() for t in threads) and answers == {}  # waiting for the driver
        srv.decide("stage-0.0", 0, True)
        for t in threads:
            t.join(5)
        assert answers == {(0, 0): True, (1, 0): True} and srv.boundaries_passed == 1
        # the next epoch's end: the engine ends the stage instead (unwatch answers "stop")
        threads = [threading.Thread(target=rank, args=(r, 1)) for r in range(2)]
        for t in threads:
            t.start()
        assert watch.get(timeout=5)[0] == 1
        srv.unwatch("stage-0.0")
        for t in threads:
            t.join(5)
        assert answers[(0, 1)] is False and answers[(1, 1)] is False
        # a stage nobody watches any longer: told to stop at once
        assert group(srv, 0, 2, "stage-0.0").epoch_end(2, _partial(0)) is False
    finally:
        srv.stop()


def test_an_epoch_end_the_driver_never_answers_fails_within_the_timeout(server):
    """No decision within the rank's timeout: the rank fails naming the wait (never hangs)."""
    server.watch("stage-3.0")
    t0 = time.monotonic()
    with pytest.raises(RingTimeout, match="meeting at the end of epoch 4"):
        group(server, 0, 1, "stage-3.0", timeout=1.0).epoch_end(3, _partial(0))
    assert time.monotonic() - t0 < 4
