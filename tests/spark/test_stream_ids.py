"""fit_stream(dynamic_ids=...) on Spark's file source (local[2]): an id stream with more than ten times more
distinct ids than the embedding table has rows (hot ids that come and go, and a tail of ids seen once). The
table's memory stays bounded, the ids that recur hold rows, those seen once do not, and the model scores the
stream (prequential AUC) better than the same table hashed; committed and published with the model, so a
restarted query ends with the uninterrupted one's tables and weights."""

import contextlib
import os

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import dies_after_commit
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from sparkdl_train import DynamicTable, SparkModel, load_latest, map_ids
from sparkdl_train.errors import ConfigError, DataError
from sparkdl_train.model_io import get_state

CAP = 128  # the embedding's rows
BATCHES, ROWS, WINDOW, SHIFT, TAIL = 6, 1024, 80, 40, 0.25


@pytest.fixture(scope="module")
def churn(tmp_path_factory):
    """BATCHES Parquet files of ROWS events (item id, click): 75% from a window of WINDOW hot ids sliding by
    SHIFT a file (an id is hot for two files), 25% ids seen once. Each id has its own click rate."""
    rng = np.random.default_rng(11)
    hot = rng.integers(1 << 40, 1 << 62, size=SHIFT * (BATCHES + 1))
    effect = dict(zip(hot.tolist(), rng.normal(0, 2.0, size=len(hot)).tolist()))
    folder = tmp_path_factory.mktemp("ids_in")
    distinct, hot_seen = set(), set()
    for b in range(BATCHES):
        n_tail = int(ROWS * TAIL)
        window = hot[b * SHIFT: b * SHIFT + WINDOW]
        ids = np.concatenate([rng.choice(window, ROWS - n_tail), rng.integers(1 << 40, 1 << 62, size=n_tail)])
        logit = np.array([effect[i] if i in effect else rng.normal(0, 2.0) for i in ids.tolist()])
        label = (rng.random(ROWS) < 1 / (1 + np.exp(-logit))).astype("float64")
        order = rng.permutation(ROWS)
        distinct.update(ids.tolist())
        hot_seen.update(window.tolist())
        path = folder / f"part-{b:03d}.parquet"
        pq.write_table(pa.table({"item": ids[order], "label": label[order]}), path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))
    return {"folder": str(folder), "distinct": len(distinct), "hot": hot, "window": lambda b: hot[b * SHIFT: b * SHIFT + WINDOW]}


def _model():
    keras.utils.set_random_seed(5)
    inp = keras.Input((1,), dtype="int64", name="item")
    x = keras.layers.Flatten()(keras.layers.Embedding(CAP, 4, name="items")(inp))
    m = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))
    m.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return m


def _stream(spark, churn, hashed=False):
    df = spark.readStream.schema("item bigint, label double").option("maxFilesPerTrigger", 1).parquet(churn["folder"])
    return df.withColumn("item", F.pmod(F.xxhash64("item"), F.lit(CAP))) if hashed else df


def _run(spark, churn, location, dynamic=True, **kwargs):
    sm = SparkModel(_model(), num_workers=2)
    ids = [DynamicTable("item", "items", admit_after=2, min_idle=1)] if dynamic else None
    fit = sm.fit_stream(_stream(spark, churn, hashed=not dynamic), str(location), batch_size=32,
                        feature_cols=["item"], label_col="label", trigger={"availableNow": True}, prequential=True,
                        dynamic_ids=ids, **kwargs)
    try:
        with contextlib.suppress(StreamingQueryException):
            fit.awaitTermination(300)
    finally:
        fit.stop()
    return sm, fit


@pytest.fixture(scope="module")
def dynamic(spark, churn, tmp_path_factory):
    """The whole stream through dynamic rows, uninterrupted, a version published at its end."""
    where = tmp_path_factory.mktemp("dynamic")
    sm, fit = _run(spark, churn, where / "ckpt", publish_every=BATCHES, publish_dir=str(where / "versions"))
    return sm, fit, where


def test_dynamic_rows_stay_bounded_under_ten_times_their_capacity_in_ids_and_beat_a_hashed_table(spark, churn, dynamic):
    assert churn["distinct"] > 10 * CAP  # ids far beyond the table
    sm, fit, where = dynamic
    assert fit.exception() is None
    trained = [b for b in fit.batches if b.skipped is None]
    assert [b.rows for b in trained] == [ROWS] * BATCHES
    report = [b.ids["item"] for b in trained]
    # memory: the rows of the layer and the table's arrays, whatever the ids; full, then rows go round
    table = fit._trainer.ids.tables["item"]
    assert sm.model.get_layer("items").embeddings.shape == (CAP, 4)
    assert table.nbytes <= table.max_nbytes < 2 << 20 and table.size <= CAP - 1
    assert max(r["held"] for r in report) == CAP - 1 and sum(r["reassigned"] for r in report) >= SHIFT * 2, report
    # the hot ids hold rows, the ids seen once (a quarter of the events) almost never
    last = churn["window"](BATCHES - 1)
    assert np.mean(table.lookup(last) > 0) > 0.95
    assert sum(r["admitted"] for r in report) < len(churn["hot"]) + 10, report
    # quality: scored before training on each micro-batch, the dynamic table beats the same rows hashed
    _, hashed = _run(spark, churn, where / "hashed", dynamic=False)
    dyn_auc = np.mean([b.prequential["auc"] for b in trained[2:]])
    hashed_auc = np.mean([b.prequential["auc"] for b in hashed.batches if b.skipped is None][2:])
    assert dyn_auc > hashed_auc + 0.04 and dyn_auc > 0.6, (dyn_auc, hashed_auc)
    # a published version carries its tables: a reader maps raw ids to the rows its model was trained with
    loaded = load_latest(str(where / "versions"))
    assert loaded.stream_ids["item"].lookup(last).tolist() == table.lookup(last).tolist()
    batch = spark.read.parquet(os.path.join(churn["folder"], f"part-{BATCHES - 1:03d}.parquet"))
    mapped = map_ids(batch, loaded.stream_ids).toPandas()
    raw = batch.toPandas()
    assert mapped["item"].tolist() == table.lookup(raw["item"].to_numpy()).tolist()
    scored = loaded.evaluate(map_ids(batch, loaded.stream_ids), batch_size=256, return_dict=True)
    assert scored["auc"] > 0.75, scored


def _weights(model):
    return [np.asarray(w) for w in get_state(model)]


def test_a_restarted_query_with_dynamic_ids_ends_with_the_uninterrupted_tables_and_weights(spark, churn, dynamic, tmp_path,
                                                                                          monkeypatch):
    ref, whole, _ = dynamic
    with dies_after_commit(monkeypatch, 3):
        _, first = _run(spark, churn, tmp_path / "ckpt")
    assert "micro-batch 3" in str(first.exception())
    sm, second = _run(spark, churn, tmp_path / "ckpt")
    assert [(b.batch_id, b.skipped) for b in second.batches][:2] == [(3, "committed"), (4, None)]
    got, want = second._trainer.ids.tables["item"], whole._trainer.ids.tables["item"]
    for key, a in want.state().items():
        np.testing.assert_array_equal(got.state()[key], a, err_msg=key)
    for g, w in zip(_weights(sm.model), _weights(ref.model)):
        np.testing.assert_allclose(g, w, atol=1e-5)
    # the same location without dynamic_ids: refused, the rows would mean other ids
    with pytest.raises(ConfigError, match="with dynamic_ids"):
        SparkModel(_model()).fit_stream(_stream(spark, churn, hashed=True), str(tmp_path / "ckpt"), feature_cols=["item"],
                                        label_col="label")
    with pytest.raises(DataError, match="column 'label' must hold integer ids"):
        SparkModel(_model()).fit_stream(_stream(spark, churn), str(tmp_path / "other"), feature_cols=["item"], label_col="label",
                                        dynamic_ids=[DynamicTable("label", "items")])
    assert not spark.streams.active
