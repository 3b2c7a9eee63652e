import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from sparkdl_train.datasets import ctr
from sparkdl_train.models.ctr import ctr_features, deepfm, vocabulary, wide_and_deep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_generator_is_deterministic_whatever_the_partitioning(spark):
    spec = ctr.CTRSpec(rows=9000, seed=5)
    a = ctr.generate(spark, spec, partitions=1).orderBy("id").toPandas()
    b = ctr.generate(spark, spec, partitions=3).orderBy("id").toPandas()
    assert len(a) == 9000 and a["id"].tolist() == list(range(9000))
    assert a.equals(b)
    other = ctr.generate(spark, ctr.CTRSpec(rows=9000, seed=6), partitions=2).orderBy("id").toPandas()
    assert not a["label"].equals(other["label"])


def test_labels_follow_the_planted_model(spark):
    spec = ctr.CTRSpec(rows=30000, seed=1)
    df = ctr.generate(spark, spec)
    m = ctr.bayes_metrics(df)
    assert abs(m["positive_rate"] - 0.25) < 0.02
    assert 0.75 < m["auc"] < 0.97
    pdf = df.limit(2000).toPandas()
    # the oracle column is the planted probability of these very features
    planted = ctr.PlantedModel.make(spec)
    dense = pdf[ctr.DENSE_COLS].to_numpy(np.float64)
    cats = pdf[ctr.CAT_COLS].to_numpy(np.int64)
    np.testing.assert_allclose(planted.probability(dense, cats), pdf["p_true"], rtol=1e-6)
    # Zipf: the most frequent id of a large field is far more common than the median one
    counts = np.bincount(cats[:, 7])
    assert counts.max() > 20 * max(1, np.median(counts[counts > 0]))


def test_features_hash_into_each_fields_own_bucket_range(spark):
    df = ctr.generate(spark, ctr.CTRSpec(rows=5000, seed=2))
    buckets = vocabulary(df, ctr.CAT_COLS, max_buckets=256)
    assert all(b & (b - 1) == 0 and 2 <= b <= 256 for b in buckets)
    feats = ctr_features(df, ctr.DENSE_COLS, ctr.CAT_COLS, buckets).select("numeric", "categorical", *ctr.DENSE_COLS).limit(500).toPandas()
    cat = np.stack(feats["categorical"].to_numpy())
    offsets = np.concatenate([[0], np.cumsum(buckets)[:-1]])
    assert cat.shape == (500, 26)
    assert ((cat >= offsets) & (cat < offsets + np.array(buckets))).all()
    np.testing.assert_allclose(np.stack(feats["numeric"].to_numpy()), np.log1p(feats[ctr.DENSE_COLS].to_numpy()), rtol=1e-5)


@pytest.mark.parametrize("builder", [deepfm, wide_and_deep])
def test_ctr_models_learn_the_planted_signal_single_process(builder):
    spec = ctr.CTRSpec(rows=1, seed=3, cardinalities=(4, 10, 30, 100) * 6 + (4, 10))
    planted = ctr.PlantedModel.make(spec)
    rng = np.random.default_rng(0)
    dense, cats = ctr.sample_features(spec, rng, 20000)
    y = (rng.random(len(dense)) < planted.probability(dense, cats)).astype("float32")
    offsets = np.concatenate([[0], np.cumsum(spec.cardinalities)[:-1]])
    x = {"numeric": np.log1p(dense).astype("float32"), "categorical": (cats + offsets).astype("int32")}
    keras.utils.set_random_seed(0)
    model = builder(vocab_size=int(sum(spec.cardinalities)), learning_rate=0.005)
    model.fit(x, y, epochs=3, batch_size=256, verbose=0)
    assert model.evaluate(x, y, verbose=0, return_dict=True)["auc"] > 0.8


@pytest.mark.slow
def test_flagship_job_runs_under_spark_submit(tmp_path):
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run(
        [spark_submit, "--master", "local[2]", os.path.join(ROOT, "jobs", "train_ctr.py"),
         "--rows", "60000", "--epochs", "2", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "test AUC" in proc.stdout and "Bayes-optimal" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["train_rows"] + summary["test_rows"] == 60000
    assert summary["epochs"] == 2 and summary["workers"] == 2
    assert 0.7 < summary["test_auc"] <= summary["bayes_auc"] + 0.01
    assert abs(summary["test_auc"] - summary["test_auc_keras"]) < 0.01  # two AUC computations agree
    assert summary["train_samples_per_second"] > 0
    reloaded = keras.saving.load_model(summary["model_path"])
    assert reloaded.count_params() > 0
