
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


def test_unregistered_custom_objects_found_and_shipped_by_value():
    """A subclassed model, its class and its loss function neither registered nor passed: found in the
    model (discover_custom_objects) and shipped by value; the rebuilt model computes the same."""
    model = models.subclassed()
    payload = serialize_model(model)
    objs = payload.custom_objects()
    assert {"Tower", "weighted_bce"} <= set(objs)
    clone = load_archive(payload)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    np.testing.assert_allclose(clone.predict_on_batch(x), model.predict_on_batch(x), rtol=1e-6)


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


def _functional(units=8, input_name="ids", outputs=1, skip_from_input=False, output_names=None):
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,), name=input_name)
    d1 = keras.layers.Dense(3, activation="relu")(inp)
    d2 = keras.layers.Dense(3)(d1)
    h = keras.layers.Dense(units, activation="relu")(keras.layers.Add()([inp if skip_from_input else d1, d2]))
    names = output_names or [None] * outputs
    outs = [keras.layers.Dense(1, name=names[i])(h) for i in range(outputs)]
    model = keras.Model(inp, outs if outputs > 1 else outs[0])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def test_a_model_built_again_has_the_same_digest_and_another_architecture_another(monkeypatch):
    """Layer, model and optimizer names Keras generates (``dense_3``, then ``dense_7``) and the
    ids of shared objects do not change the digest executors cache models by; anything that
    changes what the model computes, or how its inputs and several outputs are addressed, does."""
    from sparkdl_train import model_io

    digest = lambda model: serialize_model(model).digest  # noqa: E731
    first = serialize_model(_functional())
    keras.utils.clear_session()  # new ids for the shared dtype policy
    again = serialize_model(_functional())
    assert again.archive != first.archive and again.digest == first.digest
    assert digest(_functional(units=9)) != first.digest
    assert digest(_functional(input_name="features")) != first.digest  # the key of a dict input
    assert digest(_functional(skip_from_input=True)) != first.digest  # the same layers wired otherwise

    def sequential():  # built again without clear_session: its InputLayer is input_layer_N, N new each time
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("adam", "mse")
        return serialize_model(model)

    one, two = sequential(), sequential()
    assert one.archive != two.archive and one.digest == two.digest  # a Sequential model's input is positional
    # two outputs: their names address dict labels and name metrics, so generated ones differ
    assert digest(_functional(outputs=2)) != digest(_functional(outputs=2))
    assert digest(_functional(outputs=2, output_names=["a", "b"])) == digest(_functional(outputs=2, output_names=["a", "b"]))
    assert digest(_functional(outputs=2, output_names=["a", "b"])) != digest(_functional(outputs=2, output_names=["a", "c"]))

    def scaled(factor):
        class Scale(keras.layers.Layer):  # a notebook cell redefining a custom layer
            def call(self, x):
                return x * factor

        inp = keras.Input((2,))
        model = keras.Model(inp, keras.layers.Dense(1)(Scale()(inp)))
        model.compile("adam", "mse")
        return serialize_model(model, {"Scale": Scale})

    assert scaled(2.0).digest != scaled(3.0).digest  # same config, other code: rebuilt on the executors

    # the driver proves an architecture rebuildable once per process
    monkeypatch.setattr(model_io, "_rebuilt", set())
    calls = []
    real = model_io.load_archive
    monkeypatch.setattr(model_io, "load_archive", lambda payload: calls.append(payload) or real(payload))
    serialize_model(_functional())
    serialize_model(_functional())
    serialize_model(_functional(units=5))
    assert len(calls) == 2


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
