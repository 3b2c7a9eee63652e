"""Elephas' ``elephas.spark_model`` on sparkdl_train's engines.

``SparkModel`` here is :class:`sparkdl_train.SparkModel` with Elephas' constructor, ``fit``,
``predict``, ``evaluate``, ``save`` and attributes; the engines, settings (``sm.config``), statistics
(``sm.stats``) and cancellation are sparkdl_train's. Where behaviour differs from Elephas 7.x it
says so below and in the README's "Migrating from Elephas".
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from ..driver.spark_model import SparkModel as _SparkModel
from ..errors import ConfigError, DataError
from ._shim import elephas_settings, fit_arguments, keras2_compile, plain, row_splitter, warn_once
from .enums import Frequency, Mode
from .mllib.adapter import from_matrix, from_vector, to_matrix, to_vector
from .utils.rdd_utils import lp_to_simple_rdd, to_simple_rdd

__all__ = ["AsynchronousSparkModel", "Frequency", "Mode", "SparkMLlibModel", "SparkModel", "load_spark_model"]

_CONFIG_ATTR = "distributed_config"  # where Elephas keeps the SparkModel's config in a saved .h5
_CONFIG_ENTRY = "elephas_distributed_config.json"  # the same, as an entry of a .keras archive


class SparkModel(_SparkModel):
    """``elephas.spark_model.SparkModel(model, num_workers=None, custom_objects=None, batch_size=32, **kwargs)``.

    Elephas 7's ``SparkModel`` trains synchronously, averaging the workers' weights after every epoch,
    and ignores ``mode``/``frequency``; here it trains the same way by default and honours ``mode`` and
    ``frequency`` when given (``mode='asynchronous'`` is what :class:`AsynchronousSparkModel` defaults
    to, as Elephas' did). ``parameter_server_mode`` and ``port`` are accepted with a warning; other
    keyword arguments are sparkdl_train settings (``staleness_bound``, ``ps_port``, ...) and a name that
    is none of these fails, where Elephas stored it and went on.
    """

    _default_mode = Mode.SYNCHRONOUS
    _unknown_mode = Mode.SYNCHRONOUS  # what Elephas' class trains with a mode it does not know

    def __init__(self, model: Any, num_workers: int | None = None, custom_objects: dict[str, Any] | None = None,
                 batch_size: int = 32, **kwargs: Any):
        quiet = kwargs.pop("_quiet", False)  # loading a saved model: its Elephas-only arguments were warned about then
        self._given = {k: plain(v) for k, v in kwargs.items()}  # Elephas keeps every keyword for get_config()
        settings, self._bad_frequency = elephas_settings(kwargs, plain(self._default_mode), plain(self._unknown_mode),
                                                         type(self).__name__, quiet)
        keras2_compile(model)
        super().__init__(model, num_workers=num_workers, custom_objects=custom_objects, **settings)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self._training_histories: list[dict[str, list[float]]] = []

    # -- Elephas attributes --------------------------------------------------------
    @property
    def master_network(self) -> Any:
        return self._model

    @master_network.setter
    def master_network(self, network: Any) -> None:
        keras2_compile(network)
        self._model = network
        self._shipped = None

    @property
    def weights(self) -> list[np.ndarray]:
        return self._model.get_weights()

    @property
    def mode(self) -> str:
        return self._overrides["mode"]

    @property
    def frequency(self) -> Any:
        return self._overrides["frequency"]

    @property
    def training_histories(self) -> list[dict[str, list[float]]]:
        """One Keras-style history dict (``{'loss': [v], ...}``) per epoch trained, merged over the workers
        (Elephas 7 kept one per worker per epoch, from each worker's own ``model.fit``)."""
        return self._training_histories

    def get_config(self) -> dict[str, Any]:
        """Elephas' ``{num_workers, batch_size, **kwargs}``: every keyword given, as given (also those that mean
        nothing here); :attr:`config` is what the fits run with."""
        return {"num_workers": self.num_workers, "batch_size": self.batch_size, **self._given}

    def start_server(self) -> None:
        """Kept for Elephas 2 scripts: servers start and stop with each ``fit``, so this does nothing."""
        warn_once("start_server", "start_server()/stop_server() do nothing: each fit starts and stops its own servers")

    stop_server = start_server

    # -- training and inference ----------------------------------------------------
    def fit(self, rdd: Any, **kwargs: Any) -> Any:
        """Train on an RDD of ``(x, y)`` (or a DataFrame); keywords are Keras ``fit``'s that apply
        (``epochs``, ``batch_size``, ``verbose``, ``validation_split``, ``callbacks``, ...). Returns the
        ``History`` (Elephas returned nothing)."""
        if self._bad_frequency is not None:
            raise ConfigError(self._bad_frequency)
        arguments = fit_arguments(kwargs)
        arguments.setdefault("batch_size", self.batch_size)
        arguments.setdefault("verbose", 0)
        history = super().fit(self._rows(rdd), **arguments)
        for i in range(len(history.epoch)):  # each fit has a History of its own
            self._training_histories.append({k: [float(v[i])] for k, v in history.history.items()})
        return history

    def predict(self, data: Any, batch_size: int | None = None, **kwargs: Any) -> Any:
        """Predictions computed on the executors, collected in order: a list of per-row arrays for a numpy
        array or an RDD, as Elephas returns (``np.asarray`` stacks it). A DataFrame gets sparkdl_train's
        prediction column instead (nothing collected)."""
        batch = batch_size or max(self.batch_size, 256)
        if _is_dataframe(data):
            return super().predict(data, batch_size=batch, **kwargs)
        if isinstance(data, (np.ndarray, list)):
            array = np.asarray(data)
            if len(array) == 0:
                raise DataError("predict: no rows")
            rdd = to_simple_rdd(_context(), array, np.zeros(len(array), np.int8)).map(lambda pair: pair[0])
            return super().predict(self._rows(rdd, labelled=False), batch_size=batch, **kwargs).collect()
        return super().predict(self._rows(data, labelled=False), batch_size=batch, **kwargs).collect()

    def evaluate(self, x_test: Any, y_test: Any = None, batch_size: int | None = None, verbose: int = 0, **kwargs: Any) -> Any:
        """Elephas' ``evaluate(x_test, y_test)`` on arrays, run on the executors: ``[loss, *metrics]``, or
        the loss alone for a model without metrics. An RDD or DataFrame may be passed alone."""
        del verbose  # Elephas forwarded it to each worker's Keras evaluate; the result here is one merged value
        unknown = sorted(set(kwargs) - {"return_dict", "feature_cols", "label_col", "sample_weight_col"})
        if unknown:
            raise ConfigError(f"evaluate: argument(s) {unknown} do not apply; it takes x_test, y_test, batch_size, "
                              "verbose and return_dict")
        if y_test is None:
            data = x_test if _is_dataframe(x_test) else self._rows(x_test)
        else:
            data = self._rows(to_simple_rdd(_context(), np.asarray(x_test), np.asarray(y_test)))
        return super().evaluate(data, batch_size=batch_size or self.batch_size, **kwargs)

    def _rows(self, data: Any, labelled: bool = True) -> Any:
        """Elephas' flat rows for multi-input models cut into the tuple of inputs sparkdl_train reads."""
        split = row_splitter(self._model)
        if split is None or _is_dataframe(data) or not hasattr(data, "mapPartitions"):
            return data
        if labelled:
            return data.map(lambda row: (split(row[0]), *row[1:]))
        return data.map(split)

    # -- saving --------------------------------------------------------------------
    def save(self, file_name: str, overwrite: bool = False, to_hadoop: bool = False) -> str:
        """Write the model to ``file_name`` (``.h5`` or ``.keras``: a file ``keras.models.load_model``
        opens) with this SparkModel's config inside, as Elephas does; ``to_hadoop``: ``file_name`` is a
        Hadoop path (written through Spark's filesystem API, not the ``hadoop`` command)."""
        from ..fs import FileSystem

        suffix = _model_suffix(file_name)
        fs = FileSystem(_context()) if to_hadoop else None
        exists = fs.exists(file_name) if fs is not None else os.path.exists(file_name)
        if exists and not overwrite:
            raise FileExistsError(f"{file_name} exists (pass overwrite=True)")
        config = {"class_name": type(self).__name__, "config": self.get_config()}
        with tempfile.TemporaryDirectory(prefix="sparkdl_train-elephas-") as tmp:
            local = os.path.join(tmp, "model" + suffix) if fs is not None else file_name
            if fs is None and exists:
                os.remove(file_name)
            _write_model_file(self._model, local, config)
            if fs is not None:
                with open(local, "rb") as f:
                    fs.write_bytes(file_name, f.read())
                return fs.qualified(file_name)
        return os.path.abspath(file_name)


class AsynchronousSparkModel(SparkModel):
    """``elephas.spark_model.AsynchronousSparkModel``: ``mode='asynchronous'`` and ``frequency='epoch'`` by
    default; ``hogwild`` and ``frequency='batch'`` (or every N batches) as sparkdl_train runs them."""

    _default_mode = Mode.ASYNCHRONOUS
    _unknown_mode = Mode.HOGWILD  # Elephas' servers lock only for 'asynchronous'

    def __init__(self, model: Any, num_workers: int | None = None, custom_objects: dict[str, Any] | None = None,
                 batch_size: int = 32, mode: Any = Mode.ASYNCHRONOUS, frequency: Any = Frequency.EPOCH,
                 parameter_server_mode: str = "http", port: int = 4000, **kwargs: Any):
        explicit = {"parameter_server_mode": parameter_server_mode, "mode": plain(mode), "frequency": plain(frequency)}
        if parameter_server_mode != "http":  # Elephas' defaults are not worth a warning
            kwargs["parameter_server_mode"] = parameter_server_mode
        if port != 4000:
            kwargs["port"] = port
        super().__init__(model, num_workers, custom_objects, batch_size, mode=mode, frequency=frequency, **kwargs)
        self._given = {k: v for k, v in self._given.items() if k not in ("port", *explicit)}
        self._explicit = explicit

    def get_config(self) -> dict[str, Any]:
        """Elephas' ``SparkModel.get_config()`` plus ``parameter_server_mode``, ``mode`` and ``frequency``."""
        return {**super().get_config(), **self._explicit}


class SparkMLlibModel(SparkModel):
    """``elephas.spark_model.SparkMLlibModel``: trains on an RDD of MLlib ``LabeledPoint`` s and predicts
    MLlib vectors and matrices."""

    def fit(self, labeled_points: Any, epochs: int = 10, batch_size: int = 32, verbose: int = 0,
            validation_split: float = 0.1, categorical: bool = False, nb_classes: int | None = None, **kwargs: Any) -> Any:
        rdd = lp_to_simple_rdd(labeled_points, categorical, nb_classes)
        return super().fit(rdd, epochs=epochs, batch_size=batch_size, verbose=verbose,
                           validation_split=validation_split, **kwargs)

    def predict(self, mllib_data: Any, batch_size: int | None = None, **kwargs: Any) -> Any:
        """An MLlib ``Matrix`` (one row per sample) gives a ``Matrix`` of predictions; a ``Vector`` (one
        sample) its prediction ``Vector``; an RDD (or array) what :meth:`SparkModel.predict` gives."""
        from pyspark.mllib.linalg import Matrix, Vector

        if isinstance(mllib_data, Matrix):
            return to_matrix(super().predict(from_matrix(mllib_data), batch_size, **kwargs))
        if isinstance(mllib_data, Vector):
            return to_vector(super().predict(from_vector(mllib_data)[None, :], batch_size, **kwargs)[0].reshape(-1))
        return super().predict(mllib_data, batch_size, **kwargs)


_CLASSES = {cls.__name__: cls for cls in (SparkModel, AsynchronousSparkModel, SparkMLlibModel)}


def load_spark_model(file_name: str, from_hadoop: bool = False, custom_objects: dict[str, Any] | None = None) -> SparkModel:
    """Load what ``SparkModel.save`` wrote, or a file saved by Elephas itself (``.h5`` or ``.keras``),
    as the class that saved it; ``from_hadoop``: ``file_name`` is a Hadoop path."""
    import keras

    suffix = _model_suffix(file_name)
    with tempfile.TemporaryDirectory(prefix="sparkdl_train-elephas-") as tmp:
        local = file_name
        if from_hadoop:
            from ..fs import FileSystem

            local = os.path.join(tmp, "model" + suffix)
            with open(local, "wb") as f:
                f.write(FileSystem(_context()).read_bytes(file_name))
        saved = _read_config(local)
        model = keras.models.load_model(local, custom_objects=custom_objects)
    cls = _CLASSES.get(saved.get("class_name"), SparkModel)
    config = dict(saved.get("config") or {})  # every keyword the saving model was given, as Elephas stores them
    if getattr(model, "optimizer", None) is None:
        raise ConfigError(f"{file_name} holds a model saved without its compile settings; it cannot be trained")
    return cls(model, custom_objects=custom_objects, _quiet=True, **config)


def _model_suffix(file_name: str) -> str:
    for suffix in (".h5", ".keras"):
        if str(file_name).endswith(suffix):
            return suffix
    raise ConfigError(f"{file_name!r}: the file name must end with '.h5' or '.keras' (Elephas' model files)")


def _write_model_file(model: Any, path: str, config: dict[str, Any]) -> None:
    text = json.dumps(config, default=plain)
    if path.endswith(".h5"):
        import h5py

        from .._compat import save_legacy_h5

        save_legacy_h5(model, path)  # Keras' legacy HDF5 format, as Elephas writes
        with h5py.File(path, mode="a") as f:
            f.attrs[_CONFIG_ATTR] = text.encode("utf8")
    else:
        model.save(path)
        with zipfile.ZipFile(path, mode="a") as zf:  # Keras ignores entries it does not know
            zf.writestr(_CONFIG_ENTRY, text)


def _read_config(path: str) -> dict[str, Any]:
    if path.endswith(".h5"):
        import h5py

        with h5py.File(path, mode="r") as f:
            raw = f.attrs.get(_CONFIG_ATTR)
    else:
        with zipfile.ZipFile(path) as zf:
            raw = zf.read(_CONFIG_ENTRY) if _CONFIG_ENTRY in zf.namelist() else None
    if raw is None:
        return {}
    return json.loads(raw.decode("utf8") if isinstance(raw, bytes) else raw)


def _is_dataframe(data: Any) -> bool:
    from ..data.adapters import is_dataframe

    return is_dataframe(data)


def _context() -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate().sparkContext
