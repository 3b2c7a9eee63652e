"""End-to-end behaviour on a real multi-process Spark (local[2]): numbers, not 'it ran'."""


import keras
import models
import numpy as np
import pytest
from helpers import make_mlp

from sparkdl_train import DataError, SparkModel, WorkerError, to_simple_rdd
from sparkdl_train.data.adapters import ArrayAdapter
from sparkdl_train.errors import ModelError


@pytest.fixture(scope="module", autouse=True)
def ship_test_models():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(models)
    yield
    cloudpickle.unregister_pickle_by_value(models)


def digits_df(spark, x, y, partitions=2):
    import pandas as pd

    pdf = pd.DataFrame({"id": np.arange(len(x)), "features": list(x.astype("float64")), "label": y.astype("float64")})
    return spark.createDataFrame(pdf).repartition(partitions)


def weights_close(a, b, atol=1e-5):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, atol=atol, rtol=1e-4)


# -- one worker must be exactly Keras' own fit ------------------------------------------

def test_one_worker_without_shuffle_equals_model_fit(digits):
    x, y, _, _ = digits
    ref = make_mlp()
    ref.fit(x, y, epochs=3, batch_size=64, shuffle=False, verbose=0)
    model = make_mlp()
    hist = SparkModel(model, num_workers=1).fit(ArrayAdapter(x, y), epochs=3, batch_size=64, shuffle=False, verbose=0)
    weights_close(model.get_weights(), ref.get_weights())
    assert hist.history["loss"][-1] == pytest.approx(ref.history.history["loss"][-1], rel=1e-4)


def test_averaging_keeps_optimizer_hyperparameters_and_counts_steps(digits):
    x, y, _, _ = digits
    model = make_mlp(lr=0.003)
    SparkModel(model, num_workers=3).fit(ArrayAdapter(x, y), epochs=4, batch_size=50, verbose=0)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.003)
    # iteration counter: max over workers per epoch (largest partition: ceil(480 / 50) = 10 steps)
    per_epoch = -(-int(np.ceil(len(x) / 3)) // 50)
    assert int(model.optimizer.iterations.numpy()) == 4 * per_epoch


def test_one_spark_worker_equals_model_fit(sc, digits):
    x, y, _, _ = digits
    ref = make_mlp()
    ref_hist = ref.fit(x, y, epochs=2, batch_size=64, shuffle=False, verbose=0)
    model = make_mlp()
    hist = SparkModel(model, num_workers=1).fit(to_simple_rdd(sc, x, y, 1), epochs=2, batch_size=64, shuffle=False, verbose=0)
    weights_close(model.get_weights(), ref.get_weights())
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-4)
    np.testing.assert_allclose(hist.history["accuracy"], ref_hist.history["accuracy"], atol=1e-6)


# -- learnable problem: within 2 points of single-process training ----------------------------

def test_dataframe_fit_accuracy_within_two_points_of_single_process(spark, digits):
    x, y, xt, yt = digits
    epochs = 12
    ref = make_mlp()
    ref.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    ref_acc = ref.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]

    model = make_mlp()
    sm = SparkModel(model, num_workers=2)
    hist = sm.fit(digits_df(spark, x, y), epochs=epochs, batch_size=32, verbose=0, validation_data=(xt, yt))
    acc = model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    assert ref_acc > 0.93
    assert acc >= ref_acc - 0.02, (acc, ref_acc)
    assert set(hist.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(hist.history["loss"]) == epochs
    # the driver model holds the merged weights the last validation was computed with
    assert hist.history["val_accuracy"][-1] == pytest.approx(acc, abs=1e-6)
    assert hist.history["loss"][0] > hist.history["loss"][-1]
    stats = sm.stats.as_dict()
    assert stats["num_workers"] == 2
    assert all(e["samples"] == len(x) for e in stats["epochs"])
    assert all(sorted(e["partitions"]) == [0, 1] for e in stats["epochs"])


def test_rdd_fit_learns_and_validation_split_holds_out_data(sc, digits):
    x, y, xt, yt = digits
    model = make_mlp()
    sm = SparkModel(model, num_workers=2, seed=3)
    hist = sm.fit(to_simple_rdd(sc, x, y), epochs=12, batch_size=32, verbose=0, validation_split=0.25)
    trained = sm.stats.epochs[0].samples
    assert 0.65 * len(x) < trained < 0.85 * len(x)  # ~75% trained, the rest validated
    assert hist.history["val_accuracy"][-1] > 0.9
    assert model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"] > 0.9


# -- predict and evaluate: equal to single process -------------------------------------------

def test_distributed_predict_equals_single_process(spark, sc, digits):
    x, y, _, _ = digits
    model = make_mlp()
    model.fit(x, y, epochs=1, verbose=0)
    sm = SparkModel(model)
    out = sm.predict(digits_df(spark, x, y, partitions=3), batch_size=50)
    assert out.columns == ["id", "features", "label", "prediction"]
    assert out.rdd.getNumPartitions() == 3  # stays distributed, nothing collected by predict
    rows = sorted(out.select("id", "prediction").collect())
    got = np.array([r.prediction for r in rows], dtype=np.float32)
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-6)

    rdd_pred = np.stack(sm.predict(sc.parallelize(list(x), 3), batch_size=64).collect())
    np.testing.assert_allclose(rdd_pred, model.predict(x, verbose=0), atol=1e-6)


def test_scalar_output_prediction_is_a_double_column(spark):
    xd, xc, y = models.planted_two_input(300)
    model = models.two_input()
    df = _two_input_df(spark, xd, xc, y)
    out = SparkModel(model).predict(df, feature_cols={"numeric": ["d0", "d1", "d2"], "cat": "cat"}, prediction_col="p")
    assert dict(out.dtypes)["p"] == "double"
    got = np.array([r.p for r in out.orderBy("id").select("p").collect()])
    np.testing.assert_allclose(got, model.predict({"numeric": xd, "cat": xc}, verbose=0)[:, 0], atol=1e-6)


def test_evaluate_is_globally_sample_weighted_and_auc_is_exact(spark):
    xd, xc, y = models.planted_two_input(2000, seed=4)
    model = models.two_input()
    model.fit({"numeric": xd, "cat": xc}, y, epochs=2, verbose=0)
    w = np.random.default_rng(1).uniform(0.1, 3.0, len(y)).astype("float32")
    df = _two_input_df(spark, xd, xc, y, w, partitions=3)
    sm = SparkModel(model)
    got = sm.evaluate(df, batch_size=128, return_dict=True, feature_cols={"numeric": ["d0", "d1", "d2"], "cat": "cat"}, sample_weight_col="w")
    want = model.evaluate({"numeric": xd, "cat": xc}, y, sample_weight=w, batch_size=128, verbose=0, return_dict=True)
    assert set(got) == {"loss", "accuracy", "auc"}
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    # Keras-style return: list in metrics order
    assert sm.evaluate(df, batch_size=128) == pytest.approx(
        model.evaluate({"numeric": xd, "cat": xc}, y, batch_size=128, verbose=0), rel=1e-4)


def _two_input_df(spark, xd, xc, y, w=None, partitions=2):
    import pandas as pd

    cols = {"id": np.arange(len(y))}
    for i in range(xd.shape[1]):
        cols[f"d{i}"] = xd[:, i].astype("float64")
    cols["cat"] = list(xc.astype("int64"))
    cols["label"] = y.astype("float64")
    if w is not None:
        cols["w"] = w.astype("float64")
    return spark.createDataFrame(pd.DataFrame(cols)).repartition(partitions)


# -- multi-input from named columns, incl. ML vectors ------------------------------------------

def test_multi_input_from_scalar_vector_and_array_columns(spark):
    from pyspark.ml.feature import VectorAssembler

    xd, xc, y = models.planted_two_input(3000, seed=2)
    df = _two_input_df(spark, xd, xc, y)
    df = VectorAssembler(inputCols=["d0", "d1"], outputCol="dvec").transform(df)  # ML vector column
    feature_cols = {"numeric": ["dvec", "d2"], "cat": "cat"}

    ref = models.two_input()
    ref.fit({"numeric": xd, "cat": xc}, y, epochs=8, batch_size=64, verbose=0)
    ref_auc = ref.evaluate({"numeric": xd, "cat": xc}, y, verbose=0, return_dict=True)["auc"]

    model = models.two_input()
    sm = SparkModel(model, num_workers=2)
    sm.fit(df, epochs=8, batch_size=64, verbose=0, feature_cols=feature_cols)
    res = sm.evaluate(df, return_dict=True)  # columns remembered from fit
    local = model.evaluate({"numeric": xd, "cat": xc}, y, verbose=0, return_dict=True)
    assert res["auc"] == pytest.approx(local["auc"], abs=1e-5)
    assert res["auc"] > ref_auc - 0.02, (res["auc"], ref_auc)


def test_subclassed_model_with_custom_objects_trains_on_executors(sc):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 8)).astype("float32")
    y = (x[:, 0] - x[:, 1] > 0).astype("float32")
    model = models.subclassed()
    sm = SparkModel(model, custom_objects=models.CUSTOM, num_workers=2)
    hist = sm.fit(to_simple_rdd(sc, x, y), epochs=6, batch_size=32, verbose=0)
    assert hist.history["auc"][-1] > 0.95
    assert model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"] > 0.9


# -- partitions: empty and short ones ---------------------------------------------------------

def test_empty_partitions_do_not_count_and_short_ones_train(sc, digits):
    x, y, _, _ = digits
    x, y = x[:300], y[:300]
    rows = list(zip(x, y))
    # 4 partitions: 0 holds 290 rows, 1 and 3 are empty, 2 holds 10 rows (< batch size)
    parts = {0: rows[:290], 1: [], 2: rows[290:], 3: []}
    rdd = sc.parallelize(range(4), 4).flatMap(lambda i: parts[i])
    model = make_mlp()
    sm = SparkModel(model, num_workers=4)
    sm.fit(rdd, epochs=1, batch_size=32, shuffle=False, verbose=0)
    e = sm.stats.epochs[0]
    assert e.empty_partitions == [1, 3]
    assert e.samples == 300 and e.partitions[2]["samples"] == 10 and e.partitions[2]["batches"] == 1

    # same as a 2-worker fit of the non-empty partitions: empty ones contributed nothing
    ref = make_mlp()
    rdd2 = sc.parallelize(range(2), 2).flatMap(lambda i: [rows[:290], rows[290:]][i])
    SparkModel(ref, num_workers=2).fit(rdd2, epochs=1, batch_size=32, shuffle=False, verbose=0)
    weights_close(model.get_weights(), ref.get_weights(), atol=1e-6)


def test_all_empty_data_is_a_clear_error(spark, mlp):
    df = spark.createDataFrame([], "features array<double>, label double")
    with pytest.raises(DataError, match="DataFrame is empty"):
        SparkModel(mlp()).fit(df, epochs=1, verbose=0)


# -- bad input fails on the driver with the column named ----------------------------------

def test_bad_columns_are_named(spark, mlp):
    df = spark.createDataFrame([([0.0] * 64, 1.0, "a")], "features array<double>, label double, s string")
    sm = SparkModel(mlp())
    with pytest.raises(DataError, match="'nope' .* not in the DataFrame"):
        sm.fit(df, feature_cols="nope", verbose=0)
    with pytest.raises(DataError, match="'s' .* type string"):
        sm.fit(df, feature_cols="features", label_col="s", verbose=0)
    short = spark.createDataFrame([([0.0] * 3, 1.0)], "features array<double>, label double")
    with pytest.raises(DataError, match=r"shape \(3,\).*expects \(64,\)"):
        sm.fit(short, feature_cols="features", label_col="label", verbose=0)


def test_ragged_array_on_an_executor_fails_fast_naming_the_column(spark, mlp):
    good = [([0.5] * 64, 1.0)] * 20
    df = spark.createDataFrame(good + [([0.5] * 10, 1.0)], "features array<double>, label double").coalesce(1)
    with pytest.raises((WorkerError, DataError), match="'features' is ragged"):
        SparkModel(mlp()).fit(df, verbose=0, batch_size=8, feature_cols="features", label_col="label")


def test_unserializable_model_fails_before_any_spark_job(sc, digits):
    x, y, _, _ = digits
    model = models.unshippable()  # a subclassed model without get_config: Keras cannot rebuild it from its config
    rdd = to_simple_rdd(sc, x[:, :8], (y > 4).astype("float32"))
    sc.setJobGroup("sdt-unserializable", "should stay empty")
    try:
        with pytest.raises(ModelError, match=r"(?s)cannot be rebuilt from its config.*SparkModel\(build_model"):
            SparkModel(model).fit(rdd, epochs=1, verbose=0)
        assert list(sc.statusTracker().getJobIdsForGroup("sdt-unserializable")) == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


# -- worker reuse --------------------------------------------------------------------------

def test_second_fit_in_same_session_continues_from_trained_weights(sc, digits):
    x, y, _, _ = digits
    model = make_mlp()
    sm = SparkModel(model, num_workers=2)
    rdd = to_simple_rdd(sc, x, y)
    first = sm.fit(rdd, epochs=2, batch_size=32, verbose=0).history["loss"]
    second = sm.fit(rdd, epochs=2, batch_size=32, verbose=0).history["loss"]
    assert second[0] < first[0]
    assert model.optimizer.iterations.numpy() > 0


@pytest.mark.parametrize("mode", ["synchronous", "allreduce"])
def test_dropout_draws_follow_the_seed_not_the_python_worker(sc, digits, mode):
    """A model with Dropout fitted three times from the same weights on the same (reused) Python
    workers: the same seed gives the same weights bit for bit (each task's dropout masks come from
    (seed, epoch, partition), not from what the worker built or drew before), another seed others."""
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:512], y[:512], 2)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    hidden = keras.layers.Dropout(0.3)(keras.layers.Dense(32, activation="relu")(inputs))
    base = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))
    fits = []
    for seed in (3, 3, 4):
        model = keras.models.clone_model(base)
        model.set_weights(base.get_weights())
        model.compile("sgd", "sparse_categorical_crossentropy")
        SparkModel(model, mode=mode, num_workers=2, seed=seed).fit(rdd, epochs=2, batch_size=32, verbose=0)
        fits.append(model.get_weights())
    for a, b in zip(fits[0], fits[1]):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(fits[0], fits[2]))


def test_callbacks_get_aggregated_epoch_logs_and_can_stop_training(digits):
    x, y, xt, yt = digits

    class StopAfterTwo(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append((epoch, sorted(logs)))
            if epoch == 1:
                self.model.stop_training = True

    cb = StopAfterTwo()
    model = make_mlp()
    hist = SparkModel(model, num_workers=2).fit(ArrayAdapter(x, y), epochs=10, batch_size=64, verbose=0, validation_data=(xt, yt), callbacks=[cb])
    assert len(hist.history["loss"]) == 2
    assert cb.seen == [(0, ["accuracy", "loss", "val_accuracy", "val_loss"]), (1, ["accuracy", "loss", "val_accuracy", "val_loss"])]
    assert cb.model is model


@pytest.mark.parametrize("mode", ["synchronous", "allreduce"])
def test_an_rdd_is_read_once_for_all_epochs_and_trains_bit_for_bit_as_read_every_epoch(sc, digits, mode):
    """data.cacheRdd: a fit of 3 epochs on an RDD of rows reads each row once (a job before the first epoch
    keeps the chunks the rows make, encoded and persisted) and ends with the weights of a fit that reads the
    rows every epoch, bit for bit; the persisted chunks are gone when the fit ends."""
    x, y, _, _ = digits
    keras.utils.set_random_seed(0)
    base = make_mlp()
    persisted = sc._jsc.getPersistentRDDs().size()
    got = {}
    for cache in (True, False):
        reads = sc.accumulator(0)

        def counted(row, reads=reads):
            reads.add(1)
            return row

        rdd = to_simple_rdd(sc, x[:600], y[:600], 2).map(counted)
        model = keras.models.clone_model(base)
        model.set_weights(base.get_weights())
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        sm = SparkModel(model, mode=mode, num_workers=2, seed=5, cache_rdd=cache)
        hist = sm.fit(rdd, epochs=3, batch_size=32, verbose=0)
        got[cache] = (model.get_weights(), hist.history["loss"], reads.value, dict(sm.stats.phases))
        assert sc._jsc.getPersistentRDDs().size() == persisted
    (w_on, loss_on, reads_on, phases_on), (w_off, loss_off, reads_off, phases_off) = got[True], got[False]
    for a, b in zip(w_on, w_off):
        np.testing.assert_array_equal(a, b)
    assert loss_on == loss_off and loss_on[-1] < loss_on[0]
    # each row once for the epochs (the driver's sample reads the first rows of a partition besides), against 3 times
    sample = reads_off - 3 * 600
    assert 0 <= sample <= 600 and reads_on == 600 + sample, (reads_on, reads_off)
    assert "read_once" in phases_on and "read_once" not in phases_off
