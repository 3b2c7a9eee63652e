"""Spark ML Estimator/Model in a Pipeline, and SparkModel.save/load through Hadoop's FileSystem."""

import math
import os

import keras
import numpy as np
import pytest
from helpers import make_mlp

from sparkdl_train import ConfigError, ModelError, SparkModel, load_spark_model, to_simple_rdd
from sparkdl_train.ml import KerasEstimator, KerasModel


@pytest.fixture(scope="module")
def pixel_frames(spark, digits):
    """Digits as a DataFrame of 64 scalar columns p0..p63 plus a label, 2 partitions."""
    x, y, xt, yt = digits
    cols = [f"p{i}" for i in range(64)]

    def frame(a, b):
        rows = [(*map(float, r), float(label)) for r, label in zip(a, b)]
        return spark.createDataFrame(rows, cols + ["label"]).repartition(2).cache()

    return frame(x, y), frame(xt, yt), cols


# -- SparkModel.save / load_spark_model ---------------------------------------------------------

def test_spark_model_round_trips_through_hadoop_filesystem(spark, digits, tmp_path):
    x, y, xt, _ = digits
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency=4, num_workers=2, seed=7)
    sm.fit(to_simple_rdd(spark.sparkContext, x, y), epochs=2, batch_size=32, verbose=0)
    where = sm.save(f"file://{tmp_path}/saved")
    assert where == f"file:{tmp_path}/saved"
    # written by Hadoop's LocalFileSystem (a ChecksumFileSystem), not by Python's open()
    assert os.path.exists(tmp_path / "saved" / ".model.keras.crc")
    assert os.path.exists(tmp_path / "saved" / ".sparkdl_train.json.crc")

    loaded = load_spark_model(f"file://{tmp_path}/saved")
    assert (loaded.config.mode, loaded.config.frequency, loaded.config.num_workers, loaded.config.seed) == ("asynchronous", 4, 2, 7)
    for a, b in zip(loaded.model.get_weights(), sm.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(loaded.model.optimizer.variables, sm.model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(loaded.predict(xt), sm.predict(xt), rtol=1e-6)
    # the archive alone is a plain Keras model file
    plain = keras.saving.load_model(str(tmp_path / "saved" / "model.keras"))
    assert plain.count_params() == sm.model.count_params()
    # and training continues from the saved state with the saved config
    loaded.fit(to_simple_rdd(spark.sparkContext, x, y), epochs=1, batch_size=32, verbose=0)
    assert loaded.stats.mode == "asynchronous" and loaded.stats.server["updates"] > 0


def test_saved_column_mapping_and_errors(spark, pixel_frames, tmp_path):
    train, test, cols = pixel_frames
    sm = SparkModel(make_mlp(), num_workers=2)
    sm.fit(train, epochs=1, verbose=0, feature_cols=cols, label_col="label")
    sm.save(str(tmp_path / "cols"))  # no scheme: resolved like Spark's own writers (here: local)
    loaded = load_spark_model(str(tmp_path / "cols"))
    got = loaded.predict(test, prediction_col="p").select("p").toPandas()["p"]
    want = sm.predict(test, prediction_col="p").select("p").toPandas()["p"]
    np.testing.assert_allclose(np.stack(got), np.stack(want), rtol=1e-6)

    with pytest.raises(FileNotFoundError, match="no saved SparkModel"):
        load_spark_model(str(tmp_path / "nothing-here"))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        sm.save(str(tmp_path / "cols"), overwrite=False)


def test_custom_objects_are_named_when_missing_at_load(spark, tmp_path):
    import models

    model = models.subclassed()
    sm = SparkModel(model, custom_objects=models.CUSTOM)
    sm.save(str(tmp_path / "custom"))
    with pytest.raises(ModelError, match="saved with custom objects"):
        load_spark_model(str(tmp_path / "custom"))
    loaded = load_spark_model(str(tmp_path / "custom"), custom_objects=models.CUSTOM)
    assert loaded.model.count_params() == model.count_params()


# -- Spark ML --------------------------------------------------------------------------------------

def test_estimator_in_a_pipeline_trains_transforms_and_persists(spark, pixel_frames, digits, reference_accuracy, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    train, test, cols = pixel_frames
    _, _, _, yt = digits
    keras_model = make_mlp()
    initial = [w.copy() for w in keras_model.get_weights()]
    est = KerasEstimator(model=keras_model, mode="asynchronous", frequency=4, epochs=12, batchSize=32, numWorkers=2)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=cols, outputCol="features"), est])
    fitted = pipeline.fit(train)
    # the estimator's own model is untouched: it can be fitted again
    for a, b in zip(keras_model.get_weights(), initial):
        np.testing.assert_array_equal(a, b)

    stage = fitted.stages[-1]
    assert isinstance(stage, KerasModel) and len(stage.history["loss"]) == 12
    out = fitted.transform(test)
    assert set(out.columns) == {*test.columns, "features", "prediction"}
    rows = out.select("label", "prediction").toPandas()
    accuracy = float(np.mean(np.argmax(np.stack(rows["prediction"]), axis=1) == rows["label"].to_numpy()))
    assert accuracy >= reference_accuracy - 0.05

    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "pipeline"))
    loaded_stage = again.stages[-1]
    assert isinstance(loaded_stage, KerasModel)
    assert loaded_stage.getMode() == "asynchronous" and loaded_stage.getFrequency() == "4"
    assert loaded_stage.history == stage.history and loaded_stage.fitStats["mode"] == "asynchronous"
    rows2 = again.transform(test).select("label", "prediction").toPandas()
    np.testing.assert_allclose(np.stack(rows2["prediction"]), np.stack(rows["prediction"]), rtol=1e-6)

    # an unfitted estimator persists too, Keras model included
    est.write().overwrite().save(str(tmp_path / "estimator"))
    est2 = KerasEstimator.load(str(tmp_path / "estimator"))
    assert est2.uid == est.uid and est2.getEpochs() == 12 and est2.getBatchSize() == 32
    for a, b in zip(est2.getKerasModel().get_weights(), initial):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode, frequency", [("synchronous", "auto"), ("asynchronous", "3"), ("hogwild", "batch"), ("allreduce", "auto")])
def test_estimator_honours_mode_and_frequency(spark, pixel_frames, mode, frequency):
    from pyspark.ml.feature import VectorAssembler

    train, _, cols = pixel_frames
    df = VectorAssembler(inputCols=cols, outputCol="features").transform(train)
    est = KerasEstimator(model=make_mlp(), mode=mode, frequency=frequency, epochs=2, batchSize=64, numWorkers=2)
    stats = est.fit(df).fitStats
    assert stats["mode"] == mode and stats["num_workers"] == 2
    per_partition = [[p["batches"] for p in e["partitions"].values()] for e in stats["epochs"]]
    server = stats["server"]
    if mode == "synchronous":  # once per epoch, merged by Spark's treeReduce: no server
        assert stats["frequency"] == "epoch" and server is None
    elif mode == "allreduce":  # a gradient allreduce every step, for as long as the longest partition
        assert stats["frequency"] == "batch" and server["engine"] == "allreduce"
        assert server["steps"] == sum(max(b) for b in per_partition)
    else:
        every = 1 if frequency == "batch" else int(frequency)
        assert stats["frequency"] == (frequency if frequency == "batch" else every)
        assert server["updates"] == sum(math.ceil(b / every) for e in per_partition for b in e)


def test_estimator_rejects_bad_params():
    with pytest.raises(ConfigError, match="unknown mode 'bogus'"):
        KerasEstimator(model=make_mlp(), mode="bogus")
    with pytest.raises(ConfigError, match="unknown frequency '0'"):
        KerasEstimator(model=make_mlp(), frequency=0)
    est = KerasEstimator()
    with pytest.raises(ConfigError, match="no Keras model"):
        est._fit(None)
