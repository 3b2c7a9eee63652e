"""The prepare job (sparkdl_train.driver.prepare, sparkdl_train.worker.prepare): the executors
rebuild a fit's model and trace its step while the driver still prepares, for the batch
signature the data's column types give; a model prepared for a signature the data does not have
is never used."""

from collections import OrderedDict

import numpy as np
import pytest
from helpers import make_mlp

from sparkdl_train import SparkModel
from sparkdl_train.data.batching import rebatch, row_signature
from sparkdl_train.driver.inputs import make_adapter
from sparkdl_train.driver.prepare import prepare_tasks
from sparkdl_train.model_io import get_metric_state, load_archive, serialize_model
from sparkdl_train.worker import runtime
from sparkdl_train.worker.prepare import PrepareTask
from sparkdl_train.worker.steps import run_steps
from sparkdl_train.worker.tasks import StepSettings


class _Ref:
    """A broadcast variable's stand-in (tasks read ``.value``)."""

    def __init__(self, value):
        self.value = value


@pytest.fixture
def fresh_cache(monkeypatch):
    monkeypatch.setattr(runtime, "_models", OrderedDict())


def _stream(x, y, batch_size):
    chunks = ((x[i:i + 50], y[i:i + 50], None) for i in range(0, len(x), 50))
    return rebatch(chunks, batch_size)


# -- the signature from column types ---------------------------------------------------------


def _two_inputs():
    import keras

    keras.utils.set_random_seed(1)
    num = keras.Input((3,), name="numeric")
    cat = keras.Input((2,), name="categorical", dtype="int32")
    emb = keras.layers.Flatten()(keras.layers.Embedding(10, 2)(cat))
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([num, emb]))
    model = keras.Model([num, cat], out)
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def _strings():
    import keras

    text = keras.Input((1,), dtype="string", name="word")
    ids = keras.layers.StringLookup(vocabulary=["a", "b"])(text)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(ids))
    model = keras.Model(text, out)
    model.compile("sgd", "binary_crossentropy")
    return model


def test_the_column_types_give_the_signature_of_the_batches_the_data_then_has(spark):
    """For every column kind a DataFrame can feed (arrays, scalars concatenated, ML vectors,
    strings, sample weights, several inputs), the zero-row batch built from the types alone has
    exactly the signature of the driver's sample; where only the data can tell (an array label,
    a transform), there is none."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    rows = [(i, [0.5 * i] * 64, 1.0 * i, 0.25, [0.1, 0.2, 0.3], [i % 10, 3], "a" if i % 2 else "b", Vectors.dense([0.1] * 64),
             [1.0, 0.0]) for i in range(12)]
    schema = T.StructType([T.StructField(name, kind) for name, kind in [
        ("id", T.LongType()), ("pixels", T.ArrayType(T.DoubleType())), ("x", T.DoubleType()), ("w", T.DoubleType()),
        ("num", T.ArrayType(T.FloatType())), ("cat", T.ArrayType(T.IntegerType())), ("word", T.StringType()),
        ("vec", VectorUDT()), ("onehot", T.ArrayType(T.DoubleType()))]])
    df = spark.createDataFrame(rows, schema)
    cases = [
        (make_mlp(), dict(feature_cols="pixels", label_col="id")),
        (make_mlp(), dict(feature_cols="vec", label_col="x", sample_weight_col="w")),
        (make_mlp(inputs=3), dict(feature_cols=["x", "w", "id"], label_col="id")),
        (_two_inputs(), dict(feature_cols={"numeric": "num", "categorical": "cat"}, label_col="x")),
        (_two_inputs(), dict(feature_cols=["num", "cat"], label_col="id")),
        (_strings(), dict(feature_cols="word", label_col="x")),
    ]
    for model, columns in cases:
        adapter = make_adapter(df, model, labelled=True, what="data", **columns)
        empty = adapter.empty_batch()
        assert empty is not None, columns
        assert row_signature(empty) == row_signature(adapter.sample(8)), columns
    assert make_adapter(df, make_mlp(), labelled=True, what="data", feature_cols="pixels",
                        label_col="onehot").empty_batch() is None  # an array label: its length is the data's
    assert make_adapter(df, make_mlp(), labelled=True, what="data", feature_cols="pixels", label_col="id",
                        transform=None).empty_batch() is not None


# -- the worker side ---------------------------------------------------------------------------


def test_a_prepared_model_is_the_one_the_first_task_trains_with_and_it_traces_nothing(digits, fresh_cache):
    x, y, _, _ = digits
    x, y = x[:300], y[:300].astype("float32")  # as a DataFrame's label column arrives: float32
    payload = serialize_model(make_mlp(seed=11))
    batch = (np.empty((0, 64), np.float32), np.empty((0,), np.float32), None)
    report = PrepareTask(_Ref(payload), StepSettings(batch_size=32), batch, ("train", "test"))(0)
    assert "error" not in report, report
    assert report["cached"] is False and report["traced"] == ["train", "test"]
    labels = row_signature(batch[1])
    assert runtime.is_cached(payload, None, labels) and not runtime.is_cached(payload, None, None)

    model = runtime.get_model(payload, None, labels)
    startup = {}
    assert run_steps(model, _stream(x, y, 32), training=True, startup=startup) == (300, 10)
    assert startup["traced"] is False  # the prepare task's trace
    assert runtime.get_model(payload, None, None) is model  # accepted once: an ordinary cached model now

    plain = load_archive(payload)  # a worker that was not prepared
    run_steps(plain, _stream(x, y, 32), training=True)
    for got, want in zip(model.get_weights() + get_metric_state(model), plain.get_weights() + get_metric_state(plain)):
        np.testing.assert_array_equal(got, want)


def test_a_model_prepared_for_another_signature_is_rebuilt_not_used(digits, fresh_cache):
    """Compiled metrics resolve "accuracy" from the labels' shape: prepared for one-hot labels it
    would count categorical accuracy on integer labels. The data's real signature drops it."""
    x, y, _, _ = digits
    payload = serialize_model(make_mlp(seed=12))
    guessed = (np.empty((0, 64), np.float32), np.empty((0, 10), np.float32), None)
    PrepareTask(_Ref(payload), StepSettings(batch_size=32), guessed)(0)
    assert runtime.peek_model(payload) is None  # built for a guess: no task without labels gets it
    prepared = runtime.peek_model(payload, None, row_signature(guessed[1]))
    assert [type(m).__name__ for m in prepared._compile_metrics.metrics] == ["CategoricalAccuracy"]

    real = row_signature(y[:1].astype("float32"))
    assert not runtime.is_cached(payload, None, real)
    model = runtime.get_model(payload, None, real)
    assert model is not prepared
    run_steps(model, _stream(x[:100], y[:100].astype("float32"), 32), training=True)
    assert [type(m).__name__ for m in model._compile_metrics.metrics] == ["SparseCategoricalAccuracy"]


def test_a_model_built_again_is_served_from_the_cache_unless_it_was_built_for_other_labels(digits, fresh_cache):
    """A notebook cell that builds the same architecture again ships another archive with the
    same digest: the worker keeps its rebuilt model and traced step, the new state is applied by
    the task. A cached model whose metrics were built for other labels is rebuilt."""
    x, y, _, _ = digits
    x, y = x[:200], y[:200].astype("float32")
    first, again = serialize_model(make_mlp(seed=21)), serialize_model(make_mlp(seed=22))
    assert first.archive != again.archive and first.digest == again.digest
    labels = row_signature(y[:1])
    model = runtime.get_model(first, None, labels)
    run_steps(model, _stream(x, y, 32), training=True)
    assert runtime.is_cached(again, None, labels) and runtime.get_model(again, None, labels) is model
    startup = {}
    run_steps(model, _stream(x, y, 32), training=True, startup=startup)
    assert startup["traced"] is False
    assert runtime.get_model(again, None, None) is model  # predict: any labels

    one_hot = row_signature(np.eye(10, dtype=np.float32)[:1])
    assert not runtime.is_cached(again, None, one_hot)
    assert runtime.get_model(again, None, one_hot) is not model


def test_prepare_jobs_run_two_waves_of_the_slots_bounded_per_worker():
    """Spark hands a task the longest-idle Python worker and queues a finished one last, so a
    second wave reaches the idle workers of a pool larger than the slots."""
    assert prepare_tasks(workers=1, slots=2) == 4 and prepare_tasks(workers=2, slots=2) == 4
    assert prepare_tasks(workers=2, slots=64) == 8  # at most 4 per worker on a large cluster
    assert prepare_tasks(workers=16, slots=8) == 16  # never fewer than the workers


def test_a_prepare_task_reports_a_model_it_cannot_rebuild_and_never_raises(fresh_cache):
    class Broken:
        @property
        def value(self):
            raise RuntimeError("the broadcast is gone")

    report = PrepareTask(Broken(), StepSettings(batch_size=8))(3)
    assert report["index"] == 3 and report["error"] == "RuntimeError: the broadcast is gone"
    assert "Traceback" in report["traceback"]


# -- in a fit ------------------------------------------------------------------------------------


def _frame(spark, x, y, shuffled=True):
    import pandas as pd

    df = spark.createDataFrame(pd.DataFrame({"pixels": list(x.astype("float64")), "label": y.astype("float64")}))
    return df.repartition(2) if shuffled else df.coalesce(1)  # coalesce keeps the rows' order


def _first_epoch_on_prepared_workers(sm):
    prepared = {tuple(w) for w in sm.stats.prepare["python_workers"]}
    infos = list(sm.stats.epochs[0].partitions.values())
    on = [i for i in infos if (i["host"], i["pid"]) in prepared]
    assert on, (prepared, [(i["host"], i["pid"]) for i in infos])  # Spark handed a prepared worker to a task
    return on


def test_a_dataframe_fit_trains_on_models_its_prepare_job_built_and_traced(spark, digits):
    x, y, xt, yt = digits
    df = _frame(spark, x, y)
    val = _frame(spark, xt, yt)
    columns = dict(feature_cols="pixels", label_col="label")
    runs = {}
    for prepare in (False, True):
        sm = SparkModel(make_mlp(seed=13), num_workers=2, worker_threads=1, prepare_workers=prepare)
        hist = sm.fit(df, epochs=2, batch_size=32, verbose=0, validation_data=val, **columns)
        runs[prepare] = (sm, hist.history)
    sm, history = runs[True]
    assert runs[False][0].stats.prepare is None and runs[False][0].stats.phases.get("prepare") is None
    stats = sm.stats.prepare
    assert stats["finished"] and stats["errors"] == 0 and stats["tasks"] == prepare_tasks(2, spark.sparkContext.defaultParallelism)
    assert stats["traced"] >= 1 and stats["kinds"] == ["test", "train"]
    for info in _first_epoch_on_prepared_workers(sm):
        assert info["startup"]["model_cached"] is True and info["startup"]["traced"] is False, info["startup"]
    # the same training: prepared workers change where the time goes, not one number
    for got, want in zip(sm.model.get_weights(), runs[False][0].model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert history.keys() == runs[False][1].keys()
    for key, values in history.items():
        assert values == pytest.approx(runs[False][1][key], rel=1e-6), key


def test_a_model_fed_a_text_column_is_traced_by_the_prepare_job_too(spark):
    """A string column (a StringLookup's input): its zero-row batch is a numpy object array, which Keras'
    symbolic build refuses; the prepare job still builds the metrics and traces the step, and the first epoch's
    tasks on the prepared workers trace nothing (they traced for seconds before: the prepare was skipped)."""
    import keras
    import pandas as pd

    rng = np.random.default_rng(5)
    city = rng.choice(["paris", "oslo", "rome", "lima"], 400)
    df = spark.createDataFrame(pd.DataFrame({"city": city, "label": (city == "oslo").astype("float64")})).repartition(2)
    text = keras.Input((1,), dtype="string", name="city")
    hot = keras.layers.StringLookup(vocabulary=["paris", "oslo", "rome", "lima"], output_mode="one_hot")(text)
    model = keras.Model(text, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(hot)))
    model.compile(keras.optimizers.Adam(0.1), "binary_crossentropy", metrics=["accuracy"])
    sm = SparkModel(model, num_workers=2, worker_threads=1)
    hist = sm.fit(df, epochs=3, batch_size=32, verbose=0, feature_cols="city", label_col="label")
    stats = sm.stats.prepare
    assert stats["errors"] == 0 and stats["traced"] >= 1 and stats["kinds"] == ["train"], stats
    for info in _first_epoch_on_prepared_workers(sm):
        assert info["startup"]["model_cached"] is True and info["startup"]["traced"] is False, info["startup"]
    assert hist.history["accuracy"][-1] == 1.0


def test_a_signature_the_data_does_not_have_costs_the_prepared_models_not_the_metrics(spark, digits, monkeypatch):
    from sparkdl_train.data import adapters

    x, y, xt, yt = digits
    df = _frame(spark, x, y, shuffled=False)
    expected = make_mlp(seed=14)
    expected.fit(x.astype("float32"), y.astype("float32"), epochs=1, batch_size=32, shuffle=False, verbose=0)

    original = adapters.DataFrameAdapter.empty_batch

    def column_guess(self):  # labels as a column of width 1: a trace that works, for another signature
        x0, _, w0 = original(self)
        return x0, np.empty((0, 1), np.float32), w0

    monkeypatch.setattr(adapters.DataFrameAdapter, "empty_batch", column_guess)
    sm = SparkModel(make_mlp(seed=14), num_workers=1, worker_threads=1, prepare_workers=True)
    hist = sm.fit(df, epochs=1, batch_size=32, shuffle=False, verbose=0, feature_cols="pixels", label_col="label")
    assert sm.stats.prepare["traced"] >= 1
    for info in _first_epoch_on_prepared_workers(sm):
        assert info["startup"]["model_cached"] is False  # dropped: prepared for labels of shape (n, 1)
    # sparse categorical accuracy, as single-process Keras counts it on these labels
    assert hist.history["accuracy"][0] == pytest.approx(expected.history.history["accuracy"][0], abs=1e-6)


def test_rdd_and_allreduce_fits_use_prepared_workers_too(spark, sc, digits):
    from sparkdl_train.data.rdd import to_simple_rdd

    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x.astype("float32"), y.astype("float32"), 2)
    runs = {}
    for prepare in (False, True):
        runs[prepare] = SparkModel(make_mlp(seed=15), num_workers=2, worker_threads=1, prepare_workers=prepare)
        runs[prepare].fit(rdd, epochs=1, batch_size=32, verbose=0)
    sm = runs[True]
    prepared = sm.stats.prepare
    assert prepared["finished"] and prepared["tasks"] == prepare_tasks(2, sc.defaultParallelism) and prepared["errors"] == 0
    assert prepared["kinds"] == ["train"]  # no column types: traced for the signature of the driver's sample
    for info in _first_epoch_on_prepared_workers(sm):
        assert info["startup"]["model_cached"] is True and info["startup"]["traced"] is False, info["startup"]
    for got, want in zip(sm.model.get_weights(), runs[False].model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    ar = SparkModel(make_mlp(seed=16), mode="allreduce", num_workers=2, worker_threads=1)
    ar.fit(_frame(spark, x, y), epochs=1, batch_size=32, verbose=0, feature_cols="pixels", label_col="label")
    assert ar.stats.prepare["kinds"] == ["fused"]
    for info in _first_epoch_on_prepared_workers(ar):
        assert info["startup"]["model_cached"] is True and info["startup"]["traced"] is False, info["startup"]


class _SampleNotAwaited:
    """A sample job stand-in that a prepare job must not wait for."""

    def wait(self, timeout=None):
        raise AssertionError("the prepare job waited for the sample")

    result = wait


def test_an_architecture_fitted_before_is_prepared_at_once_for_its_last_signature(sc, digits):
    """A later fit of an architecture starts its prepare job beside its sample job, for the
    signature its last fit's sample had (an RDD's column types tell none); one never fitted waits
    for the sample."""
    from sparkdl_train.data.rdd import to_simple_rdd
    from sparkdl_train.driver import prepare
    from sparkdl_train.driver.shared_refs import SharedRefs

    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x.astype("float32"), y.astype("float32"), 2)
    sm = SparkModel(make_mlp(seed=41), num_workers=2, worker_threads=1)
    sm.fit(rdd, epochs=1, batch_size=32, verbose=0)
    payload = serialize_model(make_mlp(seed=42))  # built again: the same architecture
    adapter = make_adapter(rdd, sm.model, labelled=True, what="data")
    refs = SharedRefs(payload)
    try:
        at_once = prepare.start_prepare(adapter, refs.payload_ref(adapter), StepSettings(batch_size=32), ("train",), 2,
                                        after=_SampleNotAwaited(), digest=payload.digest)
        report = at_once.wait(120)
        assert report["finished"] and report["errors"] == 0 and report["kinds"] == ["train"], report
        assert at_once.signature == row_signature((x[:1].astype("float32"), y[:1].astype("float32"), None))
        unknown = prepare.start_prepare(adapter, refs.payload_ref(adapter), StepSettings(batch_size=32), ("train",), 2,
                                        after=_SampleNotAwaited(), digest="never-fitted")
        assert unknown.wait(120) == {"tasks": unknown.tasks, "finished": False, "error": "AssertionError"}
    finally:
        refs.release()


def test_a_cancelled_call_submits_no_job_and_a_job_submitted_just_after_cancel_is_cancelled_too(sc):
    """SparkCall.cancel while its function still waits to submit (a prepare job waiting for the fit's
    sample, which failed): the function sees cancelled() and submits nothing. A function that submits
    anyway, just after the first cancel, has its job cancelled by the cancel's repeated calls, not
    left running to its end (the cause of a flaky 'left Spark jobs running' in test_bad_input)."""
    import threading
    import time

    from sparkdl_train.driver.background import SparkCall, cancelled

    tracker = sc.statusTracker()
    go = threading.Event()

    def polite():
        go.wait(10)
        return "skipped" if cancelled() else sc.parallelize(range(2), 2).map(lambda i: time.sleep(30)).collect()

    call = SparkCall(sc, polite, "sparkdl_train-test")
    t0 = time.monotonic()
    threading.Timer(0.3, go.set).start()
    call.cancel(5.0)
    assert call.result() == "skipped" and time.monotonic() - t0 < 5 and not tracker.getActiveJobsIds()
    assert not cancelled()  # outside a call

    go.clear()

    def late():
        go.wait(10)  # released after cancel() began: submits regardless
        return sc.parallelize(range(2), 2).map(lambda i: time.sleep(30)).collect()

    call = SparkCall(sc, late, "sparkdl_train-test")
    threading.Timer(0.5, go.set).start()
    t0 = time.monotonic()
    call.cancel(20.0)
    assert time.monotonic() - t0 < 20, "the late job ran on"
    with pytest.raises(Exception, match="(?i)cancel"):
        call.result()
    deadline = time.monotonic() + 10
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tracker.getActiveJobsIds()
