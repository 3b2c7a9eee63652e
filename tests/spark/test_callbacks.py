"""Keras callbacks on the driver: merged epoch logs, changes that reach the workers, files."""

import csv
import glob
import math
import os

import keras
import numpy as np
import pytest
from helpers import make_mlp

from sparkdl_train import ConfigError, SparkModel, to_simple_rdd

ENGINES = [("synchronous", None), ("asynchronous", 2), ("allreduce", None)]


@pytest.fixture(scope="module")
def data(sc, digits):
    x, y, xt, yt = digits
    return to_simple_rdd(sc, x, y), to_simple_rdd(sc, xt, yt), (xt, yt)


class WeightLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []
        self.lr = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append([w.copy() for w in self.model.get_weights()])
        self.lr.append(float(np.asarray(self.model.optimizer.learning_rate)))


def _max_change(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.mark.parametrize("mode, frequency", ENGINES)
def test_early_stopping_restores_best_weights_after_a_driver_side_lr_change(data, mode, frequency):
    train, val, (xt, yt) = data
    # epochs 0-1 learn; from epoch 2 a huge learning rate wrecks the model: the change is made
    # on the driver and must reach the workers for val_loss to get worse
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.003 if epoch < 2 else 3.0)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    model = make_mlp()
    hist = SparkModel(model, mode=mode, frequency=frequency, num_workers=2).fit(
        train, epochs=8, batch_size=32, verbose=0, validation_data=val, callbacks=[schedule, stop]
    )
    val_loss = hist.history["val_loss"]
    assert len(val_loss) == 3 and stop.stopped_epoch == 2
    assert val_loss[2] > 2 * min(val_loss[:2])
    # the driver's model holds the best epoch's weights again
    got = model.evaluate(xt, yt, verbose=0, return_dict=True)["loss"]
    assert got == pytest.approx(min(val_loss), rel=1e-4)


@pytest.mark.parametrize("mode, frequency", ENGINES)
def test_reduce_lr_on_plateau_reaches_the_workers(data, mode, frequency):
    train, _, _ = data
    # min_delta so large that every epoch after the first is a plateau: the rate drops
    # 1e6-fold at the end of epoch 1 (on the driver)
    reduce = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=1e-6, patience=1, min_delta=1e9, min_lr=0.0)
    log = WeightLog()
    SparkModel(make_mlp(), mode=mode, frequency=frequency, num_workers=2).fit(
        train, epochs=3, batch_size=32, verbose=0, callbacks=[reduce, log]
    )
    assert log.lr[0] == pytest.approx(0.003) and log.lr[1] == pytest.approx(0.003e-6, rel=1e-3)
    first = _max_change(log.weights[0], log.weights[1])
    second = _max_change(log.weights[1], log.weights[2])
    assert first > 0.05 and second < first * 1e-3, (first, second)


def test_model_checkpoint_writes_loadable_keras_files(data, tmp_path):
    train, val, (xt, yt) = data
    every = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch:02d}.keras"))
    best = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_accuracy", mode="max", save_best_only=True)
    model = make_mlp()
    hist = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2).fit(
        train, epochs=3, batch_size=32, verbose=0, validation_data=val, callbacks=[every, best]
    )
    files = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "epoch-*.keras")))
    assert files == ["epoch-01.keras", "epoch-02.keras", "epoch-03.keras"]
    last = keras.saving.load_model(str(tmp_path / "epoch-03.keras"))
    for a, b in zip(last.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(last.predict(xt, verbose=0), model.predict(xt, verbose=0), rtol=1e-6)
    assert last.optimizer.iterations.numpy() == model.optimizer.iterations.numpy()
    loaded_best = keras.saving.load_model(str(tmp_path / "best.keras"))
    acc = loaded_best.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    assert acc == pytest.approx(max(hist.history["val_accuracy"]), abs=1e-6)


def test_csv_logger_and_tensorboard_record_the_merged_epoch_logs(data, tmp_path):
    import tensorflow as tf

    train, val, _ = data
    csv_path = tmp_path / "log.csv"
    tb_dir = tmp_path / "tb"
    model = make_mlp()
    hist = SparkModel(model, mode="allreduce", num_workers=2).fit(
        train, epochs=3, batch_size=32, verbose=0, validation_data=val,
        callbacks=[keras.callbacks.CSVLogger(str(csv_path)), keras.callbacks.TensorBoard(str(tb_dir))],
    )
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert [float(r[key]) for r in rows] == pytest.approx(hist.history[key], rel=1e-6)

    def scalars(sub, tag):
        values = {}
        for path in glob.glob(str(tb_dir / sub / "events.out.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(path):
                for v in event.summary.value:
                    if v.tag == tag:
                        values[event.step] = float(tf.make_ndarray(v.tensor))
        return [values[k] for k in sorted(values)]

    assert scalars("train", "epoch_loss") == pytest.approx(hist.history["loss"], rel=1e-6)
    assert scalars("validation", "epoch_accuracy") == pytest.approx(hist.history["val_accuracy"], rel=1e-6)


def test_terminate_on_nan_stops_during_the_first_epoch(sc):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 8)).astype("float32")
    y = (x @ rng.normal(size=8) * 100).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(10.0), "mse")  # diverges to inf/NaN within a few steps
    sm = SparkModel(model, mode="asynchronous", frequency=1, num_workers=2)
    hist = sm.fit(to_simple_rdd(sc, x, y), epochs=20, batch_size=8, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert len(hist.history["loss"]) == 1
    assert not math.isfinite(hist.history["loss"][0])
    assert sm.stats.epochs[0].interrupted and sm.stats.epochs[0].samples < len(x)


def test_batch_frequency_checkpoints_are_refused(data):
    train, _, _ = data
    with pytest.raises(ConfigError, match="save_freq='epoch'"):
        SparkModel(make_mlp()).fit(train, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint("x.keras", save_freq=10)])
    with pytest.raises(ConfigError, match="Callback instances"):
        SparkModel(make_mlp()).fit(train, verbose=0, callbacks=[lambda logs: None])
