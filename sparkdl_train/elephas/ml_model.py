"""Elephas' Spark ML stages (``elephas.ml_model``) on sparkdl_train's engines and Arrow data path.

``ElephasEstimator`` builds the Keras model from its JSON config, compiles it with the estimator's
optimizer, loss and metrics, trains it with :class:`sparkdl_train.SparkModel` straight from the
DataFrame (Arrow batches; no RDD of per-row Python pairs as in Elephas) and returns an
``ElephasTransformer``, whose ``transform`` adds ``outputCol`` computed on the executors.

Differences from Elephas 7, on purpose: known ``mode`` and ``frequency`` values are honoured (Elephas 7
passed them to a ``SparkModel`` that ignored them and trained synchronously; an unknown mode still
trains synchronously here, with a warning); labels outside
``[0, nb_classes)`` fail naming the column instead of raising ``IndexError`` in a task; the transformer
is ``MLWritable``, so a fitted ``PipelineModel`` saves and loads.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsReader, DefaultParamsWritable, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from ..errors import ConfigError, DataError
from ._shim import elephas_settings, plain
from .ml.params import (
    HasBatchSize,
    HasCategoricalLabels,
    HasCustomObjects,
    HasEpochs,
    HasFrequency,
    HasInferenceBatchSize,
    HasKerasModelConfig,
    HasKerasOptimizerConfig,
    HasLoss,
    HasMetrics,
    HasMode,
    HasNumberOfClasses,
    HasNumberOfWorkers,
    HasValidationSplit,
    HasVerbosity,
)
from .utils.model_utils import LossModelTypeMapper, ModelType, ModelTypeEncoder, as_enum

__all__ = ["ElephasEstimator", "ElephasTransformer", "load_ml_estimator", "load_ml_transformer"]

_CONFIG_ATTR = "distributed_config"
_ONE_HOT = "__elephas_one_hot_label"
_WEIGHTS_FILE = "weights.npz"


class ElephasEstimator(Estimator, HasCategoricalLabels, HasValidationSplit, HasKerasModelConfig, HasFeaturesCol,
                       HasLabelCol, HasMode, HasEpochs, HasBatchSize, HasFrequency, HasVerbosity, HasNumberOfClasses,
                       HasNumberOfWorkers, HasOutputCol, HasLoss, HasMetrics, HasKerasOptimizerConfig, HasCustomObjects,
                       DefaultParamsReadable, DefaultParamsWritable):
    """``ElephasEstimator(**params)`` or ``ElephasEstimator()`` and ``set_*`` calls, as in Elephas."""

    @keyword_only
    def __init__(self, **kwargs: Any):
        super().__init__()
        self._setDefault(outputCol="prediction")
        self.set_params(**kwargs)

    @keyword_only
    def set_params(self, **kwargs: Any) -> "ElephasEstimator":
        for name in ("mode", "frequency"):  # Elephas' Mode/Frequency members kept as their strings
            if name in kwargs:
                kwargs[name] = plain(kwargs[name])
        return self._set(**kwargs)

    # Elephas' deprecated setters: they set the column and warn as Elephas' do
    def setFeaturesCol(self, value: str) -> "ElephasEstimator":
        _deprecated("setFeaturesCol", "featuresCol")
        return self._set(featuresCol=value)

    def setLabelCol(self, value: str) -> "ElephasEstimator":
        _deprecated("setLabelCol", "labelCol")
        return self._set(labelCol=value)

    def setOutputCol(self, value: str) -> "ElephasEstimator":
        _deprecated("setOutputCol", "outputCol")
        return self._set(outputCol=value)

    def get_config(self) -> dict[str, Any]:
        return {
            "keras_model_config": self.get_keras_model_config() if self.isDefined(self.keras_model_config) else None,
            "mode": self.get_mode(), "frequency": self.get_frequency(), "num_workers": self.get_num_workers(),
            "categorical": self.get_categorical_labels(),
            "loss": self.get_loss() if self.isDefined(self.loss) else None, "metrics": self.get_metrics(),
            "validation_split": self.get_validation_split(), "featuresCol": self.getFeaturesCol(),
            "labelCol": self.getLabelCol(), "epochs": self.get_epochs(), "batch_size": self.get_batch_size(),
            "verbose": self.get_verbosity(), "nb_classes": self.get_nb_classes(), "outputCol": self.getOutputCol(),
            "optimizer_config": self.get_optimizer_config(),
        }

    def save(self, file_name: str) -> None:  # Elephas writes the estimator's config into an HDF5 file
        _write_config(file_name, type(self).__name__, self.get_config())

    def get_model(self) -> Any:
        return _model_from_json(self.get_keras_model_config(), self.get_custom_objects())

    def _compiled_model(self) -> Any:
        import keras

        if not self.isDefined(self.keras_model_config):
            raise ConfigError("ElephasEstimator: set_keras_model_config(model.to_json()) is required")
        if not self.isDefined(self.loss):
            raise ConfigError("ElephasEstimator: set_loss(...) is required")
        model = self.get_model()
        optimizer = self.get_optimizer_config()
        model.compile(optimizer=keras.optimizers.get(optimizer) if optimizer is not None else "rmsprop",
                      loss=self.get_loss(), metrics=list(self.get_metrics() or []))
        return model

    def _fit(self, dataset: Any) -> "ElephasTransformer":
        from ..driver.spark_model import SparkModel

        # Elephas' estimator hands mode and frequency to a SparkModel: an unknown mode trains synchronously there
        settings, bad_frequency = elephas_settings({"mode": self.get_mode(), "frequency": self.get_frequency()},
                                                   "asynchronous", "synchronous", type(self).__name__)
        if bad_frequency is not None:
            raise ConfigError(bad_frequency)
        model = self._compiled_model()
        features, label = self.getFeaturesCol(), self.getLabelCol()
        data = _ml_vectors(dataset, features)
        if self.get_categorical_labels():
            data, label = _one_hot(data, label, self.get_nb_classes()), _ONE_HOT
        sm = SparkModel(model, mode=settings["mode"], frequency=settings["frequency"],
                        num_workers=self.get_num_workers() or None, custom_objects=self.get_custom_objects())
        history = sm.fit(data, epochs=self.get_epochs(), batch_size=self.get_batch_size(), verbose=self.get_verbosity(),
                         validation_split=self.get_validation_split(), feature_cols=features, label_col=label)
        per_epoch = [{k: [float(v[i])] for k, v in history.history.items()} for i in range(len(history.epoch))]
        return ElephasTransformer(labelCol=self.getLabelCol(), outputCol=self.getOutputCol(), featuresCol=features,
                                  keras_model_config=model.to_json(), weights=model.get_weights(),
                                  custom_objects=self.get_custom_objects(),
                                  model_type=LossModelTypeMapper().get_model_type(self.get_loss()), history=per_epoch)


def _deprecated(setter: str, param: str) -> None:
    warnings.warn(f"{setter} is deprecated in Spark 3.0.x+ - please supply {param} in the constructor i.e; "
                  f"ElephasEstimator({param}='foo')", DeprecationWarning, stacklevel=3)


class ElephasTransformer(Model, HasKerasModelConfig, HasLabelCol, HasOutputCol, HasFeaturesCol, HasCustomObjects,
                         HasInferenceBatchSize, MLWritable, MLReadable):
    """A trained model: ``transform`` adds ``outputCol`` (a double for regression, an array of class
    probabilities for classification), computed on the executors without collecting anything."""

    @keyword_only
    def __init__(self, **kwargs: Any):
        super().__init__()
        self._setDefault(outputCol="prediction")
        self.weights = kwargs.pop("weights", None)
        self.model_type = kwargs.pop("model_type", None)
        self._history = kwargs.pop("history", [])
        self._set(**kwargs)

    @property
    def history(self) -> list[dict[str, list[float]]]:
        return self._history

    @keyword_only
    def set_params(self, **kwargs: Any) -> "ElephasTransformer":
        return self._set(**kwargs)

    def get_config(self) -> dict[str, Any]:
        return {
            "keras_model_config": self.get_keras_model_config(), "labelCol": self.getLabelCol(),
            "featuresCol": self.getFeaturesCol(), "outputCol": self.getOutputCol(),
            "weights": [np.asarray(w).tolist() for w in (self.weights or [])], "model_type": self.model_type,
        }

    def save(self, file_name: str) -> None:  # Elephas' HDF5 file; write().save(path) is the Spark ML format
        _write_config(file_name, type(self).__name__, self.get_config())

    def get_model(self) -> Any:
        model = _model_from_json(self.get_keras_model_config(), self.get_custom_objects())
        if self.weights is not None:
            model.set_weights([np.asarray(w) for w in self.weights])
        return model

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql import functions as F

        from ..driver.spark_model import SparkModel

        model = self.get_model()
        model.compile(optimizer="sgd", loss="mse")  # SparkModel ships compiled models; predictions do not use it
        out, features = self.getOutputCol(), self.getFeaturesCol()
        sm = SparkModel(model, custom_objects=self.get_custom_objects())
        result = sm.predict(_ml_vectors(dataset, features), batch_size=self.get_inference_batch_size() or 256,
                            feature_cols=features, prediction_col=out)
        scalar = dict(result.dtypes)[out] == "double"
        if self.model_type == ModelType.REGRESSION:
            return result if scalar else result.withColumn(out, F.col(out)[0].cast("double"))
        # classification (or an unknown loss, as in Elephas): the class probabilities as array<double>
        column = F.array(F.col(out)) if scalar else F.col(out)
        return result.withColumn(out, column.cast("array<double>"))

    def write(self) -> MLWriter:
        return _TransformerWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _TransformerReader()


class _TransformerWriter(MLWriter):
    """Spark ML metadata for the params, the weights as ``weights.npz`` beside it (any Hadoop path)."""

    def __init__(self, instance: ElephasTransformer):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from ..fs import FileSystem, join

        inst = self.instance
        if inst.get_custom_objects():
            raise ConfigError("a transformer with custom_objects cannot be saved in Spark ML format (functions are not "
                              "data); register them with keras.saving.register_keras_serializable and leave "
                              "custom_objects empty")
        extra = {"model_type": inst.model_type.name if inst.model_type else None, "history": inst.history}
        DefaultParamsWriter.saveMetadata(inst, path, self.sc, extraMetadata=extra)
        buf = io.BytesIO()
        np.savez(buf, *[np.asarray(w) for w in (inst.weights or [])])
        FileSystem(self.sc).write_bytes(join(path, _WEIGHTS_FILE), buf.getvalue())


class _TransformerReader(MLReader):
    def load(self, path: str) -> ElephasTransformer:
        from ..fs import FileSystem, join

        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        inst = ElephasTransformer()
        inst._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(inst, metadata)
        with np.load(io.BytesIO(FileSystem(self.sc).read_bytes(join(path, _WEIGHTS_FILE)))) as npz:
            inst.weights = [npz[f"arr_{i}"] for i in range(len(npz.files))]
        model_type = metadata.get("model_type")
        inst.model_type = ModelType[model_type] if model_type else None
        inst._history = metadata.get("history") or []
        return inst


def load_ml_estimator(file_name: str) -> ElephasEstimator:
    """An estimator from the HDF5 file ``ElephasEstimator.save`` (or Elephas) wrote."""
    config = _read_config(file_name)
    return ElephasEstimator(**{k: v for k, v in config.items() if v is not None})  # None: left at its default


def load_ml_transformer(file_name: str) -> ElephasTransformer:
    """A transformer from the HDF5 file ``ElephasTransformer.save`` (or Elephas) wrote."""
    config = _read_config(file_name)
    config["weights"] = [np.asarray(w, dtype=np.float32) for w in config.get("weights") or []] or None
    return ElephasTransformer(**config)


def _write_config(file_name: str, class_name: str, config: dict[str, Any]) -> None:
    import h5py

    with h5py.File(file_name, mode="w") as f:
        f.attrs[_CONFIG_ATTR] = json.dumps({"class_name": class_name, "config": config}, cls=ModelTypeEncoder).encode("utf8")


def _read_config(file_name: str) -> dict[str, Any]:
    import h5py

    with h5py.File(file_name, mode="r") as f:
        raw = f.attrs.get(_CONFIG_ATTR)
    if raw is None:
        raise ConfigError(f"{file_name} holds no Elephas stage (no {_CONFIG_ATTR!r} attribute)")
    return dict(json.loads(raw, object_hook=as_enum).get("config") or {})


def _model_from_json(config: str, custom_objects: dict[str, Any] | None) -> Any:
    import keras

    return keras.models.model_from_json(config, custom_objects=custom_objects or None)


def _ml_vectors(df: Any, column: str) -> Any:
    """``df`` with an MLlib vector ``column`` turned into an ML vector (Elephas' ``to_data_frame`` made MLlib ones)."""
    if column not in df.columns:
        raise DataError(f"features column {column!r} is not in the DataFrame (columns: {df.columns})")
    if type(df.schema[column].dataType).__module__.startswith("pyspark.mllib"):
        from pyspark.mllib.util import MLUtils

        return MLUtils.convertVectorColumnsToML(df, column)
    return df


def _one_hot(df: Any, label: str, nb_classes: int) -> Any:
    """``df`` with the class-index column ``label`` one-hot encoded in a new float-array column (Spark SQL,
    no Python UDF); every label is checked to be a whole number in ``[0, nb_classes)``."""
    from pyspark.sql import functions as F

    if label not in df.columns:
        raise DataError(f"label column {label!r} is not in the DataFrame (columns: {df.columns})")
    col = F.col(label)
    bad = df.filter(col.isNull() | (col < 0) | (col >= nb_classes) | (col != F.floor(col))).select(label).limit(3).collect()
    if bad:
        raise DataError(f"label column {label!r} holds {[r[0] for r in bad]}: categorical labels must be class indices "
                        f"0..{nb_classes - 1} (set_nb_classes, or set_categorical_labels(False) for one-hot or numeric labels)")
    return df.withColumn(_ONE_HOT, F.array(*[(col == i).cast("float") for i in range(nb_classes)]))
