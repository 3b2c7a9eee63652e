"""MLflow tracking from the driver (sparkdl_train.mlflow): a fit on local[2] logs into a SQLite
tracking store in a temporary folder, read back with MlflowClient; the logged Keras model predicts
what the trained model predicts."""

import json
import sys

import numpy as np
import pytest
from helpers import digits_split, make_mlp

from sparkdl_train import SparkModel
from sparkdl_train.errors import ConfigError

mlflow = pytest.importorskip("mlflow")  # in the test extra; this only guards a hand-made venv


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    # artifacts under the test's folder too (by default ./mlruns in the working directory)
    mlflow.create_experiment("sparkdl_train-test", artifact_location=(tmp_path / "artifacts").as_uri())
    mlflow.set_experiment("sparkdl_train-test")
    yield tmp_path
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(before)


def _data(spark):
    x, y, xt, yt = digits_split()
    return spark.sparkContext.parallelize(list(zip(x, y)), 2), x, y, xt, yt


def test_a_fit_logs_settings_epoch_metrics_placement_and_a_loadable_model(spark, store):
    from mlflow.tracking import MlflowClient

    rdd, x, y, xt, yt = _data(spark)
    model = make_mlp()
    sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2)
    history = sm.fit(rdd, epochs=3, batch_size=32, verbose=0, validation_data=(xt, yt), mlflow=True)
    assert mlflow.active_run() is None  # the run the fit started is ended

    client = MlflowClient()
    (run,) = client.search_runs([mlflow.get_experiment_by_name("sparkdl_train-test").experiment_id])
    assert run.info.status == "FINISHED"
    # every resolved setting as a parameter, and where each came from
    params = run.data.params
    assert params["core.mode"] == "asynchronous" and params["core.frequency"] == "4" and params["core.num_workers"] == "2"
    assert params["fit.epochs"] == "3" and params["fit.batch_size"] == "32"
    settings = json.loads(open(client.download_artifacts(run.info.run_id, "settings.json", str(store))).read())
    sources = {r["setting"]: r["source"] for r in settings["settings"]}
    assert sources["core.mode"] == "argument" and sources["core.seed"] == "default"
    assert set(sources) == {k for k in params if not k.startswith("fit.")}
    # per-epoch metrics and validation metrics, at step = epoch, equal to the History
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        logged = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in logged] == [0, 1, 2], key
        assert [m.value for m in logged] == pytest.approx(history.history[key], rel=1e-6), key
    throughput = client.get_metric_history(run.info.run_id, "samples_per_second")
    assert [m.value for m in throughput] == pytest.approx([e.samples_per_second for e in sm.stats.epochs])
    # where the tasks ran
    tags = run.data.tags
    assert tags["sparkdl_train.executor_ids"] == ",".join(sm.stats.executor_ids()) == "driver"  # local[2]
    assert tags["sparkdl_train.num_workers"] == "2" and tags["sparkdl_train.master"].startswith("local")
    stats = json.loads(open(client.download_artifacts(run.info.run_id, "fit_stats.json", str(store))).read())
    assert stats["mode"] == "asynchronous" and len(stats["epochs"]) == 3
    assert stats["epochs"][0]["samples"] == len(x)
    # the model, with a signature from the data's sample, predicts what the trained model predicts
    loaded = mlflow.keras.load_model(f"runs:/{run.info.run_id}/model")
    np.testing.assert_allclose(loaded.predict(xt, verbose=0), model.predict(xt, verbose=0), atol=1e-6)
    info = mlflow.models.get_model_info(f"runs:/{run.info.run_id}/model")
    assert info.signature is not None
    assert list(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 64]


def test_autolog_logs_into_the_active_run_and_a_failed_fit_marks_its_own_run(spark, store):
    from mlflow.tracking import MlflowClient

    import sparkdl_train.mlflow as tracking

    rdd, x, y, xt, yt = _data(spark)
    tracking.autolog(log_models=False)
    try:
        with mlflow.start_run(run_name="outer") as outer:
            SparkModel(make_mlp(), num_workers=2).fit(rdd, epochs=2, batch_size=64, verbose=0)
            assert mlflow.active_run().info.run_id == outer.info.run_id  # not ended by the fit
        client = MlflowClient()
        run = client.get_run(outer.info.run_id)
        assert run.data.params["core.mode"] == "synchronous" and "loss" in run.data.metrics
        assert [m.step for m in client.get_metric_history(outer.info.run_id, "loss")] == [0, 1]
        assert not client.list_artifacts(outer.info.run_id, "model")  # log_models=False

        # a fit that fails after its run started: the run it started is FAILED
        class Boom(Exception):
            pass

        import keras

        class Fail(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                raise Boom()

        with pytest.raises(Boom):
            SparkModel(make_mlp(), num_workers=2).fit(rdd, epochs=2, batch_size=64, verbose=0, callbacks=[Fail()])
        assert mlflow.active_run() is None
        runs = client.search_runs([run.info.experiment_id], "attributes.status = 'FAILED'")
        assert len(runs) == 1 and runs[0].data.params["core.mode"] == "synchronous"
    finally:
        tracking.autolog(disable=True)
    # switched off: a fit logs nothing
    SparkModel(make_mlp(), num_workers=2).fit(rdd, epochs=1, batch_size=64, verbose=0)
    assert len(MlflowClient().search_runs([run.info.experiment_id])) == 2


def test_without_mlflow_the_switch_says_what_to_install(monkeypatch):
    import sparkdl_train.mlflow as tracking

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    with pytest.raises(ConfigError, match=r"pip install sparkdl_train\[mlflow\]"):
        tracking.autolog()
    with pytest.raises(ConfigError, match="True or False"):
        tracking.enabled("yes")
