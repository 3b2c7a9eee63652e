"""Elephas' adapter, rdd_utils and params unit tests (imports changed), and what a migrating user's
mistakes and Elephas-only arguments give."""

import warnings

import numpy as np
import pytest

from sparkdl_train.elephas import ElephasCompatibilityWarning
from sparkdl_train.elephas.ml import adapter
from sparkdl_train.elephas.ml.params import HasFrequency, HasMode, HasNumberOfWorkers, HasValidationSplit
from sparkdl_train.elephas.mllib.adapter import from_matrix, from_vector, to_matrix, to_vector
from sparkdl_train.elephas.spark_model import SparkModel as ElephasSparkModel
from sparkdl_train.elephas.utils import average_and_subtract, model_utils, rdd_utils
from sparkdl_train.errors import ConfigError, DataError, ModelError


def test_to_and_from_data_frame(spark_context):
    features = np.arange(20, dtype="float64").reshape(2, 10)
    labels = np.asarray([[0, 0, 1.0], [0, 1.0, 0]])
    df = adapter.to_data_frame(spark_context, features, labels, categorical=True)
    assert df.count() == 2
    x, y = adapter.from_data_frame(df, categorical=True, nb_classes=3)
    assert np.array_equal(x, features) and np.array_equal(y, labels)
    reg = adapter.to_data_frame(spark_context, features, np.array([2.5, 1.25]))
    assert np.array_equal(adapter.from_data_frame(reg)[1], [2.5, 1.25])  # fractions kept (Elephas truncated them)
    assert adapter.df_to_simple_rdd(reg, False).count() == 2


def test_mllib_adapter_keeps_element_positions():
    x = np.arange(6.0).reshape(2, 3)
    mat = to_matrix(x)
    assert (mat.numRows, mat.numCols) == (2, 3) and np.array_equal(from_matrix(mat), x)
    assert np.array_equal(from_vector(to_vector(np.ones(3))), np.ones(3))
    with pytest.raises(DataError, match="one-dimensional"):
        to_vector(x)


def test_rdd_utils(spark_context):
    features = np.ones((5, 10))
    rdd = rdd_utils.to_simple_rdd(spark_context, features, np.ones((5,)))
    first = rdd.first()
    assert rdd.count() == 5 and first[0].shape == (10,) and first[1] == 1.0
    labels = np.asarray([[0, 0, 1.0], [0, 1.0, 0]])
    lp_rdd = rdd_utils.to_labeled_point(spark_context, np.ones((2, 10)), labels, True)
    assert lp_rdd.first().label == 2.0 and lp_rdd.first().features.size == 10
    x, y = rdd_utils.from_labeled_point(lp_rdd, True, 3)
    assert x.shape == (2, 10) and np.array_equal(y, labels)
    simple = rdd_utils.lp_to_simple_rdd(lp_rdd, categorical=True)  # nb_classes counted: 3
    assert simple.first()[1].shape == (3,)
    assert list(rdd_utils.encode_label(3, 10)) == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
    with pytest.raises(DataError, match="class index"):
        rdd_utils.encode_label(10, 10)


def test_params_defaults_and_checks():
    assert HasMode().get_mode() == "asynchronous" and HasFrequency().get_frequency() == "epoch"
    assert HasNumberOfWorkers().get_num_workers() == 8 and HasValidationSplit().get_validation_split() == 0.1
    with pytest.raises(ValueError, match="foobar"):  # Elephas stores any string and fails at fit time
        HasMode().set_mode("foobar")


def test_model_utils_and_functional_utils():
    mapper = model_utils.LossModelTypeMapper()
    assert mapper.get_model_type("mse") == model_utils.ModelType.REGRESSION
    assert mapper.get_model_type("categorical_crossentropy") == model_utils.ModelType.CLASSIFICATION
    base, deltas = [np.array([1.0, 2.0])], [[np.array([0.5, 0.0])], [np.array([1.5, 2.0])]]
    assert np.array_equal(average_and_subtract(base, deltas)[0], [0.0, 1.0])


def _compiled(positional_metrics=False):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    if positional_metrics:
        model.compile("sgd", "categorical_crossentropy", ["acc"])
    else:
        model.compile("sgd", "categorical_crossentropy", metrics=["acc"])
    return model


def test_elephas_only_arguments_warn_once_and_unknown_ones_fail(monkeypatch):
    from sparkdl_train.elephas import _shim

    monkeypatch.setattr(_shim, "_warned", set())
    with pytest.warns(ElephasCompatibilityWarning, match="ps_port"):
        sm = ElephasSparkModel(_compiled(), mode="asynchronous", parameter_server_mode="socket", port=4000)
    assert sm.get_config()["parameter_server_mode"] == "socket" and sm.config.mode == "asynchronous"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElephasCompatibilityWarning)
        ElephasSparkModel(_compiled(), mode="asynchronous", port=4001)  # said once per process
    with pytest.raises(ConfigError, match="frequncy.*did you mean 'frequency'"):
        ElephasSparkModel(_compiled(), frequncy="batch")
    with pytest.raises(ConfigError, match="class_weight.*not supported"):
        sm.fit(None, epochs=1, class_weight={0: 1.0})
    with pytest.raises(ConfigError, match="allreduce"):
        ElephasSparkModel(_compiled(), mode="allreduce")


def test_keras2_positional_metrics(monkeypatch):
    from sparkdl_train import SparkModel
    from sparkdl_train.elephas import _shim

    monkeypatch.setattr(_shim, "_warned", set())
    # sparkdl_train's own SparkModel names the cause...
    with pytest.raises(ModelError, match="third positional compile argument is loss_weights"):
        SparkModel(_compiled(positional_metrics=True))
    # ...and the Elephas layer does what the Keras 2 code meant, saying so
    with pytest.warns(ElephasCompatibilityWarning, match="loss_weights"):
        sm = ElephasSparkModel(_compiled(positional_metrics=True))
    assert sm.master_network.get_compile_config()["metrics"] == ["acc"]
    assert sm.master_network.get_compile_config()["loss_weights"] is None


def test_core_evaluate_with_elephas_signature_says_so():
    from sparkdl_train import SparkModel

    x, y = np.zeros((4, 4), "float32"), np.eye(2)[[0, 1, 0, 1]]
    with pytest.raises(ConfigError, match=r"evaluate: batch_size got ndarray.*evaluate\(\(x, y\)\)"):
        SparkModel(_compiled()).evaluate(x, y)
    with pytest.raises(ConfigError, match=r"fit: epochs got ndarray"):
        SparkModel(_compiled()).fit(x, y)
