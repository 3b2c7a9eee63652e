"""Canaries for the Keras private attributes sparkdl_train uses (sparkdl_train/_compat.py): a Keras
upgrade that removes or changes one fails here, naming the attribute, not deep inside a fit."""

import keras
import numpy as np

from sparkdl_train import _compat


def _model(lr=1e-3):
    ids = keras.Input((3,), dtype="int32", name="ids")
    dense = keras.Input((2,), name="numeric")
    emb = keras.layers.Embedding(50, 4, name="table")(ids)
    x = keras.layers.Concatenate()([keras.layers.Flatten()(emb), dense])
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model({"ids": ids, "numeric": dense}, out)
    model.compile(keras.optimizers.Adam(lr), "binary_crossentropy", metrics=["auc"])
    return model


def _batch(n=8):
    rng = np.random.default_rng(0)
    x = {"ids": rng.integers(0, 50, (n, 3)).astype("int32"), "numeric": rng.random((n, 2)).astype("float32")}
    return x, (rng.random((n, 1)) > 0.5).astype("float32"), None


def test_every_private_attribute_is_still_there():
    gone = _compat.missing(_model())
    assert gone == [], f"this Keras ({keras.__version__}) lacks {gone}: update sparkdl_train/_compat.py"


def test_symbolic_build_builds_the_compiled_metrics_before_any_step():
    model = _model()
    model.compile(keras.optimizers.Adam(), "binary_crossentropy", metrics=["accuracy"])  # resolved from y
    before = len(model.metrics_variables)
    _compat.symbolic_build(model, _batch())
    assert len(model.metrics_variables) == before + 2, "the accuracy metric was not built from the batch"


def test_symbolic_build_takes_a_string_column_as_its_numpy_array_of_objects():
    """A zero-row batch of a text column is a numpy object array (what the prepare task traces from): the
    model's compiled metrics build from it, where Keras' own symbolic inputs refuse "Invalid dtype: object"."""
    text = keras.Input((1,), dtype="string", name="city")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b"], output_mode="one_hot")(text)
    model = keras.Model(text, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(lookup)))
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy"])
    batch = np.empty((0, 1), dtype=object), np.zeros((0, 1), "float32"), None
    _compat.symbolic_build(model, batch)
    assert _compat.compiled_metrics_built(model)
    assert isinstance(batch[0], np.ndarray) and batch[0].dtype == object  # the caller's batch is left as it was


def test_compute_loss_and_loss_tracker_match_train_step():
    model = _model()
    x, y, w = _batch()
    _compat.symbolic_build(model, (x, y, w))
    y_pred = model(x, training=False)
    loss = _compat.compute_loss(model)(x=x, y=y, y_pred=y_pred, sample_weight=w, training=False)
    expected = keras.losses.binary_crossentropy(y, y_pred)
    np.testing.assert_allclose(float(loss), float(np.mean(expected)), rtol=1e-5)
    assert isinstance(_compat.loss_tracker(model), keras.metrics.Mean)
    assert _compat.call_takes_training(model) is True


def test_inputs_struct_and_inbound_nodes_find_the_table_input():
    model = _model()
    struct = _compat.inputs_struct(model)
    assert isinstance(struct, dict) and set(struct) == {"ids", "numeric"}
    nodes = _compat.inbound_nodes(model.get_layer("table"))
    assert len(nodes) == 1 and nodes[0].input_tensors[0] is struct["ids"]


def test_raw_learning_rate_tells_a_schedule_from_a_constant():
    const = _compat.raw_learning_rate(_model().optimizer)
    assert not callable(const) or hasattr(const, "assign")
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)
    model = _model(lr=schedule)
    lr = _compat.raw_learning_rate(model.optimizer)
    assert callable(lr) and not hasattr(lr, "assign")


def test_every_private_jax_name_the_collectives_use_is_still_there():
    """jax_collectives._gloo_at (Gloo at the executor's address across hosts) relies on JAX's private names."""
    import pytest

    jax = pytest.importorskip("jax")
    from sparkdl_train.backend import jax_collectives

    gone = jax_collectives.missing()
    assert gone == [], f"this JAX ({jax.__version__}) lacks {gone}: update sparkdl_train/backend/jax_collectives.py"
