"""SparkModel.fit_stream on Spark's file source (local[2]): one training pass per micro-batch on an engine
that lives as long as the query, the model committed with each batch id, a restarted query that trains
no micro-batch twice and skips none (equal to an uninterrupted run), a failed micro-batch trained again
from the last commit without its partial updates, and model versions a reader only ever sees whole."""

import contextlib
import json
import os
import time

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import dies_after_commit
from pyspark.errors import StreamingQueryException

from sparkdl_train import SparkModel, load_latest, load_spark_model
from sparkdl_train.driver import stream
from sparkdl_train.errors import ConfigError, DataError
from sparkdl_train.model_io import get_state

FILES, ROWS, DIM = 5, 512, 8
SCHEMA = "features array<double>, label double"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """FILES Parquet files of ROWS rows from a planted logistic model, written one after another (the file
    source takes them oldest first, one per micro-batch), and the held-out rows' Bayes accuracy."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=DIM) * 1.5
    folder = tmp_path_factory.mktemp("stream_in")
    for i in range(FILES):
        x = rng.normal(size=(ROWS, DIM))
        y = (rng.random(ROWS) < 1 / (1 + np.exp(-x @ w))).astype("float64")
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"features": list(x), "label": y}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # distinct modification times: a fixed order
    x = rng.normal(size=(4000, DIM))
    p = 1 / (1 + np.exp(-x @ w))
    y = (rng.random(4000) < p).astype("float64")
    return {"folder": str(folder), "x": x, "y": y, "bayes": float(np.mean((p > 0.5) == (y > 0.5)))}


def _model():
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
    m.compile(optimizer=keras.optimizers.Adam(0.03), loss="binary_crossentropy", metrics=["accuracy"])
    return m


def _stream(spark, planted):
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(planted["folder"])


def _run(spark, planted, location, engine=None, **kwargs):
    """A query over every file (availableNow), to its end: the SparkModel and the StreamFit."""
    sm = SparkModel(_model(), num_workers=2, **(engine or {}))
    fit = sm.fit_stream(_stream(spark, planted), str(location), batch_size=32, trigger={"availableNow": True}, **kwargs)
    try:
        with contextlib.suppress(StreamingQueryException):  # a query that failed: the test reads fit.exception()
            fit.awaitTermination(300)
    finally:
        fit.stop()
    return sm, fit


def _accuracy(model, planted):
    return float(np.mean((model.predict(planted["x"], verbose=0)[:, 0] > 0.5) == (planted["y"] > 0.5)))


@pytest.fixture
def mlflow_store(tmp_path):
    """An MLflow tracking store and model registry in SQLite, artifacts under the test's folder."""
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("stream", artifact_location=(tmp_path / "artifacts").as_uri()))
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(before)


def test_each_micro_batch_is_one_pass_committed_with_its_id_and_versions_are_published_whole(spark, planted, tmp_path,
                                                                                             mlflow_store):
    sm, fit = _run(spark, planted, tmp_path / "ckpt", {"mode": "synchronous", "frequency": "batch"}, publish_every=2,
                   publish_dir=str(tmp_path / "versions"), prequential=True, mlflow=True, registered_model="stream_test")
    assert fit.exception() is None
    trained = [b for b in fit.batches if b.skipped is None]
    assert [b.batch_id for b in trained] == list(range(FILES)) and all(b.rows == ROWS and b.attempts == 1 for b in trained)
    assert fit.committed == FILES - 1
    # Spark's progress report of each micro-batch on its record (the file source reports no lag), and the summary
    deadline = time.monotonic() + 30
    while not all(b.reported for b in fit.batches) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(b.reported and b.lag is None and b.processed_rows_per_second > 0 for b in fit.batches), fit.batches
    progress = fit.progress(window=FILES)
    assert (progress.trained_batches, progress.trained_rows, progress.committed) == (FILES, FILES * ROWS, FILES - 1)
    assert progress.rows_per_second == pytest.approx(FILES * ROWS / sum(b.seconds for b in trained))
    assert progress.prequential["accuracy"] == pytest.approx(np.mean([b.prequential["accuracy"] for b in trained]))
    # one engine for the whole query: one fit's stats, a pass per micro-batch, one parameter server's pushes
    assert len(sm.stats.epochs) == FILES and [e.samples for e in sm.stats.epochs] == [ROWS] * FILES
    steps = sum(e.batches for e in sm.stats.epochs)
    assert sm.stats.server["updates"] >= steps / 2 > ROWS / 32, sm.stats.server
    # each micro-batch scored before training on it: the later ones by a model that learnt from the earlier ones
    first, last = trained[0].prequential["accuracy"], trained[-1].prequential["accuracy"]
    assert last > first + 0.1 and last > planted["bayes"] - 0.08, (first, last, planted["bayes"])
    assert _accuracy(sm.model, planted) > planted["bayes"] - 0.05, planted["bayes"]
    # versions after micro-batches 1 and 3 (every 2 trained); LATEST names the newest, with its offsets
    assert [b.version for b in trained] == [None, 1, None, 2, None]
    latest = stream.latest_version(str(tmp_path / "versions"))
    assert latest["version"] == 2 and latest["batch_id"] == 3 and latest["offsets"][0]["logOffset"] == 3, latest
    assert sorted(f for f in os.listdir(tmp_path / "versions") if not f.startswith(".")) == ["LATEST", "v000001", "v000002"]
    loaded = load_latest(str(tmp_path / "versions"))
    assert loaded.stream_version["version"] == 2
    assert not np.allclose(np.asarray(loaded.model.weights[0]), np.asarray(sm.model.weights[0]))  # version 2 is before micro-batch 4's pass
    # with MLflow on, each version is also a registered model version, tagged with its micro-batch and offsets
    client = mlflow_store.MlflowClient()
    versions = sorted(client.search_model_versions("name='stream_test'"), key=lambda v: int(v.version))
    assert [(str(v.version), v.tags["sparkdl_train.batch_id"]) for v in versions] == [("1", "1"), ("2", "3")], versions
    assert json.loads(versions[1].tags["sparkdl_train.offsets"])[0]["logOffset"] == 3
    registered = mlflow_store.keras.load_model("models:/stream_test/2")
    for a, b in zip(registered.get_weights(), loaded.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def _weights(model):
    return [np.asarray(w) for w in get_state(model)]


@pytest.fixture(scope="module")
def uninterrupted(spark, planted, tmp_path_factory):
    """The averaging engine's run over every file at once: the reference the restarted runs must equal."""
    sm, fit = _run(spark, planted, tmp_path_factory.mktemp("ref"))
    assert [b.batch_id for b in fit.batches] == list(range(FILES))
    return _weights(sm.model)


def test_a_restarted_query_trains_no_micro_batch_twice_and_skips_none(spark, planted, tmp_path, uninterrupted, monkeypatch):
    """The query dies twice: after the model's commit of micro-batch 1 but before Spark's (Spark replays it on
    restart: skipped, its id committed), and inside micro-batch 3's pass with no retries left (Spark replays it:
    trained, from micro-batch 2's commit). The model ends equal to the uninterrupted run's."""
    location = tmp_path / "ckpt"
    with dies_after_commit(monkeypatch, 1):
        _, first = _run(spark, planted, location)
    assert first.exception() is not None and "micro-batch 1" in str(first.exception())

    class DieInPass(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 3:
                raise RuntimeError("the driver dies inside micro-batch 3's pass")

    _, second = _run(spark, planted, location, callbacks=[DieInPass()], stream_retries=0)
    assert [(b.batch_id, b.skipped) for b in second.batches] == [(1, "committed"), (2, None), (3, None)]
    assert "inside micro-batch 3" in second.batches[-1].error and second.committed == 2

    sm, third = _run(spark, planted, location)
    assert [(b.batch_id, b.skipped, b.rows) for b in third.batches] == [(3, None, ROWS), (4, None, ROWS)]
    history = stream.Checkpointer(str(location / "model")).restore(_model())
    assert history.epochs_done == FILES and history.info["batch_id"] == FILES - 1  # five micro-batches trained, all runs
    for got, want in zip(_weights(sm.model), uninterrupted):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_failed_micro_batch_is_trained_again_from_the_last_commit_without_its_updates(spark, planted, tmp_path, uninterrupted,
                                                                                       monkeypatch):
    """Micro-batch 2's pass runs to its end (every update applied), then fails before the commit: it is trained
    again from micro-batch 1's state, not on top of its own updates; the model equals the uninterrupted run's."""
    real, failed = stream._Trainer._pass, []

    def pass_then_fail(self, df, record):
        out = real(self, df, record)
        if record.batch_id == 2 and not failed:
            failed.append([w.copy() for w in _weights(self.sm.model)])
            raise RuntimeError("an executor was lost at the end of micro-batch 2")
        return out

    monkeypatch.setattr(stream._Trainer, "_pass", pass_then_fail)
    sm, fit = _run(spark, planted, tmp_path / "ckpt")
    assert fit.exception() is None
    assert [(b.batch_id, b.attempts) for b in fit.batches] == [(0, 1), (1, 1), (2, 2), (3, 1), (4, 1)]
    got = _weights(sm.model)
    for g, want in zip(got, uninterrupted):
        np.testing.assert_allclose(g, want, atol=1e-5)
    # the failed attempt had moved the weights: applying its updates twice would show
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(failed[0], got)) > 1e-3


BATCH_TIMEOUT = 45.0  # above a micro-batch's attempt on a loaded machine (the first sets the engine up)


@pytest.mark.slow
def test_a_stalled_micro_batch_is_cancelled_after_batch_timeout_and_trained_again(spark, planted, tmp_path, uninterrupted):
    """Micro-batch 2's first task to read its first row hangs (an executor stalled); after batch_timeout its Spark
    jobs are cancelled and it is trained again from micro-batch 1's commit: the query goes on, the model equal to
    the uninterrupted run's."""
    import time

    marker = str(tmp_path / "stalled")
    first = pq.read_table(os.path.join(planted["folder"], "part-002.parquet")).column("features")[0].as_py()

    def stall_once(columns):
        from pyspark import TaskContext

        if TaskContext.get() is not None and not os.path.exists(marker) and \
                np.any(np.all(np.isclose(columns["features"], first), axis=1)):
            open(marker, "w").close()
            time.sleep(600)  # the task hangs: only a cancel ends it
        return {}

    started = time.monotonic()
    sm, fit = _run(spark, planted, tmp_path / "ckpt", transform=stall_once, batch_timeout=BATCH_TIMEOUT)
    assert fit.exception() is None and os.path.exists(marker)
    assert [(b.batch_id, b.attempts) for b in fit.batches] == [(0, 1), (1, 1), (2, 2), (3, 1), (4, 1)]
    assert fit.batches[2].seconds < BATCH_TIMEOUT + 60  # bounded: the timeout, the cancel, one more attempt
    assert time.monotonic() - started < 600  # the hung task did not hold the query
    for got, want in zip(_weights(sm.model), uninterrupted):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_bad_stream_arguments_are_refused_naming_the_problem(spark, planted, tmp_path):
    sm = SparkModel(_model())
    with pytest.raises(DataError, match="streaming DataFrame"):
        sm.fit_stream(spark.range(3), str(tmp_path))
    with pytest.raises(ConfigError, match="publish_every and publish_dir"):
        sm.fit_stream(_stream(spark, planted), str(tmp_path), publish_every=2)
    with pytest.raises(ConfigError, match="checkpoint_location"):
        sm.fit_stream(_stream(spark, planted), "")
    with pytest.raises(ConfigError, match="trigger"):
        sm.fit_stream(_stream(spark, planted), str(tmp_path), trigger=5)
    with pytest.raises(ConfigError, match="batch_timeout"):
        sm.fit_stream(_stream(spark, planted), str(tmp_path), batch_timeout=0)
    assert not spark.streams.active


DRIFT_AT, DRIFTED, RECOVERY = 4, 4, 2  # micro-batches before the drift, after it; within how many it recovers


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    """DRIFT_AT files clicked by one planted logistic model, then DRIFTED files by another (same features, a
    changed taste), one file per micro-batch."""
    rng = np.random.default_rng(21)
    before, after = rng.normal(size=DIM) * 1.5, rng.normal(size=DIM) * 1.5
    folder = tmp_path_factory.mktemp("drift_in")
    files = []
    for i in range(DRIFT_AT + DRIFTED):
        x = rng.normal(size=(ROWS, DIM))
        y = (rng.random(ROWS) < 1 / (1 + np.exp(-x @ (before if i < DRIFT_AT else after)))).astype("float64")
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"features": list(x), "label": y}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        files.append((x, y))
    return {"folder": str(folder), "files": files}


def test_after_a_drift_the_streamed_model_recovers_within_two_micro_batches_where_a_frozen_one_does_not(spark, drift, tmp_path):
    from sklearn.metrics import roc_auc_score

    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
    m.compile(optimizer=keras.optimizers.Adam(0.03), loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    sm = SparkModel(m, num_workers=2)
    stream_df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(drift["folder"])
    fit = sm.fit_stream(stream_df, str(tmp_path / "ckpt"), batch_size=32, passes=2, trigger={"availableNow": True},
                        prequential=True, publish_every=DRIFT_AT, publish_dir=str(tmp_path / "versions"))
    try:
        fit.awaitTermination(300)
    finally:
        fit.stop()
    assert fit.exception() is None
    auc = [b.prequential["auc"] for b in fit.batches if b.skipped is None]
    assert len(auc) == DRIFT_AT + DRIFTED
    # frozen: the version published at the drift (trained on the first DRIFT_AT micro-batches), never trained again
    frozen = load_spark_model(str(tmp_path / "versions" / "v000001")).model
    frozen_auc = [roc_auc_score(y, frozen.predict(x, verbose=0)[:, 0]) for x, y in drift["files"]]
    settled = auc[DRIFT_AT - 1]  # the streamed model just before the drift, scoring unseen rows
    assert settled > 0.85 and abs(frozen_auc[DRIFT_AT - 1] - settled) < 0.05, (auc, frozen_auc)
    assert auc[DRIFT_AT] < settled - 0.15, auc  # the drift shows: the first drifted micro-batch scores badly
    back = DRIFT_AT + RECOVERY  # recovered: scored before training on it, within 0.05 of before the drift
    assert min(auc[back:]) > settled - 0.05, (auc, frozen_auc)
    assert max(frozen_auc[DRIFT_AT:]) < settled - 0.15, (auc, frozen_auc)  # the frozen model stays behind
