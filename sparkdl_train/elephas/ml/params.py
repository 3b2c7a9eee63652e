"""Elephas' Spark ML param mixins (``elephas.ml.params``): each adds one param with Elephas' name,
default and ``set_*``/``get_*`` pair. Any value is accepted when set, as in Elephas (``mode`` and
``frequency`` are checked when the estimator fits: sparkdl_train.elephas._shim.elephas_settings)."""

from __future__ import annotations

from typing import Any, Callable

from pyspark.ml.param import Param, Params

from .._shim import plain

_UNSET = object()


def _mixin(class_name: str, name: str, doc: str, setter: str, getter: str, default: Any = _UNSET,
           check: Callable[[Any], Any] | None = None) -> type:
    def __init__(self: Params) -> None:
        super(cls, self).__init__()
        if default is not _UNSET:
            self._setDefault(**{name: default})

    def set_value(self: Params, value: Any) -> Params:
        return self._set(**{name: check(value) if check else value})

    def get_value(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    set_value.__name__, get_value.__name__ = setter, getter
    set_value.__doc__ = get_value.__doc__ = doc
    cls = type(class_name, (Params,), {
        "__init__": __init__, name: Param(Params._dummy(), name, doc), setter: set_value, getter: get_value,
        "__doc__": f"Elephas' param mixin for ``{name}``: {doc}.", "__module__": __name__,
    })
    return cls


def _plain(value: Any) -> Any:
    return plain(value)


HasKerasModelConfig = _mixin("HasKerasModelConfig", "keras_model_config", "the Keras model as JSON (model.to_json())",
                             "set_keras_model_config", "get_keras_model_config")
HasKerasOptimizerConfig = _mixin("HasKerasOptimizerConfig", "optimizer_config",
                                 "the optimizer as keras.optimizers.serialize gives it (None: Keras' default, rmsprop)",
                                 "set_optimizer_config", "get_optimizer_config", None)
HasMode = _mixin("HasMode", "mode", "training mode: synchronous, asynchronous or hogwild", "set_mode", "get_mode",
                 "asynchronous", _plain)
HasFrequency = _mixin("HasFrequency", "frequency", "weight exchange: epoch, batch or every N batches",
                      "set_frequency", "get_frequency", "epoch", _plain)
HasNumberOfClasses = _mixin("HasNumberOfClasses", "nb_classes", "number of classes (for categorical labels)",
                            "set_nb_classes", "get_nb_classes", 10)
HasCategoricalLabels = _mixin("HasCategoricalLabels", "categorical",
                              "labels are class indices to one-hot encode for the model",
                              "set_categorical_labels", "get_categorical_labels", True)
HasEpochs = _mixin("HasEpochs", "epochs", "number of epochs", "set_epochs", "get_epochs", 10)
HasBatchSize = _mixin("HasBatchSize", "batch_size", "rows per step on each worker", "set_batch_size", "get_batch_size", 32)
HasVerbosity = _mixin("HasVerbosity", "verbose", "0 silent, 1 progress bar, 2 a line per epoch",
                      "set_verbosity", "get_verbosity", 0)
HasValidationSplit = _mixin("HasValidationSplit", "validation_split", "seeded random fraction held out for val_* metrics",
                            "set_validation_split", "get_validation_split", 0.1)
HasNumberOfWorkers = _mixin("HasNumberOfWorkers", "num_workers", "number of workers (partitions trained in parallel)",
                            "set_num_workers", "get_num_workers", 8)
HasMetrics = _mixin("HasMetrics", "metrics", "Keras metrics", "set_metrics", "get_metrics", ["acc"])
HasLoss = _mixin("HasLoss", "loss", "Keras loss", "set_loss", "get_loss")
HasCustomObjects = _mixin("HasCustomObjects", "custom_objects", "custom layers, activations, losses by name",
                          "set_custom_objects", "get_custom_objects", {})
HasInferenceBatchSize = _mixin("HasInferenceBatchSize", "inference_batch_size", "rows per predict batch (None: 256)",
                               "set_inference_batch_size", "get_inference_batch_size", None)

__all__ = [
    "HasBatchSize", "HasCategoricalLabels", "HasCustomObjects", "HasEpochs", "HasFrequency", "HasInferenceBatchSize",
    "HasKerasModelConfig", "HasKerasOptimizerConfig", "HasLoss", "HasMetrics", "HasMode", "HasNumberOfClasses",
    "HasNumberOfWorkers", "HasValidationSplit", "HasVerbosity",
]
