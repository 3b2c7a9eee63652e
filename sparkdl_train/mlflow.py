"""MLflow tracking of distributed fits, from the driver only.

``mlflow.keras.autolog()`` hooks ``keras.Model.fit``, which a distributed fit never calls: the
executors run the model's steps, and a tracker on every executor would log the same run many
times over. The driver is the one place that sees the whole fit, so it logs (as Ray Train logs from
rank 0 only):

    import sparkdl_train.mlflow
    sparkdl_train.mlflow.autolog()          # every later SparkModel.fit is tracked
    SparkModel(model, mode="asynchronous").fit(df, epochs=5)

or for one fit, ``SparkModel(...).fit(df, ..., mlflow=True)``. Each fit logs into the active run
(``mlflow.start_run()`` around it) or, without one, into a run of its own that it ends:

* every resolved setting as a parameter, and ``settings.json`` (value and where it came from:
  argument, Spark conf or default) as an artifact; the fit's own arguments (epochs, batch size);
* per-epoch metrics (``loss``, the compiled metrics, ``val_*``) at step = epoch, and the epoch's
  throughput (``samples_per_second``) and seconds;
* where the tasks ran: tags ``sparkdl_train.executor_ids``, ``sparkdl_train.hosts``,
  ``sparkdl_train.master``, ``sparkdl_train.num_workers``; the whole ``FitStats`` as
  ``fit_stats.json``;
* the trained model as an MLflow Keras model (``model``) with a signature inferred from the
  driver's sample of the data and the model's predictions on it.

``mlflow`` is an optional dependency (``pip install sparkdl_train[mlflow]``); without it the
switch fails at once, saying so. Nothing here runs on an executor.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .errors import ConfigError

log = logging.getLogger(__name__)

_settings: dict[str, Any] = {"enabled": False, "log_models": True, "run_name": None}


def require() -> Any:
    """The ``mlflow`` module, or a ConfigError saying how to install it."""
    try:
        import mlflow
    except ImportError as exc:
        raise ConfigError("MLflow tracking needs the mlflow package: pip install sparkdl_train[mlflow] "
                          f"(or pip install mlflow); importing it failed: {exc}") from exc
    return mlflow


def autolog(disable: bool = False, log_models: bool = True, run_name: str | None = None) -> None:
    """Track every later ``SparkModel.fit`` of this process in MLflow (``disable=True`` stops it).
    ``log_models``: log the trained model; ``run_name``: the name of runs a fit starts itself."""
    if not disable:
        require()
    _settings.update(enabled=not disable, log_models=bool(log_models), run_name=run_name)


def enabled(requested: Any = None) -> bool:
    """Whether a fit tracks: its own ``mlflow=`` argument when given, else :func:`autolog`'s switch."""
    if requested is None:
        return bool(_settings["enabled"])
    if not isinstance(requested, bool):
        raise ConfigError(f"fit(mlflow=...) takes True or False, got {requested!r}")
    return requested


class FitRun:
    """One fit's MLflow logging: :meth:`start` once the fit's checks have passed, :meth:`callback`
    among its Keras callbacks, then :meth:`finish` or :meth:`fail`."""

    def __init__(self, mlflow: Any, own_run: bool, run_id: str):
        self._mlflow = mlflow
        self._own_run = own_run
        self.run_id = run_id

    @classmethod
    def start(cls, config: Any, fit_args: dict[str, Any]) -> "FitRun":
        mlflow = require()
        active = mlflow.active_run()
        run = active or mlflow.start_run(run_name=_settings["run_name"])
        tracker = cls(mlflow, active is None, run.info.run_id)
        rows = [{"setting": f"{group}.{arg}", "value": _plain(value), "source": source}
                for group, arg, value, source in config.rows()]
        params = {r["setting"]: _param(r["value"]) for r in rows}
        params.update({f"fit.{k}": _param(v) for k, v in fit_args.items()})
        mlflow.log_params(params, run_id=tracker.run_id)
        mlflow.log_dict({"settings": rows, "fit": {k: _plain(v) for k, v in fit_args.items()}}, "settings.json",
                        run_id=tracker.run_id)
        mlflow.set_tags({"sparkdl_train.mode": str(config.mode), "sparkdl_train.frequency": str(config.frequency)})
        log.info("mlflow: logging this fit into run %s%s", tracker.run_id, "" if active is None else " (the active run)")
        return tracker

    def callback(self, spark_model: Any) -> Any:
        """A Keras callback logging each epoch's logs and throughput (``spark_model.stats``)."""
        import keras

        mlflow, run_id = self._mlflow, self.run_id

        class _EpochMetrics(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
                metrics = {k: float(v) for k, v in (logs or {}).items() if _number(v)}
                epochs = getattr(spark_model.stats, "epochs", None) or []
                if epochs and epochs[-1].epoch == epoch:
                    metrics["samples_per_second"] = float(epochs[-1].samples_per_second)
                    metrics["epoch_seconds"] = float(epochs[-1].seconds)
                mlflow.log_metrics(metrics, step=epoch, run_id=run_id)

        return _EpochMetrics()

    def finish(self, model: Any, stats: Any, sample_x: Any) -> None:
        mlflow = self._mlflow
        try:
            hosts = sorted({str(i.get("host")) for e in stats.epochs for i in e.partitions.values() if i.get("host")})
            mlflow.set_tags({
                "sparkdl_train.executor_ids": ",".join(stats.executor_ids()),
                "sparkdl_train.hosts": ",".join(hosts),
                "sparkdl_train.master": str(stats.master),
                "sparkdl_train.num_workers": str(stats.num_workers),
            })
            mlflow.log_dict(json.loads(json.dumps(stats.as_dict(), default=_plain)), "fit_stats.json", run_id=self.run_id)
            self._log_model(model, sample_x)
        except Exception:  # noqa: BLE001 - the fit has trained: a tracking failure is reported, not raised
            log.warning("mlflow: logging the end of the fit into run %s failed", self.run_id, exc_info=True)
        finally:
            if self._own_run:
                mlflow.end_run()

    def fail(self) -> None:
        if self._own_run:
            self._mlflow.end_run(status="FAILED")

    def log_version(self, model: Any, version: int, info: dict[str, Any], registered_model: str | None) -> None:
        """A stream's published model version (``fit_stream``): the model saved into this run's artifacts as
        ``v<version>`` and, when ``registered_model`` is named, registered as a version of it with ``info``
        (micro-batch, offsets, path) as its tags."""
        import tempfile

        import mlflow.keras

        mlflow, name = self._mlflow, f"v{version:06d}"
        tags = {"sparkdl_train.stream_version": str(version), "sparkdl_train.batch_id": str(info.get("batch_id")),
                "sparkdl_train.offsets": json.dumps(info.get("offsets"))[:5000], "sparkdl_train.path": str(info.get("path"))}
        try:
            # through the client, by run id: a query's micro-batches run on Spark's callback threads, where the
            # run is not the active one
            client = mlflow.MlflowClient()
            with tempfile.TemporaryDirectory() as tmp:
                mlflow.keras.save_model(model, f"{tmp}/{name}")
                client.log_artifacts(self.run_id, f"{tmp}/{name}", artifact_path=name)
            registered = None
            if registered_model:
                registered = mlflow.register_model(f"runs:/{self.run_id}/{name}", registered_model, tags=tags).version
            client.log_metric(self.run_id, "stream_version", version, step=int(info.get("batch_id") or 0))
            log.info("mlflow: stream version %d logged into run %s%s", version, self.run_id,
                     f" as {registered_model} version {registered}" if registered_model else "")
        except Exception:  # noqa: BLE001 - the version is published on the file system either way
            log.warning("mlflow: logging stream version %d into run %s failed", version, self.run_id, exc_info=True)

    def _log_model(self, model: Any, sample_x: Any) -> None:
        if not _settings["log_models"]:
            return
        import mlflow.keras
        from mlflow.models import infer_signature

        signature = None
        if sample_x is not None:
            signature = infer_signature(_inputs(sample_x), model.predict(sample_x, verbose=0))
        try:
            mlflow.keras.log_model(model, name="model", signature=signature)
        except TypeError:  # MLflow 2 names it artifact_path
            mlflow.keras.log_model(model, artifact_path="model", signature=signature)


def _inputs(x: Any) -> Any:
    """A model input batch as ``infer_signature`` takes it (a dict of named arrays stays one)."""
    if isinstance(x, (list, tuple)) and len(x) == 1:
        return x[0]
    return x


def _number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if hasattr(v, "item"):
        return v.item()
    return str(v)


def _param(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else v
    return text[:6000]  # MLflow's limit on a parameter's value


def finish_job_run(summary_path: str, metrics: dict[str, float]) -> None:
    """End a job's active run (``jobs/train_ctr.py --mlflow``): its final ``metrics`` (test AUC,
    logloss) and its ``summary.json`` as an artifact."""
    mlflow = require()
    try:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        mlflow.log_artifact(summary_path)
    finally:
        mlflow.end_run()
