"""The split train step: weighted fused gradients of shards sum to the full batch's gradient."""


import numpy as np
from helpers import make_mlp


def test_shard_gradients_average_to_the_full_batch_gradient(digits):
    import keras
    import tensorflow as tf

    from sparkdl_train._compat import symbolic_build
    from sparkdl_train.backend.tensorflow import FusedStep

    x, y, _, _ = digits
    x, y = x[:48], y[:48]
    model = make_mlp()
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
    symbolic_build(model, (x, y, None))
    step = FusedStep(model, batch_size=32)
    # uneven shards, as on the last step of an epoch, plus a rank with nothing
    shards = [(x[:32], y[:32], None), (x[32:], y[32:], None)]
    total = np.zeros(step.size, np.float32)
    rows = 0
    for shard in shards:
        buf = np.empty(step.size, np.float32)
        rows += step.gradients(shard, buf)
        total += buf
    assert rows == 48 and total[-1] == np.float32(48 / 32)

    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
    full = tape.gradient(loss, model.trainable_variables)
    expected = np.concatenate([np.asarray(g).ravel() for g in full])
    np.testing.assert_allclose(total[:-1] / total[-1], expected, rtol=1e-4, atol=1e-6)

    before = [np.asarray(v.numpy()) for v in model.trainable_variables]
    step.apply(total)
    for b, v, g in zip(before, model.trainable_variables, full):
        np.testing.assert_allclose(np.asarray(v.numpy()), b - 0.5 * np.asarray(g), rtol=1e-4, atol=1e-6)
    assert int(model.optimizer.iterations.numpy()) == 1
    # the loss tracker saw both shards, weighted by rows, like model.fit would
    assert float(model._loss_tracker.count.numpy()) == 48


def test_the_fused_step_traces_once_for_full_short_and_single_row_batches(digits):
    import keras

    from sparkdl_train._compat import symbolic_build
    from sparkdl_train.backend.tensorflow import FusedStep

    x, y, _, _ = digits
    model = make_mlp()
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    symbolic_build(model, (x[:32], y[:32], None))
    step = FusedStep(model, batch_size=32)
    step.trace((x[:32], y[:32], None))
    buf = np.empty(step.size, np.float32)
    for rows in (32, 7, 1, 32):
        assert step.gradients((x[:rows], y[:rows], None), buf) == rows
        assert buf[-1] == np.float32(rows / 32)
    assert step._gradients.experimental_get_tracing_count() == 1
