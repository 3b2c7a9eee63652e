"""Spark ML: :class:`KerasEstimator` and :class:`KerasModel`, usable in a ``pyspark.ml.Pipeline``.

``KerasEstimator(model=compiled_keras_model, mode=..., frequency=..., epochs=...)``
trains a copy of the model with :class:`~sparkdl_train.SparkModel` (the
estimator's own model is never changed, so it can be fitted again) and returns
a :class:`KerasModel`, whose ``transform`` adds a prediction column computed on
the executors. Both save and load through ``MLWritable`` / ``MLReadable``
(params as Spark ML metadata, the Keras archive as ``model.keras`` next to it,
through Spark's Hadoop filesystem API), so whole pipelines persist.

Custom layers must be registered with ``keras.saving.register_keras_serializable``
for a saved stage to load (``MLReadable.load`` takes no custom objects).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasWeightCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from .config import all_settings, check_setting
from .data.transform import BatchTransform
from .driver.spark_model import SparkModel
from .errors import ConfigError
from .fs import FileSystem, join
from .model_io import check_compiled, load_archive, load_model_bytes, save_archive, serialize_model

log = logging.getLogger(__name__)

MODEL_FILE = "model.keras"


def _mode(value: Any) -> str:
    return check_setting("mode", TypeConverters.toString(value))


def _frequency(value: Any) -> str:
    """The setting's values, kept as a string param; ``'auto'``: the mode's default (None)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    value = TypeConverters.toString(value)
    if value != "auto":
        check_setting("frequency", int(value) if value.isdigit() and int(value) > 0 else value)
    return value


# settings with a param of their own; every other setting goes through engineOptions
_OWN_PARAMS = {"mode": "mode", "frequency": "frequency", "num_workers": "numWorkers", "seed": "seed"}


def _engine_options(value: Any) -> dict[str, Any]:
    value = dict(_json_value(value) or {})
    for name, v in value.items():
        if name in _OWN_PARAMS:
            raise ConfigError(f"engineOptions: set {name!r} with the {_OWN_PARAMS[name]!r} param, not in engineOptions")
        check_setting(name, v)
    return value


def _doc(arg: str) -> str:
    return next(s.doc for s in all_settings() if s.arg == arg)


def _json_value(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError as exc:
        raise TypeError(f"must be JSON-serializable (it is saved with the stage): {exc}") from None
    return value


class _KerasParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasWeightCol):
    inputCols = Param(
        Params._dummy(), "inputCols",
        "columns per model input, for multi-input models: {input name: column or [columns]} or a list "
        "(one entry per input); overrides featuresCol", typeConverter=_json_value,
    )
    mode = Param(Params._dummy(), "mode", _doc("mode"), typeConverter=_mode)
    frequency = Param(Params._dummy(), "frequency", _doc("frequency") + " 'auto': the mode's default.", typeConverter=_frequency)
    epochs = Param(Params._dummy(), "epochs", "passes over the data", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "rows per step (per worker)", typeConverter=TypeConverters.toInt)
    numWorkers = Param(Params._dummy(), "numWorkers", _doc("num_workers") + " 0: the default.", typeConverter=TypeConverters.toInt)
    validationSplit = Param(Params._dummy(), "validationSplit", "seeded random fraction held out for val_* metrics", typeConverter=TypeConverters.toFloat)
    verbose = Param(Params._dummy(), "verbose", "0: silent, 1: live progress bar, 2: a line per epoch", typeConverter=TypeConverters.toInt)
    seed = Param(Params._dummy(), "seed", _doc("seed"), typeConverter=TypeConverters.toInt)
    engineOptions = Param(
        Params._dummy(), "engineOptions",
        "further SparkModel settings by argument name, e.g. {'staleness_bound': 4, 'compression': 'fp16'} "
        "(sparkdl_train.config lists them)", typeConverter=_engine_options,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            featuresCol="features", labelCol="label", predictionCol="prediction", inputCols=None,
            mode="synchronous", frequency="auto", epochs=1, batchSize=32, numWorkers=0,
            validationSplit=0.0, verbose=0, seed=0, engineOptions={},
        )

    def feature_columns(self) -> Any:
        cols = self.getOrDefault(self.inputCols)
        return cols if cols else self.getFeaturesCol()

    def getMode(self) -> str:
        return self.getOrDefault(self.mode)

    def getFrequency(self) -> str:
        return self.getOrDefault(self.frequency)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def spark_model(self, model: Any, custom_objects: dict[str, Any] | None) -> SparkModel:
        freq = self.getFrequency()
        options = dict(self.getOrDefault(self.engineOptions) or {})
        workers = self.getOrDefault(self.numWorkers)
        return SparkModel(
            model,
            mode=self.getMode(),
            frequency=None if freq == "auto" else int(freq) if freq.isdigit() else freq,
            num_workers=workers or None,
            seed=self.getOrDefault(self.seed),
            custom_objects=custom_objects,
            **options,
        )


class _KerasStage(_KerasParams, MLWritable, MLReadable):
    """What the estimator and the model share: a Keras model, params, persistence."""

    def __init__(self, model: Any = None, custom_objects: dict[str, Any] | None = None, transform: Any = None, **params: Any):
        super().__init__()
        self._keras_model = None
        self._custom_objects = dict(custom_objects or {})
        self._batch_transform = None
        if model is not None:
            self.setKerasModel(model)
        if transform is not None:
            self.setTransform(transform)
        self._set(**params)

    def setTransform(self, fn: Any) -> "_KerasStage":
        """The batch transform the DataFrame's columns go through on the executors (see
        ``SparkModel.fit(transform=...)``); the fitted model keeps it. It is a function, so it is
        not saved with the stage: set it again after loading."""
        if fn is not None:
            BatchTransform(fn)
        self._batch_transform = fn
        return self

    def getTransform(self) -> Any:
        return self._batch_transform

    def setKerasModel(self, model: Any) -> "_KerasStage":
        check_compiled(model)
        self._keras_model = model
        return self

    def getKerasModel(self) -> Any:
        return self._keras_model

    def setParams(self, **params: Any) -> "_KerasStage":
        return self._set(**params)

    def _extra_metadata(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, metadata: dict[str, Any]) -> None:
        pass

    def write(self) -> MLWriter:
        return _KerasWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _KerasReader(cls)


class KerasEstimator(_KerasStage, Estimator):
    """Trains a Keras model on a DataFrame with sparkdl_train; ``fit`` returns a :class:`KerasModel`.

    >>> est = KerasEstimator(model=compiled, mode="asynchronous", frequency=4, epochs=3,
    ...                      featuresCol="features", labelCol="label")
    >>> fitted = Pipeline(stages=[assembler, est]).fit(train_df)
    """

    def __init__(self, model: Any = None, custom_objects: dict[str, Any] | None = None, transform: Any = None, **params: Any):
        super().__init__(model, custom_objects, transform, **params)

    def _fit(self, dataset: Any) -> "KerasModel":
        if self._keras_model is None:
            raise ConfigError("KerasEstimator has no Keras model: pass model=... or call setKerasModel(model)")
        # train a copy: an estimator stays as it was, so it can be fitted again (e.g. by a CrossValidator)
        model = load_archive(serialize_model(self._keras_model, self._custom_objects))
        sm = self.spark_model(model, self._custom_objects)
        weight = self.getOrDefault(self.weightCol) if self.isDefined(self.weightCol) else None
        history = sm.fit(
            dataset,
            epochs=self.getEpochs(),
            batch_size=self.getBatchSize(),
            verbose=self.getOrDefault(self.verbose),
            validation_split=self.getOrDefault(self.validationSplit),
            feature_cols=self.feature_columns(),
            label_col=self.getLabelCol(),
            sample_weight_col=weight,
            transform=self._batch_transform,
        )
        fitted = KerasModel(model=model, custom_objects=self._custom_objects, transform=self._batch_transform)
        fitted.history = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        fitted.fitStats = sm.stats.as_dict()
        return self._copyValues(fitted)


class KerasModel(_KerasStage, Model):
    """A trained Keras model; ``transform`` adds ``predictionCol`` (computed on the executors).

    ``history`` holds the epoch logs of the fit that made it, ``fitStats`` its
    statistics (engine, workers, updates, bytes); both are saved with it.
    """

    def __init__(self, model: Any = None, custom_objects: dict[str, Any] | None = None, transform: Any = None, **params: Any):
        super().__init__(model, custom_objects, transform, **params)
        self.history: dict[str, list[float]] = {}
        self.fitStats: dict[str, Any] | None = None

    def _transform(self, dataset: Any) -> Any:
        if self._keras_model is None:
            raise ConfigError("KerasModel has no Keras model")
        sm = SparkModel(self._keras_model, custom_objects=self._custom_objects)
        return sm.predict(
            dataset, batch_size=max(256, self.getBatchSize()), feature_cols=self.feature_columns(),
            prediction_col=self.getPredictionCol(), transform=self._batch_transform,
        )

    def _extra_metadata(self) -> dict[str, Any]:
        return {"history": self.history, "fitStats": self.fitStats}

    def _load_extra(self, metadata: dict[str, Any]) -> None:
        self.history = metadata.get("history") or {}
        self.fitStats = metadata.get("fitStats")


def _classic_only(io: Any, what: str) -> None:
    """Spark ML's metadata writer and reader need a SparkContext, which a Spark Connect client has not."""
    from .data.sessions import is_connect_session

    if is_connect_session(io.sparkSession):
        raise ConfigError(
            f"KerasEstimator/KerasModel {what} needs a classic SparkSession (Spark ML's metadata files go through the "
            "SparkContext); on a Spark Connect session save the trained model with SparkModel.save (docs/connect.md)"
        )


class _KerasWriter(MLWriter):
    def __init__(self, instance: _KerasStage):
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        _classic_only(self, "save")  # before Spark ML's own overwrite handling, which needs the JVM too
        super().save(path)

    def saveImpl(self, path: str) -> None:
        inst = self.instance
        if inst.getTransform() is not None:
            log.warning("%s: the batch transform is a function and is not saved; call setTransform(fn) after loading", path)
        extra = {**inst._extra_metadata(), "hasKerasModel": inst._keras_model is not None}
        DefaultParamsWriter.saveMetadata(inst, path, self.sc, extraMetadata=json.loads(json.dumps(extra, default=str)))
        if inst._keras_model is not None:
            FileSystem(self.sc).write_bytes(join(path, MODEL_FILE), save_archive(inst._keras_model))


class _KerasReader(MLReader):
    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> _KerasStage:
        _classic_only(self, "load")
        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        inst = self.cls()
        if metadata.get("hasKerasModel"):
            inst.setKerasModel(load_model_bytes(FileSystem(self.sc).read_bytes(join(path, MODEL_FILE))))
        DefaultParamsReader.getAndSetParams(inst, metadata)
        inst._resetUid(metadata["uid"])
        inst._load_extra(metadata)
        return inst
