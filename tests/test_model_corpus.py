"""Users' model shapes (tests/model_corpus.py: fourteen, from public Keras galleries) through every engine.

Each shape is trained by single-process Keras and by every engine on ``local[2]`` for the same epochs on
the same rows (or ``Shape.epoch_multiple`` times the epochs, for the step-limited shapes), and the driver's model
after the fit is held to Keras' held-out metric: within ``TOLERANCE`` (accuracy) or ``MAE_RATIO`` (regression).
A combination an engine refuses is a clear error, asserted as such. The variable roles (sparkdl_train.roles) are checked on the preprocessing models.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from model_corpus import ENGINES, SHAPES, keras_dataset

from sparkdl_train import SparkModel
from sparkdl_train.errors import ConfigError, DataError
from sparkdl_train.model_io import variable_roles
from sparkdl_train.roles import Role

EPOCHS = 2
TRAIN_ROWS, TEST_ROWS, BATCH = 1024, 512, 32
TOLERANCE = 0.05  # held-out accuracy at most this far below Keras' at the same epochs
MAE_RATIO = 1.3  # held-out mean absolute error at most this multiple of Keras'


@pytest.fixture(scope="module")
def corpus_data(spark):
    """Per shape: the training DataFrame (2 partitions), the held-out rows, Keras' held-out metric."""
    out = {}
    for name, shape in SHAPES.items():
        train, test = shape.data(TRAIN_ROWS, 1), shape.data(TEST_ROWS, 2)
        model = shape.build()
        model.fit(keras_dataset(shape, train, BATCH, shuffle=True), epochs=EPOCHS, verbose=0)
        keras_metric = model.evaluate(keras_dataset(shape, test, 256), verbose=0, return_dict=True)[shape.metric]
        out[name] = (spark.createDataFrame(train).repartition(2), test, keras_metric)
    return out


def _held_out(shape, model, test) -> float:
    return model.evaluate(keras_dataset(shape, test, 256), verbose=0, return_dict=True)[shape.metric]


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_trains_through_engine(corpus_data, name, engine):
    shape = SHAPES[name]
    df, test, keras_metric = corpus_data[name]
    sm = SparkModel(shape.build if shape.builder else shape.build(), **ENGINES[engine])
    epochs = EPOCHS * shape.epoch_multiple
    kwargs = dict(epochs=epochs, batch_size=BATCH, feature_cols=shape.feature_cols, label_col=shape.label_col, verbose=0)
    if engine in shape.refused:
        with pytest.raises((ConfigError, DataError), match=shape.refused[engine]):
            sm.fit(df, **kwargs)
        return
    history = sm.fit(df, **kwargs)
    assert len(history.history["loss"]) == epochs and all(np.isfinite(history.history["loss"]))
    assert sm.stats.epochs[-1].samples == TRAIN_ROWS
    assert sorted(sm.stats.epochs[-1].partitions) == [0, 1] and all(p["samples"] > 0 for p in sm.stats.epochs[-1].partitions.values())
    got = _held_out(shape, sm.model, test)
    if shape.lower_is_better:
        assert got <= keras_metric * MAE_RATIO, f"{name} via {engine}: held-out {shape.metric} {got:.4f}, Keras {keras_metric:.4f}"
    else:
        assert got >= keras_metric - TOLERANCE, f"{name} via {engine}: held-out {shape.metric} {got:.4f}, Keras {keras_metric:.4f}"


def test_preprocessing_state_keeps_its_role(corpus_data):
    """Integer state (Normalization's count, the optimizer's iteration) is never merged as a delta: after an
    asynchronous fit the driver's adapted statistics are the adapted ones, and its counters are integers
    that advanced (iteration) or stayed (count)."""
    shape = SHAPES["preprocessing_layers"]
    df, _, _ = corpus_data["preprocessing_layers"]
    model = shape.build()
    norm = next(layer for layer in model.layers if isinstance(layer, keras.layers.Normalization))
    dense = next(layer for layer in model.layers if isinstance(layer, keras.layers.Dense))
    paths = {w.path.rsplit("/", 1)[1]: w.path for w in norm.weights} | {"kernel": dense.kernel.path}
    roles = dict(zip([w.path for w in model.weights], variable_roles(model.weights)))
    assert roles[paths["count"]] is Role.DISCRETE
    assert roles[paths["mean"]] is Role.STATISTIC and roles[paths["kernel"]] is Role.WEIGHT
    before = {w.path: np.array(w.numpy()) for w in model.weights}
    sm = SparkModel(model, mode="asynchronous", frequency="batch")
    sm.fit(df, epochs=1, batch_size=BATCH, feature_cols=shape.feature_cols, label_col=shape.label_col, verbose=0)
    after = {w.path: np.array(w.numpy()) for w in model.weights}
    for key in ("mean", "variance", "count"):
        np.testing.assert_array_equal(after[paths[key]], before[paths[key]])  # not trainable, never moved by training
    assert after[paths["count"]].dtype == before[paths["count"]].dtype
    assert not np.allclose(after[paths["kernel"]], before[paths["kernel"]])
    steps = sum(p["batches"] for p in sm.stats.epochs[0].partitions.values())
    iteration = int(next(v for v in model.optimizer.variables if v.path.endswith("iteration")).numpy())
    assert iteration == max(p["batches"] for p in sm.stats.epochs[0].partitions.values()) and iteration < steps


def test_unshippable_layer_named(corpus_data):
    """A custom layer without get_config handed over as a model (not as its building function) is refused
    before any job, naming the layer and both fixes."""
    from sparkdl_train.errors import ModelError

    shape = SHAPES["custom_layers"]
    df, _, _ = corpus_data["custom_layers"]
    named = r"(?s)layer 'linear(_\d+)?' \(class Linear from model_corpus\) cannot be rebuilt.*get_config.*SparkModel\(build_model"
    with pytest.raises(ModelError, match=named):
        SparkModel(shape.build()).fit(df, epochs=1, batch_size=BATCH, feature_cols=shape.feature_cols, verbose=0)


def test_few_steps_advice_given_once(corpus_data, caplog):
    shape = SHAPES["regression"]
    df, _, _ = corpus_data["regression"]
    sm = SparkModel(shape.build(), mode="asynchronous", frequency="batch")
    with caplog.at_level(logging.WARNING, logger="sparkdl_train.driver.spark_model"):
        sm.fit(df, epochs=2, batch_size=BATCH, feature_cols=shape.feature_cols, verbose=0)
    advice = [r for r in caplog.records if "optimizer steps in the first epoch" in r.getMessage()]
    assert len(advice) == 1 and sm.stats.advice == [advice[0].getMessage()]
    assert "ran 16 optimizer steps" in sm.stats.advice[0] and "model.fit would run 32" in sm.stats.advice[0]


def test_several_outputs_need_a_label_each(corpus_data):
    """A model with several outputs fed one label array, or labels for other outputs, is refused naming them."""
    shape = SHAPES["multi_output"]
    df, _, _ = corpus_data["multi_output"]
    sm = SparkModel(shape.build())
    with pytest.raises(DataError, match=r"has 2 outputs \['label', 'value'\].*label_col=\{'label': \.\.\., 'value': \.\.\.\}"):
        sm.fit(df, epochs=1, batch_size=BATCH, feature_cols="features", label_col=["label", "value"], verbose=0)
    with pytest.raises(DataError, match=r"label_col names outputs \['label', 'score'\]"):
        sm.fit(df, epochs=1, batch_size=BATCH, feature_cols="features", label_col={"label": "label", "score": "value"}, verbose=0)


def test_the_asynchronous_one_liner_trains_a_featurespace_model_from_an_rdd(spark, corpus_data):
    """The mission's one-liner, as written, on Keras' recommended structured-data model: an RDD of
    (dict of raw columns, label) rows, SparkModel(model, mode='asynchronous').fit(rdd)."""
    shape = SHAPES["featurespace"]
    train_df, test, keras_metric = corpus_data["featurespace"]
    train = train_df.toPandas()
    rows = [({"age": np.float32([r.age]), "chol": np.float32([r.chol]), "city": np.array([r.city]), "grade": np.int64([r.grade])},
             np.float32([r.label])) for r in train.itertuples()]
    rdd = spark.sparkContext.parallelize(rows, 2)
    model = shape.build()
    history = SparkModel(model, mode="asynchronous").fit(rdd, epochs=EPOCHS, batch_size=BATCH, verbose=0)
    assert len(history.history["loss"]) == EPOCHS
    assert _held_out(shape, model, test) >= keras_metric - TOLERANCE
