"""fit(checkpoint_dir=...): per-epoch state on disk, and a resumed fit equal to an uninterrupted one."""

import json
import os

import keras
import numpy as np
import pytest

from sparkdl_train import SparkModel
from sparkdl_train.driver.checkpoint import Checkpointer
from sparkdl_train.errors import ConfigError
from sparkdl_train.model_io import get_state

EPOCHS = 4


@pytest.fixture(scope="module")
def frame(spark, digits):
    import pandas as pd

    x, y, _, _ = digits
    pdf = pd.DataFrame({"features": list(x[:800].astype("float64")), "label": y[:800]})
    return spark.createDataFrame(pdf).repartition(2).cache()


class CrashAt(keras.callbacks.Callback):
    """Stands for a job dying: raises at the start of epoch ``at``."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError(f"simulated crash before epoch {epoch}")


def _files(path):
    return sorted(f for f in os.listdir(path) if not f.endswith(".crc"))  # Hadoop's checksum files aside


def _sm(model, mode, frequency):
    return SparkModel(model, mode=mode, frequency=frequency, num_workers=2, seed=3, shuffle_buffer_size=256)


def _state_close(a, b, atol):
    assert len(a) == len(b)
    worst = max(float(np.max(np.abs(np.asarray(u, "float64") - np.asarray(v, "float64")))) if np.size(u) else 0.0
                for u, v in zip(a, b))
    assert worst <= atol, worst


@pytest.mark.parametrize("mode,frequency,atol", [("synchronous", "epoch", 1e-5), ("synchronous", "batch", 1e-4)])
def test_resumed_fit_equals_uninterrupted(frame, mlp, tmp_path, mode, frequency, atol):
    ref = mlp(seed=1)
    ref_hist = _sm(ref, mode, frequency).fit(frame, epochs=EPOCHS, batch_size=32, verbose=0)

    ckpt = str(tmp_path / "ckpt")
    first = mlp(seed=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _sm(first, mode, frequency).fit(frame, epochs=EPOCHS, batch_size=32, verbose=0,
                                        checkpoint_dir=ckpt, callbacks=[CrashAt(2)])
    pointer = json.loads((tmp_path / "ckpt" / "checkpoint.json").read_text())
    assert pointer["epochs_done"] == 2 and pointer["file"] == "state-epoch-00002.bin"
    assert _files(ckpt) == ["checkpoint.json", "state-epoch-00001.bin", "state-epoch-00002.bin"]
    assert [h["loss"] for h in pointer["history"]] == pytest.approx(ref_hist.history["loss"][:2], rel=1e-4)

    # a fresh process would build the model anew: different initial weights prove the restore
    resumed = mlp(seed=99)
    hist = _sm(resumed, mode, frequency).fit(frame, epochs=EPOCHS, batch_size=32, verbose=0, checkpoint_dir=ckpt)
    assert hist.epoch == [2, 3]
    assert hist.history["loss"] == pytest.approx(ref_hist.history["loss"][2:], rel=1e-3)
    _state_close(get_state(resumed), get_state(ref), atol)
    assert int(resumed.optimizer.iterations.numpy()) == int(ref.optimizer.iterations.numpy())
    # only the newest `keep` (2) state files remain
    assert _files(ckpt) == ["checkpoint.json", "state-epoch-00003.bin", "state-epoch-00004.bin"]

    # everything done: a further fit trains nothing and keeps the weights
    again = mlp(seed=5)
    hist = _sm(again, mode, frequency).fit(frame, epochs=EPOCHS, batch_size=32, verbose=0, checkpoint_dir=ckpt)
    assert hist.epoch == []
    _state_close(get_state(again), get_state(ref), atol)


def test_checkpoint_of_another_model_is_refused(frame, mlp, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _sm(mlp(), "synchronous", "epoch").fit(frame, epochs=1, batch_size=64, verbose=0, checkpoint_dir=ckpt)
    other = mlp(inputs=64, classes=5)
    with pytest.raises(ConfigError, match="different model"):
        Checkpointer(ckpt).restore(other)


def test_checkpoint_state_round_trips_exactly(mlp, tmp_path, sc):
    model = mlp(seed=2)
    x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    model.fit(x, np.arange(64) % 10, epochs=1, verbose=0)  # optimizer slots and iterations non-trivial
    ck = Checkpointer("file:" + str(tmp_path / "c"), sc=sc)  # through Hadoop's LocalFileSystem
    ck.save(model, 7, {"loss": 1.5})
    other = mlp(seed=3)
    restored = Checkpointer("file:" + str(tmp_path / "c"), sc=sc).restore(other)
    assert restored.epochs_done == 7 and restored.history == [{"loss": 1.5}]
    for a, b in zip(get_state(model), get_state(other)):
        np.testing.assert_array_equal(a, b)
    assert (tmp_path / "c" / ".state-epoch-00007.bin.crc").exists()  # written by Hadoop, not open()
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        Checkpointer("")
