
import keras
import models
import numpy as np
import pytest

from sparkdl_train import ModelError, SparkModel
from sparkdl_train.model_io import get_state, load_archive, serialize_model


def _same(model, clone, x):
    assert len(model.weights) == len(clone.weights)
    for a, b in zip(model.weights, clone.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert type(clone.optimizer) is type(model.optimizer)
    assert clone.optimizer.get_config()["learning_rate"] == pytest.approx(model.optimizer.get_config()["learning_rate"])
    assert clone.get_compile_config()["loss"] == model.get_compile_config()["loss"] or callable(model.loss)
    np.testing.assert_allclose(clone.predict_on_batch(x), model.predict_on_batch(x), rtol=1e-6)


def test_sequential_roundtrip_keeps_weights_optimizer_loss_and_metrics(mlp):
    model = mlp()
    x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    model.fit(x, np.arange(4), epochs=1, verbose=0)  # non-trivial optimizer slots
    clone = load_archive(serialize_model(model))
    _same(model, clone, x)
    for a, b in zip(get_state(model), get_state(clone)):
        np.testing.assert_array_equal(a, b)  # Adam's moments and step counter too
    clone.evaluate(x, np.arange(4), verbose=0)
    assert clone.metrics_names == model.metrics_names


def test_functional_multi_input_roundtrip():
    model = models.two_input()
    xd, xc, y = models.planted_two_input(8)
    clone = load_archive(serialize_model(model))
    _same(model, clone, {"numeric": xd, "cat": xc})


def test_subclassed_with_custom_objects_roundtrip():
    model = models.subclassed()
    payload = serialize_model(model, custom_objects=models.CUSTOM)
    clone = load_archive(payload)
    assert isinstance(clone, models.Tower)
    _same(model, clone, np.ones((3, 8), np.float32))


def test_registered_custom_objects_are_found_without_custom_objects():
    @keras.saving.register_keras_serializable(package="sdt_test")
    class Doubler(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(1)(Doubler()(inp)))
    model.compile("sgd", "mse")
    payload = serialize_model(model)
    assert "sdt_test>Doubler" in payload.custom_objects()
    load_archive(payload)


def test_missing_custom_object_fails_on_driver_with_a_hint():
    model = models.subclassed()
    with pytest.raises(ModelError, match="custom_objects"):
        serialize_model(model)


def test_uncompiled_and_unbuilt_models_are_rejected():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ModelError, match="not compiled"):
        SparkModel(model)
    with pytest.raises(ModelError, match="keras.Model"):
        SparkModel(object())


def test_architecture_digest_ignores_weights(mlp):
    model = mlp()
    a = serialize_model(model)
    model.layers[0].kernel.assign(np.zeros(model.layers[0].kernel.shape))
    b = serialize_model(model)
    assert a.archive != b.archive and a.digest == b.digest
    assert serialize_model(mlp(lr=0.1)).digest != a.digest  # compile config is part of it


def test_the_shipped_archive_is_reused_until_the_model_changes():
    """fit, evaluate and predict of one model ship one archive (so executors keep their rebuilt,
    traced model); a recompile or a learning-rate change builds a new one."""
    import keras
    from helpers import make_mlp

    from sparkdl_train import SparkModel

    model = make_mlp()
    sm = SparkModel(model)
    first = sm._payload()
    model.fit(np.zeros((4, 64), "float32"), np.zeros(4, "int64"), verbose=0)  # weights change: same archive
    assert sm._payload() is first
    model.optimizer.learning_rate = 0.5
    second = sm._payload()
    assert second is not first and second.digest != first.digest
    model.compile(keras.optimizers.Adam(0.5), "sparse_categorical_crossentropy", metrics=["accuracy", "sparse_top_k_categorical_accuracy"])
    assert sm._payload() is not second
