"""Live progress: worker reports, the per-epoch bar, Spark job descriptions/groups, cancellation."""

import math
import queue
import threading
import time

import keras
import numpy as np
import pytest
from helpers import make_mlp, spark_conf, spark_jobs

from sparkdl_train import SparkModel, net, to_simple_rdd
from sparkdl_train.driver.reports import EpochTally, Report, ReportServer, parse_report
from sparkdl_train.errors import FitCancelled
from sparkdl_train.worker.report import Reporter, ReportSettings

ENGINES = [("synchronous", None), ("asynchronous", 2), ("allreduce", None)]


# -- pure: the tally and report validation ---------------------------------------------------

def test_tally_keeps_latest_report_per_partition_and_weights_logs_by_samples():
    t = EpochTally(epoch=1, workers=3)
    assert not t.add(Report(0, 0, 100, 10, {"loss": 9.0}))  # another epoch: ignored
    t.add(Report(1, 0, 100, 10, {"loss": 1.0, "acc": 0.5}))
    t.add(Report(1, 1, 300, 30, {"loss": 2.0, "acc": 0.9}))
    t.add(Report(1, 0, 200, 20, {"loss": 0.5, "acc": 0.6}))  # newer report of partition 0 replaces the old
    t.add(Report(1, 2, 0, 0, {}))  # an empty partition counts as a worker but not in the means
    assert (t.samples, t.steps, t.active, t.finished) == (500, 50, 3, 0)
    logs = t.logs()
    assert logs["loss"] == pytest.approx((0.5 * 200 + 2.0 * 300) / 500)
    assert logs["acc"] == pytest.approx((0.6 * 200 + 0.9 * 300) / 500)
    t.add(Report(1, 1, 400, 40, {"loss": float("nan")}, done=True))
    assert (t.active, t.finished) == (2, 1)
    assert math.isnan(t.logs()["loss"])  # TerminateOnNaN must see a NaN anywhere


@pytest.mark.parametrize(
    "meta, problem",
    [
        ({"epoch": 0, "partition": 0, "samples": -1, "steps": 0}, "samples"),
        ({"epoch": 0, "partition": "0", "samples": 1, "steps": 0}, "partition"),
        ({"epoch": 0, "partition": 0, "samples": 1, "steps": True}, "steps"),
        ({"epoch": 0, "partition": 0, "samples": 1, "steps": 1, "logs": {"loss": "x"}}, "logs"),
        ({"epoch": 0, "partition": 0, "samples": 1, "steps": 1, "logs": [1.0]}, "logs"),
        ({"epoch": 0, "partition": 0, "samples": 1, "steps": 1, "done": "yes"}, "done"),
    ],
)
def test_bad_reports_are_refused(meta, problem):
    with pytest.raises(net.ProtocolError, match=problem):
        parse_report(meta)


def _tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    model.test_on_batch(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"))
    return model


def test_report_server_authenticates_and_queues_reports_then_shuts_down():
    secret = net.new_secret()
    server = ReportServer("127.0.0.1", secret).start()
    model = _tiny_model()
    try:
        host, port = server.address
        good = Reporter(ReportSettings(host, port, secret, epoch=3, interval=0.0), partition=5)
        good(1, 4, model)
        good(2, 8, model)
        good.finish(3, 12, model)
        intruder = Reporter(ReportSettings(host, port, b"x" * 32, epoch=3, interval=0.0), partition=6)
        intruder(1, 4, model)  # refused at the handshake: reporting stops, nothing raises
        assert intruder.sent == 0
        got = [server.events.get(timeout=10) for _ in range(3)]
        with pytest.raises(queue.Empty):  # the intruder's report never arrives
            server.events.get(timeout=0.2)
        assert [(r.partition, r.samples, r.steps, r.done) for r in got] == [(5, 4, 1, False), (5, 8, 2, False), (5, 12, 3, True)]
        assert set(got[0].logs) == {"loss", "accuracy"}
        assert got[0].logs["loss"] == pytest.approx(float(model.get_metrics_result()["loss"]))
    finally:
        server.stop()
    assert server.threads_alive() == 0


def test_report_server_drops_a_peer_sending_other_frames():
    secret = net.new_secret()
    server = ReportServer("127.0.0.1", secret).start()
    import socket

    try:
        with socket.create_connection(server.address, timeout=5) as s:
            net.client_handshake(s, 0, secret)
            net.send(s, net.Msg.PUSH, {"base_version": 0}, [np.zeros(3)])
            kind, meta, _, _ = net.recv(s, 4096)
            assert kind == net.Msg.ERROR and "REPORT" in meta["error"]
        assert server.received == 0
    finally:
        server.stop()


# -- Spark: reports during training ------------------------------------------------------------

class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events = []

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch", batch, dict(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(("epoch", epoch, dict(logs or {})))


@pytest.fixture(scope="module")
def big_digits(digits):
    x, y, _, _ = digits
    return np.tile(x, (8, 1)), np.tile(y, 8)


@pytest.mark.parametrize("mode, frequency", ENGINES)
def test_worker_reports_reach_batch_callbacks_during_each_epoch(sc, big_digits, mode, frequency):
    x, y = big_digits
    rec = Recorder()
    sm = SparkModel(make_mlp(), mode=mode, frequency=frequency, num_workers=2)
    # a report every 0.05 s (spark.sparkdl_train.progress.interval; 0.5 s by default): a warm
    # worker's epoch of these rows can take less than 0.5 s, which leaves one running report
    with spark_conf(sc, "spark.sparkdl_train.progress.interval", "0.05"):
        hist = sm.fit(to_simple_rdd(sc, x, y), epochs=2, batch_size=16, verbose=0, callbacks=[rec])
    epochs = [i for i, e in enumerate(rec.events) if e[0] == "epoch"]
    assert len(epochs) == 2
    for k, (lo, hi) in enumerate(zip([-1, *epochs[:-1]], epochs)):
        batches = rec.events[lo + 1 : hi]
        # several distinct running states arrived while the epoch ran, not one summary at its end
        assert len(batches) >= 3, batches
        assert len({round(b[2]["loss"], 6) for b in batches}) >= 2
        # the last report holds every worker's final running metrics: their sample-weighted
        # mean is the epoch's exact (merged) loss and accuracy
        last, epoch_logs = batches[-1][2], rec.events[hi][2]
        assert last["loss"] == pytest.approx(hist.history["loss"][k], rel=1e-5)
        assert last["accuracy"] == pytest.approx(epoch_logs["accuracy"], rel=1e-5)
    # every worker reported at least twice per epoch (running + final)
    assert sm.stats.reports >= 2 * 2 * 2


def test_verbose_1_draws_a_live_bar_per_epoch_and_verbose_0_is_silent(sc, big_digits, capfd, monkeypatch):
    from sparkdl_train.driver import progress

    monkeypatch.setattr(progress, "interactive", lambda: True)  # as in a terminal (pytest captures stderr)
    x, y = big_digits
    rdd = to_simple_rdd(sc, x, y)
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency=4, num_workers=2)
    sm.fit(rdd, epochs=2, batch_size=16, verbose=1)
    err = capfd.readouterr().err
    for epoch in (1, 2):
        assert f"Epoch {epoch}/2" in err
    assert "workers=2/2" in err and "loss=" in err and "sample/s" in err
    assert sm.stats.reports > 0
    # the second epoch's bar knows its total from the first epoch
    assert f"/{len(x) / 1000:.1f}k" in err

    sm.fit(rdd, epochs=1, batch_size=16, verbose=0)
    out = capfd.readouterr()
    assert "Epoch" not in out.err and "Epoch" not in out.out
    assert sm.stats.reports == 0  # no report server, no worker reports

    sm.fit(rdd, epochs=2, batch_size=16, verbose=2)
    out = capfd.readouterr()
    lines = [ln for ln in out.out.splitlines() if ln.startswith("Epoch ")]
    assert [ln.split(" - ")[0] for ln in lines] == ["Epoch 1/2", "Epoch 2/2"]
    assert "samples/s" in lines[0] and "loss:" in lines[0]


# -- Spark: job descriptions, groups, cancellation ------------------------------------------------

_jobs = spark_jobs


def _sdt_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train")]


def test_jobs_carry_epoch_descriptions_in_the_fits_job_group(sc, digits):
    x, y, _, _ = digits
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency=2, num_workers=2)
    sm.fit(to_simple_rdd(sc, x, y), epochs=3, batch_size=32, verbose=0)
    group = sm.job_group
    assert group.startswith("sparkdl_train-fit-")
    described = {d for d, g in _jobs(sc) if g == group}
    assert {"sparkdl_train fit: epoch 1/3", "sparkdl_train fit: epoch 2/3", "sparkdl_train fit: epoch 3/3"} <= described
    assert sc.getLocalProperty("spark.jobGroup.id") is None  # restored after the fit

    sc.setJobGroup("my-notebook-group", "mine")  # a caller's own group stays in charge
    try:
        sm.fit(to_simple_rdd(sc, x, y), epochs=1, batch_size=32, verbose=0)
        assert sm.job_group == "my-notebook-group"
        assert ("sparkdl_train fit: epoch 1/1", "my-notebook-group") in _jobs(sc)
        assert sc.getLocalProperty("spark.jobGroup.id") == "my-notebook-group"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


@pytest.mark.parametrize("how", ["job group", "cancel()"])
def test_cancelling_the_job_group_stops_the_fit_and_releases_its_servers(sc, big_digits, how):
    x, y = big_digits
    started = threading.Event()

    class Started(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            started.set()

    # a push every step: a worker pushes before it reports, so the first report (which starts
    # the cancel) comes after an update
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency="batch", num_workers=2)

    def cancel():
        if started.wait(120):
            if how == "cancel()":
                sm.cancel()
            else:
                sc.cancelJobGroup(sm.job_group)

    threading.Thread(target=cancel, daemon=True).start()
    t0 = time.perf_counter()
    with pytest.raises(FitCancelled, match="sparkdl_train fit: epoch 1/50 was cancelled"):
        sm.fit(to_simple_rdd(sc, x, y), epochs=50, batch_size=4, verbose=0, callbacks=[Started()])
    assert time.perf_counter() - t0 < 120
    assert _sdt_threads() == []  # parameter server and report server are gone
    assert sm.stats.server["updates"] > 0  # it did train before the cancel
    # the session is usable afterwards
    hist = SparkModel(make_mlp(), num_workers=2).fit(to_simple_rdd(sc, x[:500], y[:500]), epochs=1, verbose=0)
    assert len(hist.history["loss"]) == 1


def test_cancel_between_two_epochs_stops_the_fit_before_the_next(sc, digits):
    """Spark cancels only the jobs it is running: SparkModel.cancel() called while no epoch job
    runs (here from an epoch's end callback, on the fit's own thread) still stops the fit."""
    x, y, _, _ = digits
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency=4, num_workers=2)

    class CancelAfterFirst(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            sm.cancel()

    with pytest.raises(FitCancelled, match=r"cancelled \(SparkModel.cancel\) at epoch 2"):
        sm.fit(to_simple_rdd(sc, x, y), epochs=5, batch_size=32, verbose=0, callbacks=[CancelAfterFirst()])
    assert len(sm.stats.epochs) == 1 and sm.stats.server["updates"] > 0
    assert _sdt_threads() == []  # parameter server and report server are gone


@pytest.mark.parametrize("mode, frequency", [("synchronous", None), ("asynchronous", 2)])
def test_stop_training_set_mid_epoch_cancels_that_epoch(sc, big_digits, mode, frequency):
    x, y = big_digits

    class StopSoon(keras.callbacks.Callback):
        # the driver calls this once per report; a task reports after its first step, then at most every
        # 0.5 s, and pushes before it reports: at the fourth report one task has pushed (every 2 steps)
        def on_train_batch_end(self, batch, logs=None):
            if batch >= 3:
                self.model.stop_training = True

    model = make_mlp()
    before = [w.copy() for w in model.get_weights()]
    sm = SparkModel(model, mode=mode, frequency=frequency, num_workers=2)
    # rows read slowly (1 ms each: 5.7 s a task) and not shuffled (a shuffle buffer would read the
    # whole partition before the first step), so that the fourth report comes mid-epoch however fast
    # the steps (a warm worker's epoch of these rows takes 0.45 s), and a task Spark is told to kill
    # outlives spark.python.task.killTimeout (2 s: an averaging task talks to no server that could
    # end it sooner)
    slow = to_simple_rdd(sc, x, y).map(lambda row: (time.sleep(0.001), row)[1])
    hist = sm.fit(slow, epochs=5, batch_size=4, shuffle=False, verbose=0, callbacks=[StopSoon()])
    assert len(hist.history["loss"]) == 1
    last = sm.stats.epochs[-1]
    assert last.interrupted and 0 < last.samples < len(x)
    moved = any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    # a parameter server holds the latest weights; the averaging engine keeps the epoch's start
    assert moved == (mode == "asynchronous")
