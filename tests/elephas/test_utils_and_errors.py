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


def test_params_defaults_and_any_value_accepted_when_set():
    assert HasMode().get_mode() == "asynchronous" and HasFrequency().get_frequency() == "epoch"
    assert HasNumberOfWorkers().get_num_workers() == 8 and HasValidationSplit().get_validation_split() == 0.1
    # Elephas stores any value; the estimator decides at fit (an unknown mode trains synchronously there)
    assert HasMode().set_mode("foobar").get_mode() == "foobar"
    assert HasFrequency().set_frequency("fortnightly").get_frequency() == "fortnightly"


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


def test_elephas_only_and_unknown_arguments_are_kept_and_warned_about(monkeypatch):
    from sparkdl_train.elephas import _shim

    monkeypatch.setattr(_shim, "_warned", set())
    with pytest.warns(ElephasCompatibilityWarning, match="ps_port"):
        sm = ElephasSparkModel(_compiled(), mode="asynchronous", parameter_server_mode="socket", port=4000)
    assert sm.get_config()["parameter_server_mode"] == "socket" and sm.config.mode == "asynchronous"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElephasCompatibilityWarning)
        ElephasSparkModel(_compiled(), mode="asynchronous", port=4001)  # said once per process
    # Elephas stores any keyword and returns it from get_config(); so does the layer, saying it is not used
    with pytest.warns(ElephasCompatibilityWarning, match="'frequncy' \\(did you mean 'frequency'\\?\\).*not used"):
        sm = ElephasSparkModel(_compiled(), frequncy="batch", foo="bar")
    assert sm.get_config() == {"num_workers": None, "batch_size": 32, "frequncy": "batch", "foo": "bar"}
    assert (sm.config.mode, sm.config.frequency) == ("synchronous", "epoch")
    with pytest.raises(ConfigError, match="class_weight.*not supported"):
        sm.fit(None, epochs=1, class_weight={0: 1.0})
    # a mode Elephas' SparkModel does not know trains synchronously there: here too, warned
    with pytest.warns(ElephasCompatibilityWarning, match="mode='allreduce'.*trains synchronous.*sparkdl_train.SparkModel"):
        sm = ElephasSparkModel(_compiled(), mode="allreduce")
    assert sm.config.mode == "synchronous" and sm.get_config()["mode"] == "allreduce"
    # an unknown frequency is accepted, and the fit fails naming it (Elephas' workers raise there)
    sm = ElephasSparkModel(_compiled(), mode="asynchronous", frequency="fortnightly")
    with pytest.raises(ConfigError, match="frequency='fortnightly'"):
        sm.fit(None, epochs=1)


def test_get_config_holds_what_elephas_holds():
    from sparkdl_train.elephas.spark_model import AsynchronousSparkModel

    assert ElephasSparkModel(_compiled()).get_config() == {"num_workers": None, "batch_size": 32}
    assert ElephasSparkModel(_compiled(), 3, batch_size=8, mode="hogwild").get_config() == \
        {"num_workers": 3, "batch_size": 8, "mode": "hogwild"}
    assert AsynchronousSparkModel(_compiled(), 2, frequency="batch", port=4005).get_config() == \
        {"num_workers": 2, "batch_size": 32, "parameter_server_mode": "http", "mode": "asynchronous", "frequency": "batch"}


def test_keras2_positional_metrics(monkeypatch):
    from sparkdl_train import SparkModel
    from sparkdl_train.elephas import _shim

    monkeypatch.setattr(_shim, "_warned", set())
    # sparkdl_train's own SparkModel names the cause...
    with pytest.raises(ModelError, match="third positional compile argument is loss_weights"):
        SparkModel(_compiled(positional_metrics=True))
    # ...and the Elephas layer re-compiles without them, as Elephas does, saying so: evaluate gives the loss alone
    with pytest.warns(ElephasCompatibilityWarning, match="loss_weights.*evaluate\\(\\) returns the loss alone"):
        sm = ElephasSparkModel(_compiled(positional_metrics=True))
    config = sm.master_network.get_compile_config()
    assert config["metrics"] is None and config["loss_weights"] is None and config["loss"] == "categorical_crossentropy"
    keyword = ElephasSparkModel(_compiled())  # metrics given as metrics stay
    assert keyword.master_network.get_compile_config()["metrics"] == ["acc"]


def test_parameter_clients_construct_by_name_and_move_no_pickles():
    """Elephas' tests/parameter/test_client.py (imports changed), and what their calls do here."""
    from unittest.mock import patch

    from sparkdl_train.elephas.parameter import BaseParameterClient, HttpClient, SocketClient

    for client_type, obj in (("http", HttpClient), ("socket", SocketClient)):
        with patch("sparkdl_train.elephas.parameter.client.socket"):
            assert type(BaseParameterClient.get_client(client_type, 4000)) == obj  # noqa: E721 - Elephas' assertion
    with pytest.raises(ValueError, match="either `http` or `socket`, got grpc"):
        BaseParameterClient.get_client("grpc")
    client = HttpClient(4000)
    with pytest.raises(ConfigError, match="never loads from the network"):
        client.get_parameters()
    with pytest.raises(ConfigError, match="master_network.get_weights"):
        SocketClient(4000).update_parameters([np.zeros(2)])


def test_serialization_round_trip():
    """Elephas' tests/utils/test_serialization.py (imports changed)."""
    from keras.layers import Dense
    from keras.models import Sequential

    from sparkdl_train.elephas.utils import serialization

    model = Sequential()
    model.add(Dense(1, "linear"))
    dict_model = serialization.model_to_dict(model)
    assert list(dict_model.keys()) == ["model", "weights"]
    recovered = serialization.dict_to_model(dict_model)
    assert recovered.to_json() == model.to_json()
    built = _compiled()  # added: weights travel too
    again = serialization.dict_to_model(serialization.model_to_dict(built))
    assert all(np.array_equal(a, b) for a, b in zip(again.get_weights(), built.get_weights()))


def test_core_evaluate_with_elephas_signature_says_so():
    from sparkdl_train import SparkModel

    x, y = np.zeros((4, 4), "float32"), np.eye(2)[[0, 1, 0, 1]]
    with pytest.raises(ConfigError, match=r"evaluate: batch_size got ndarray.*evaluate\(\(x, y\)\)"):
        SparkModel(_compiled()).evaluate(x, y)
    with pytest.raises(ConfigError, match=r"fit: epochs got ndarray"):
        SparkModel(_compiled()).fit(x, y)
