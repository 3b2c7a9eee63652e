"""The bad-input catalogue: every case fails with an error naming the problem, quickly, with no
Spark job left running and no server thread left behind."""

import contextlib
import os
import threading
import time

import keras
import numpy as np
import pytest
from helpers import settle, spark_conf

from sparkdl_train import SparkModel, net
from sparkdl_train.config import EngineConfig
from sparkdl_train.driver.engines.slots import check_barrier_launch
from sparkdl_train.errors import ConfigError, DataError, ModelError, WorkerError
from sparkdl_train.ps.client import PSClient
from sparkdl_train.ps.server import ParameterServer
from sparkdl_train.ps.state import ServerState

N = 200
FAST = 90  # seconds: the slowest case (a failing Spark job) stays far below this


@pytest.fixture(scope="module")
def df(spark):
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.random((N, 4))
    y = (x.sum(1) > 2).astype("int64")
    pdf = pd.DataFrame({"features": list(x), "label": y, "name": ["a"] * N, "w": np.ones(N)})
    return spark.createDataFrame(pdf).repartition(2).cache()


def small(seed=0, compile=True):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(2, activation="softmax")])
    if compile:
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def frame(spark, rows):
    return spark.createDataFrame(rows, "features array<double>, label long")


class Unshippable(keras.layers.Layer):  # an object argument and no get_config: Keras cannot rebuild it from its config
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def call(self, x):
        return self.fn(x)


class FakeConf(dict):
    """Stands for a SparkConf: ``get`` and ``getAll``."""

    def getAll(self):  # noqa: N802 - SparkConf's name
        return list(self.items())


class FakeSC:
    """Stands for a SparkContext whose conf enables dynamic allocation."""

    master = "yarn"

    def getConf(self):
        return FakeConf({"spark.dynamicAllocation.enabled": "true"})


def _uncompiled(spark, df):
    SparkModel(small(compile=False))


def _mode(spark, df):
    SparkModel(small(), mode="gossip")


def _frequency(spark, df):
    SparkModel(small(), mode="asynchronous", frequency="hourly")


def _frequency_allreduce(spark, df):
    SparkModel(small(), mode="allreduce", frequency=4)


def _batch_size_zero(spark, df):
    SparkModel(small()).fit(df, batch_size=0, verbose=0)


def _batch_size_negative(spark, df):
    SparkModel(small()).fit(df, batch_size=-32, verbose=0)


def _epochs_zero(spark, df):
    SparkModel(small()).fit(df, epochs=0, verbose=0)


def _missing_feature_column(spark, df):
    SparkModel(small()).fit(df, feature_cols="pixels", verbose=0)


def _missing_label_column(spark, df):
    SparkModel(small()).fit(df, label_col="target", verbose=0)


def _missing_weight_column(spark, df):
    SparkModel(small()).fit(df, sample_weight_col="weights", verbose=0)


def _non_numeric_column(spark, df):
    SparkModel(small()).fit(df, feature_cols="name", verbose=0)


def _unknown_input_name(spark, df):
    SparkModel(small()).fit(df, feature_cols={"dense": "features"}, verbose=0)


def _ragged_arrays(spark, df):
    rows = [([0.1, 0.2, 0.3, 0.4], 0)] * 20 + [([0.1, 0.2], 1)] * 20
    SparkModel(small(), num_workers=1).fit(frame(spark, rows).coalesce(1), verbose=0)


def _wrong_feature_width(spark, df):
    rows = [([0.1] * 7, i % 2) for i in range(40)]
    SparkModel(small(), num_workers=1).fit(frame(spark, rows), verbose=0)


def _label_shape_mismatch(spark, df):
    rows = [([0.1, 0.2, 0.3, 0.4], [1, 0, 1]) for _ in range(40)]
    data = spark.createDataFrame(rows, "features array<double>, label array<long>")
    SparkModel(small(), num_workers=1).fit(data, verbose=0)


def _nan_features(spark, df):
    rows = [([0.1, 0.2, 0.3, 0.4], i % 2) for i in range(60)]
    rows[37] = ([0.1, float("nan"), 0.3, 0.4], 1)
    SparkModel(small(), num_workers=1).fit(frame(spark, rows).coalesce(1), batch_size=16, verbose=0)


def _inf_label_weight(spark, df):
    rows = [([0.1, 0.2, 0.3, 0.4], i % 2, 1.0 if i != 5 else float("inf")) for i in range(30)]
    data = spark.createDataFrame(rows, "features array<double>, label long, w double").coalesce(1)
    SparkModel(small(), num_workers=1).fit(data, sample_weight_col="w", verbose=0)


def _empty_dataframe(spark, df):
    SparkModel(small()).fit(df.limit(0), verbose=0)


def _unsupported_data(spark, df):
    SparkModel(small()).fit([[0.1, 0.2, 0.3, 0.4]], verbose=0)


def _rdd_rows_not_pairs(spark, df):
    rdd = spark.sparkContext.parallelize([np.ones(4)] * 10, 2)
    SparkModel(small()).fit(rdd, verbose=0)


def _allreduce_more_ranks_than_slots(spark, df):
    SparkModel(small(), mode="allreduce", num_workers=5).fit(df, verbose=0)


def _sync_ps_more_workers_than_slots(spark, df):
    SparkModel(small(), mode="synchronous", frequency="batch", num_workers=5).fit(df, verbose=0)


def _dynamic_allocation_with_barrier(spark, df):
    check_barrier_launch(FakeSC(), 2, 1.0)


def _unshippable_layer(spark, df):
    inp = keras.Input((4,), name="features")
    out = keras.layers.Dense(2, activation="softmax")(Unshippable(keras.ops.relu)(inp))
    model = keras.Model(inp, out)
    model.compile("adam", "sparse_categorical_crossentropy")
    SparkModel(model).fit(df, verbose=0)


def _unshippable_layer_rdd(spark, df):
    """An RDD's sample job (its Python reads a partition: here slowly) starts only once the model
    is shipped: an unshippable model fails at once, with no job left behind."""
    slow = spark.sparkContext.parallelize(range(2), 2).map(lambda i: (time.sleep(20) or np.zeros(4, np.float32), np.float32(0)))
    inp = keras.Input((4,), name="features")
    model = keras.Model(inp, keras.layers.Dense(2, activation="softmax")(Unshippable(keras.ops.relu)(inp)))
    model.compile("adam", "sparse_categorical_crossentropy")
    SparkModel(model).fit(slow, verbose=0)


@contextlib.contextmanager
def driver_host(spark, host):
    """spark.sparkdl_train.ps.host set on the running context's conf, for one call."""
    with spark_conf(spark.sparkContext, "spark.sparkdl_train.ps.host", host):
        yield


def _unbindable_driver_host(spark, df):
    with driver_host(spark, "203.0.113.9"):  # TEST-NET-3: never an address of this machine
        SparkModel(small(), mode="asynchronous", num_workers=2).fit(df, verbose=0)


def _unknown_driver_host(spark, df):
    with driver_host(spark, "no-such-host.invalid"):
        SparkModel(small(), mode="asynchronous", num_workers=2).fit(df, verbose=0)


def _wrong_secret(spark, df):
    state = ServerState([np.zeros(3, np.float32)], "asynchronous")
    with ParameterServer(state, "127.0.0.1", b"k" * 32) as server:
        PSClient("127.0.0.1", server.address[1], b"x" * 32, worker=0, connect_timeout=5)


def _validation_split_range(spark, df):
    SparkModel(small()).fit(df, validation_split=1.5, verbose=0)


def _validation_both(spark, df):
    SparkModel(small()).fit(df, validation_split=0.1, validation_data=df, verbose=0)


def _bad_conf_value(spark, df):
    EngineConfig.from_spark_conf({"spark.sparkdl_train.seed": "forty-two"})


def _bad_nan_policy(spark, df):
    SparkModel(small(), nan_policy="drop-silently")


def _staleness_for_hogwild(spark, df):
    SparkModel(small(), mode="hogwild", staleness_bound=2)


def _callback_not_callback(spark, df):
    SparkModel(small()).fit(df, callbacks=[lambda epoch: None], verbose=0)


def _checkpoint_every_batches(spark, df, tmp="/tmp"):
    cb = keras.callbacks.ModelCheckpoint(os.path.join(tmp, "x.keras"), save_freq=10)
    SparkModel(small()).fit(df, callbacks=[cb], verbose=0)


def _png_frame(spark, bad_row=None, n=200):
    from sparkdl_train.datasets import images

    rng = np.random.default_rng(1)
    good = images.encode_png(rng.integers(0, 255, (images.SIZE, images.SIZE), dtype=np.uint8))
    rows = [(f"/data/{i % 10}/{i}.png", b"this is no image" if i == bad_row else good) for i in range(n)]
    return spark.createDataFrame(rows, "path string, content binary").coalesce(1)


def _cnn():
    from sparkdl_train.datasets import images

    return images.cnn()


def _undecodable_image(spark, df):
    from sparkdl_train.datasets import images

    SparkModel(_cnn(), num_workers=1).fit(_png_frame(spark, bad_row=150), transform=images.DigitsTransform(), feature_cols="image", verbose=0)


def _transform_wrong_shape(spark, df):
    SparkModel(small()).fit(df, transform=lambda c: {"features": np.zeros((len(c["label"]), 3))}, verbose=0)


def _transform_wrong_dtype(spark, df):
    SparkModel(small()).fit(df, transform=lambda c: {"features": c["name"]}, verbose=0)


def _null_strings(spark, df):
    model = keras.Sequential([keras.Input((1,), dtype="string", name="text"), keras.layers.StringLookup(vocabulary=["a", "b"]),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
    data = spark.createDataFrame([("a", 1.0), (None, 0.0), ("b", 1.0)], "text string, label double")
    SparkModel(model).fit(data, feature_cols="text", verbose=0)


def _binary_to_numeric_input(spark, df):
    SparkModel(_cnn()).fit(_png_frame(spark), feature_cols="content", label_col="path", verbose=0)


def _transform_with_rdd(spark, df):
    rdd = spark.sparkContext.parallelize([(np.zeros(4), 0)] * 4)
    SparkModel(small()).fit(rdd, transform=lambda c: c, verbose=0)


def _transform_not_callable(spark, df):
    SparkModel(small()).fit(df, transform={"features": "decode"}, verbose=0)


def _criteo_wrong_width(spark, df):
    import tempfile

    from sparkdl_train.datasets import criteo

    folder = tempfile.mkdtemp(prefix="sdt-criteo-")
    with open(os.path.join(folder, "day_0"), "w") as f:
        f.write("1\t5\t3\n")
    criteo.read_tsv(spark, folder, on_malformed="fail")


CASES = [
    # (id, call, error type, words the message must contain)
    ("uncompiled model", _uncompiled, ModelError, ["compile"]),
    ("unknown mode", _mode, ConfigError, ["mode", "'gossip'"]),
    ("unknown frequency", _frequency, ConfigError, ["frequency", "'hourly'"]),
    ("allreduce with frequency 4", _frequency_allreduce, ConfigError, ["allreduce", "frequency", "not 4"]),
    ("batch size 0", _batch_size_zero, ConfigError, ["batch_size", "0"]),
    ("batch size negative", _batch_size_negative, ConfigError, ["batch_size", "-32"]),
    ("epochs 0", _epochs_zero, ConfigError, ["epochs"]),
    ("missing feature column", _missing_feature_column, DataError, ["'pixels'", "columns are"]),
    ("missing label column", _missing_label_column, DataError, ["'target'"]),
    ("missing weight column", _missing_weight_column, DataError, ["'weights'"]),
    ("non-numeric column", _non_numeric_column, DataError, ["'name'", "string"]),
    ("unknown model input", _unknown_input_name, (DataError, ConfigError), ["'dense'"]),
    ("ragged arrays", _ragged_arrays, (DataError, WorkerError), ["features"]),
    ("feature width differs from the model", _wrong_feature_width, DataError, ["features"]),
    ("label shape mismatch", _label_shape_mismatch, DataError, ["shape"]),
    ("NaN feature (nan_policy=fail)", _nan_features, WorkerError, ["non-finite", "input 'features'", "row 37"]),
    ("inf sample weight", _inf_label_weight, WorkerError, ["non-finite", "sample weight", "row 5"]),
    ("empty DataFrame", _empty_dataframe, DataError, ["empty"]),
    ("unsupported data type", _unsupported_data, DataError, ["list", "DataFrame"]),
    ("RDD rows that are not (x, y)", _rdd_rows_not_pairs, (DataError, WorkerError), ["(x, y"]),
    ("allreduce ranks > slots", _allreduce_more_ranks_than_slots, ConfigError, ["5 task slots", "offers 2"]),
    ("sync PS workers > slots", _sync_ps_more_workers_than_slots, ConfigError, ["5 workers", "offers 2"]),
    ("dynamic allocation with barrier mode", _dynamic_allocation_with_barrier, ConfigError, ["dynamicAllocation"]),
    ("custom layer Keras cannot rebuild", _unshippable_layer, ModelError, ["class Unshippable", "get_config", "SparkModel(build_model"]),
    ("custom layer Keras cannot rebuild, RDD data", _unshippable_layer_rdd, ModelError, ["class Unshippable", "SparkModel(build_model"]),
    ("unbindable driver host", _unbindable_driver_host, ConfigError, ["203.0.113.9", "spark.driver.host"]),
    ("unknown driver host", _unknown_driver_host, ConfigError, ["no-such-host.invalid"]),
    ("wrong secret", _wrong_secret, (net.AuthError, ConnectionError), ["authentication"]),
    ("validation_split out of range", _validation_split_range, ConfigError, ["validation_split"]),
    ("validation_split and validation_data", _validation_both, ConfigError, ["validation_data", "validation_split"]),
    ("bad spark.sparkdl_train value", _bad_conf_value, ConfigError, ["spark.sparkdl_train.seed", "forty-two"]),
    ("unknown nan_policy", _bad_nan_policy, ConfigError, ["nan_policy", "drop-silently"]),
    ("staleness bound with hogwild", _staleness_for_hogwild, ConfigError, ["staleness_bound", "hogwild"]),
    ("callback that is not a Callback", _callback_not_callback, ConfigError, ["Callback", "function"]),
    ("ModelCheckpoint every N batches", _checkpoint_every_batches, ConfigError, ["save_freq=10"]),
    ("undecodable image bytes", _undecodable_image, WorkerError,
     ["TransformError", "partition 0, rows 100-199", "row 50 of the slice is not a decodable image", "16 bytes"]),
    ("transform returns the wrong shape", _transform_wrong_shape, DataError, ["'features'", "(3,)", "(4,)", "transform"]),
    ("transform returns the wrong dtype", _transform_wrong_dtype, DataError, ["'features'", "numeric", "strings"]),
    ("null strings for a string input", _null_strings, DataError, ["'text'", "null", "row 1"]),
    ("binary column for a numeric input", _binary_to_numeric_input, DataError, ["'content'", "binary", "transform"]),
    ("transform with an RDD", _transform_with_rdd, ConfigError, ["transform", "rdd.map"]),
    ("transform that is not a function", _transform_not_callable, ConfigError, ["transform must be a function", "dict"]),
    ("Criteo TSV line of the wrong width", _criteo_wrong_width, DataError, ["expected 40 tab-separated fields, got 3", "day_0"]),
]


def _server_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-") and t.is_alive()]


@pytest.mark.parametrize("name,call,error,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_clearly(spark, df, name, call, error, words):
    start = time.monotonic()
    with pytest.raises(error) as info:
        call(spark, df)
    elapsed = time.monotonic() - start
    text = str(info.value)
    for w in words:
        assert w in text, f"{name}: {w!r} not in the error:\n{text[:3000]}"
    assert elapsed < FAST, f"{name} took {elapsed:.0f}s"
    tracker = spark.sparkContext.statusTracker()
    settle(lambda: not tracker.getActiveJobsIds())  # cleanup runs asynchronously
    assert not tracker.getActiveJobsIds(), f"{name} left Spark jobs running"
    settle(lambda: not _server_threads())
    assert not _server_threads(), f"{name} left threads behind: {_server_threads()}"


def test_catalogue_has_at_least_twenty_cases():
    assert len(CASES) >= 20


def test_nan_rows_can_be_skipped_and_are_counted(spark):
    rows = [([0.1 * (i % 7), 0.2, 0.3, 0.4], i % 2) for i in range(300)]
    for i in (3, 50, 51, 299):
        rows[i] = ([0.1, float("nan"), 0.3, float("inf") if i == 50 else 0.4], 1)
    data = frame(spark, rows).repartition(2)
    sm = SparkModel(small(), num_workers=2, nan_policy="skip")
    hist = sm.fit(data, epochs=2, batch_size=32, verbose=0)
    epoch = sm.stats.epochs[-1]
    assert epoch.samples == 296
    assert sum(p["skipped_rows"] for p in epoch.partitions.values()) == 4
    assert np.isfinite(hist.history["loss"]).all()
    assert all(np.isfinite(w).all() for w in sm.model.get_weights())
    # evaluate applies the same policy (set through the Spark conf here)
    spark.conf.set("spark.sparkdl_train.data.nanPolicy", "skip")  # a runtime SQL conf is not the SparkContext's
    logs = SparkModel(sm.model, nan_policy="skip").evaluate(data, return_dict=True)
    assert np.isfinite(logs["loss"])


def test_fewer_partitions_than_workers_is_repartitioned(spark, df):
    sm = SparkModel(small(), mode="synchronous", frequency="batch", num_workers=2)
    sm.fit(df.coalesce(1), epochs=1, batch_size=32, verbose=0)
    parts = sm.stats.epochs[0].partitions
    assert len(parts) == 2 and all(p["samples"] > 0 for p in parts.values())
    assert sum(p["samples"] for p in parts.values()) == N
