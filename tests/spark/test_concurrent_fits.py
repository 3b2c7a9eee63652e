"""Two fits at once on one SparkContext (two notebook users on a shared cluster): each gets the
result it would get alone; job groups, servers and cancellation never cross between them."""

import threading

import keras
import numpy as np
import pytest
from helpers import make_mlp, wait_until

from sparkdl_train import SparkModel, to_simple_rdd
from sparkdl_train.errors import FitCancelled

# Models are built before any thread starts: make_mlp seeds Keras' global random state, which two
# threads building models at once would interleave (different initial weights, not a fit's fault).

def averaging(rdd, model=None, seed=1):
    sm = SparkModel(model or make_mlp(seed=seed), mode="synchronous", num_workers=2, seed=3)
    sm.fit(rdd, epochs=3, batch_size=64, shuffle=False, verbose=0)
    return sm


def allreduce(rdd, model=None, seed=2):
    sm = SparkModel(model or make_mlp(seed=seed), mode="allreduce", num_workers=2, seed=3)
    sm.fit(rdd, epochs=3, batch_size=64, shuffle=False, verbose=0)
    return sm


def in_threads(*fns):
    """Run each fn on its own thread, all at once; return their results (re-raising the first error)."""
    out, errors = [None] * len(fns), [None] * len(fns)
    go = threading.Barrier(len(fns))

    def work(i, fn):
        try:
            go.wait(30)
            out[i] = fn()
        except BaseException as exc:  # noqa: BLE001
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a fit hung"
    return out, errors


def same_weights(a, b):
    """Equal to float rounding (rtol 1e-5): a task may run on any reused Python worker, whose
    TensorFlow thread pools were sized by the first fit it served (1 thread for a 2-worker fit on
    2 cores, 2 for a 1-worker fit), so bit-identity is not promised across fits."""
    return all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a.model.get_weights(), b.model.get_weights()))


def sdt_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-")]


def test_two_fits_from_two_threads_get_what_each_gets_alone(sc, digits):
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:800], y[:800], 2)
    solo_avg, solo_ar = averaging(rdd), allreduce(rdd)
    m_avg, m_ar = make_mlp(seed=1), make_mlp(seed=2)
    (avg, ar), errors = in_threads(lambda: averaging(rdd, m_avg), lambda: allreduce(rdd, m_ar))
    assert errors == [None, None], errors
    assert same_weights(avg, solo_avg) and same_weights(ar, solo_ar)
    assert avg.job_group != ar.job_group and avg.job_group.startswith("sparkdl_train-fit-")
    assert [e.samples for e in ar.stats.epochs] == [800] * 3 == [e.samples for e in avg.stats.epochs]
    assert sdt_threads() == []


def test_two_parameter_server_fits_at_once_have_their_own_servers(sc, digits):
    """Two asynchronous fits: two servers on two ports with two secrets; each counts only its own pushes."""
    x, y, _, _ = digits
    rdd_a = to_simple_rdd(sc, x[:600], y[:600], 2)
    rdd_b = to_simple_rdd(sc, x[600:1000], y[600:1000], 2)

    def ps(rdd, model):
        sm = SparkModel(model, mode="asynchronous", frequency="batch", num_workers=2)
        sm.fit(rdd, epochs=2, batch_size=50, verbose=0)
        return sm

    m_a, m_b = make_mlp(), make_mlp()
    (a, b), errors = in_threads(lambda: ps(rdd_a, m_a), lambda: ps(rdd_b, m_b))
    assert errors == [None, None], errors
    sa, sb = a.stats.server, b.stats.server
    assert sa["address"] != sb["address"]
    assert sum(sa["worker_samples"].values()) == 2 * 600 and sum(sb["worker_samples"].values()) == 2 * 400
    assert sa["updates"] == 2 * 12 and sb["updates"] == 2 * 8  # 300 rows / 50 and 200 rows / 50 per worker
    assert sa["rejected_connections"] == sb["rejected_connections"] == 0
    assert sdt_threads() == []


def test_cancelling_one_fit_leaves_the_other_running(sc, digits):
    """The survivor cancels the victim's job group from its own fit (a callback after its first
    epoch), then goes on to finish with the weights it gets alone."""
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:800], y[:800], 2)
    solo = averaging(rdd)
    started = threading.Event()
    victim = SparkModel(make_mlp(seed=5), mode="asynchronous", frequency=2, num_workers=2)
    survivor_model = make_mlp(seed=1)

    class Started(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            started.set()

    class CancelVictim(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                assert started.wait(120)
                wait_until(lambda: victim.job_group is not None)
                # the victim's group only, its next jobs too (Spark 4's cancelJobGroupAndFutureJobs,
                # not in PySpark): cancelJobGroup cancels running jobs and misses a fit between epochs
                sc._jsc.sc().cancelJobGroupAndFutureJobs(victim.job_group)

    def long_fit():
        with pytest.raises(FitCancelled):
            victim.fit(to_simple_rdd(sc, x, y, 2), epochs=200, batch_size=8, verbose=0, callbacks=[Started()])
        return "cancelled"

    def survivor_fit():
        sm = SparkModel(survivor_model, mode="synchronous", num_workers=2, seed=3)
        hist = sm.fit(rdd, epochs=3, batch_size=64, shuffle=False, verbose=0, callbacks=[CancelVictim()])
        return sm, hist

    (cancelled, (survivor, hist)), errors = in_threads(long_fit, survivor_fit)
    assert errors == [None, None], errors
    assert cancelled == "cancelled" and len(victim.stats.epochs) < 200
    assert len(hist.history["loss"]) == 3 and same_weights(survivor, solo)
    assert sdt_threads() == []
