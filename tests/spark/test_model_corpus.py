"""Users' model shapes (bench/workloads/corpus.py: thirteen, from public Keras galleries) through averaging and
allreduce; tests/spark/test_model_corpus_ps.py takes them through the three parameter-server modes (two files, so
that the suite's two workers share them).

Each shape is trained by single-process Keras and by every engine on ``local[2]`` for the same epochs on
the same rows (or ``Shape.epoch_multiple`` times the epochs, for the step-limited shapes), and the driver's model
after the fit is held to Keras' held-out metric: within ``TOLERANCE`` (accuracy) or ``MAE_RATIO`` (regression)
(``model_corpus.check_shape_through_engine``). A combination an engine refuses is a clear error, asserted as
such. Here too: the variable roles on the preprocessing model, the refusals, the advice, the one-liner.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from bench.workloads.corpus import BATCH, ENGINES, EPOCHS, PS_ENGINES, SHAPES, TOLERANCE, check_shape_through_engine, held_out
from sparkdl_train import SparkModel
from sparkdl_train.errors import DataError
from sparkdl_train.model_io import variable_roles
from sparkdl_train.roles import Role


@pytest.mark.parametrize("engine", [e for e in ENGINES if e not in PS_ENGINES])
@pytest.mark.parametrize("name", list(SHAPES))
def test_shape_trains_through_engine(corpus_data, name, engine):
    check_shape_through_engine(corpus_data, name, engine)


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
    named = r"(?s)layer 'linear(_\d+)?' \(class Linear from bench\.workloads\.corpus\) cannot be rebuilt.*get_config.*SparkModel\(build_model"
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
    assert held_out(shape, model, test) >= keras_metric - TOLERANCE
