"""The worker's compiled steps (sparkdl_train.worker.steps): one trace for every batch size, and
the same numbers as Keras' own fit / evaluate / predict on the same batches."""

import numpy as np
import pytest
from helpers import make_mlp

from sparkdl_train import _compat
from sparkdl_train.backend.tensorflow import open_rows_spec
from sparkdl_train.data.batching import rebatch
from sparkdl_train.model_io import get_metric_state, get_state, load_archive, serialize_model
from sparkdl_train.worker.steps import GROUP_BYTES, compiled_step, group_size, instantiate, predict_batches, run_steps, traces


def _worker_model(**kwargs):
    # as a worker gets it: rebuilt from the driver's archive, optimizer and compiled metrics built
    return load_archive(serialize_model(make_mlp(**kwargs)))


def _stream(x, y, batch_size):
    # chunks of 50 rows re-batched, as a worker's partition arrives: the last batch is short
    chunks = ((x[i:i + 50], y[i:i + 50], None) for i in range(0, len(x), 50))
    return rebatch(chunks, batch_size)


def test_train_steps_match_keras_fit_and_trace_once_for_every_batch_size(digits):
    x, y, _, _ = digits
    x, y = x[:300], y[:300]  # 300 = 9 batches of 32 and one of 12
    reference = make_mlp()
    reference.fit(x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)

    model = _worker_model()
    samples, steps = run_steps(model, _stream(x, y, 32), training=True)
    assert (samples, steps) == (300, 10)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(get_metric_state(model), get_metric_state(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    assert traces(model, "train", grouped=True) == 1  # the short last batch reused the first trace
    run_steps(model, _stream(x[:70], y[:70], 16), training=True, group=3)  # a later task: other sizes, no trace
    assert traces(model, "train", grouped=True) == 1
    assert int(model.optimizer.iterations.numpy()) == 15


def test_test_steps_match_keras_evaluate_and_predict_matches_keras_predict(digits):
    _, _, xt, yt = digits
    model = _worker_model(seed=3)
    expected = model.evaluate(xt, yt, batch_size=32, verbose=0, return_dict=True)

    model.reset_metrics()
    samples, _ = run_steps(model, _stream(xt, yt, 32), training=False)
    assert samples == len(xt)
    got = {k: float(v) for k, v in model.get_metrics_result().items()}
    assert got == pytest.approx(expected, rel=1e-5)
    assert traces(model, "test", grouped=True) == 1

    np.testing.assert_allclose(predict_batches(model, xt, 64), model.predict(xt, batch_size=64, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert traces(model, "predict") == 1


def test_a_batch_of_other_dtypes_mid_stream_gets_its_own_trace(digits):
    """Steps run through the trace's concrete function, which takes one signature: a chunk of
    other dtypes (RDD rows mixing float64 and float32 arrays) is traced for, not mistyped."""
    x, y, _, _ = digits
    x, y = x[:96].astype(np.float32), y[:96]
    mixed = [(x[:32], y[:32], None), (x[32:64].astype(np.float64), y[32:64], None), (x[64:], y[64:], None)]
    model = _worker_model()
    assert run_steps(model, iter(mixed), training=True, group=4) == (96, 3)
    assert traces(model, "train", grouped=True) == 2
    reference = _worker_model()
    for xb, yb, _ in mixed:
        reference.train_on_batch(xb.astype(np.float32), yb)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_recompiled_model_traces_its_new_step():
    import keras

    x = np.zeros((40, 64), np.float32)
    y = np.zeros((40,), np.int64)
    model = _worker_model()
    run_steps(model, _stream(x, y, 16), training=True)
    first = compiled_step(model, "train", (x, y, None), grouped=True)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    assert traces(model, "train", grouped=True) == 0  # a new optimizer: a step of its own, not traced yet
    run_steps(model, _stream(x, y, 16), training=True)
    assert compiled_step(model, "train", (x, y, None), grouped=True) is not first and traces(model, "train", grouped=True) == 1
    assert int(model.optimizer.iterations.numpy()) == 3  # the new optimizer stepped


def test_open_rows_spec_keeps_structure_dtypes_and_row_shapes():
    import tensorflow as tf

    batch = ({"a": np.zeros((5, 3, 2), np.float32), "s": np.array(["x"] * 5, dtype=object)}, np.zeros(5, np.int64), None)
    x, y, w = open_rows_spec(batch)
    assert x["a"] == tf.TensorSpec((None, 3, 2), tf.float32)
    assert x["s"] == tf.TensorSpec((None,), tf.string)
    assert y == tf.TensorSpec((None,), tf.int64) and w is None
    with pytest.raises(ValueError, match="step kind"):
        compiled_step(make_mlp(), "fit", batch)


def _one_call_per_batch(model, batches, training):
    fn = compiled_step(model, "train" if training else "test", batches[0])
    for b in batches:
        fn(b)


@pytest.mark.parametrize("training", [True, False])
def test_a_group_of_steps_per_call_gives_exactly_one_call_per_batch(digits, training):
    """Up to ``group`` batches per call, looping inside the compiled function: the same steps in
    the same order, so weights, optimizer slots and metrics are bitwise those of one call per
    batch; the short last batch gets a call of its own; progress is told after every call."""
    x, y, _, _ = digits
    x, y = x[:330], y[:330]  # 10 batches of 32 and one of 10
    batches = list(_stream(x, y, 32))
    reference = _worker_model(seed=5)
    _one_call_per_batch(reference, batches, training)
    model = _worker_model(seed=5)
    told = []
    assert run_steps(model, iter(batches), training, on_batch=lambda st, sa: told.append((st, sa)), group=4) == (330, 11)
    # the first batch alone, then calls ending on multiples of 4 (where a push every 4 steps falls),
    # then what is left of the full batches, then the short one
    assert told == [(1, 32), (4, 128), (8, 256), (10, 320), (11, 330)]
    for got, want in zip(get_state(model) + get_metric_state(model), get_state(reference) + get_metric_state(reference)):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.iterations.numpy()) == (11 if training else 0)


def test_a_group_never_stacks_more_than_its_byte_bound():
    small = (np.zeros((256, 39), np.float32), np.zeros(256, np.float32), None)  # 40 KiB a batch
    assert group_size(16, small) == 16 and group_size(1, small) == 1
    images = (np.zeros((64, 96, 96, 3), np.float32), np.zeros(64, np.int64), None)  # 6.75 MiB a batch
    assert group_size(16, images) == 1
    half = (np.zeros((GROUP_BYTES // 8,), np.float32), None, None)  # half the bound
    assert group_size(16, half) == 2
    fifth = (np.zeros((GROUP_BYTES // 20,), np.float32), None, None)  # five fit, but 5 does not divide 12
    assert group_size(12, fifth) == 4 and group_size(15, fifth) == 5


def test_instantiating_a_step_on_no_batches_changes_nothing_and_the_first_batch_traces_nothing(digits):
    """A prepare task calls the grouped step on a group of no batches, so that TensorFlow builds
    the function's graph before the epoch's first batch: a loop of no steps leaves weights,
    optimizer slots and metrics as they were."""
    x, y, _, _ = digits
    model = _worker_model(seed=8)
    _compat.symbolic_build(model, (x[:0], y[:0], None))  # as a prepare task builds its metrics first
    before = get_state(model) + get_metric_state(model)
    assert instantiate(model, "train", (x[:0], y[:0], None)) is True
    assert instantiate(model, "train", (x[:0], y[:0], None)) is False  # traced once
    for got, want in zip(get_state(model) + get_metric_state(model), before):
        np.testing.assert_array_equal(got, want)
    startup = {}
    run_steps(model, _stream(x[:64], y[:64], 32), training=True, startup=startup)
    assert startup["traced"] is False and traces(model, "train", grouped=True) == 1
