"""The files of ``SparkModel.save(path)`` / ``load_spark_model(path)``: the model and its training config.

A saved SparkModel is a directory (on any filesystem Spark's Hadoop API reaches,
see :mod:`sparkdl_train.fs`) holding

* ``model.keras``: the Keras archive (architecture, weights, optimizer state,
  compile config), loadable on its own with ``keras.saving.load_model``;
* ``sparkdl_train.json``: the SparkModel's engine settings (only those given
  explicitly: the rest still come from the cluster's ``spark.sparkdl_train.*``
  keys where it is loaded), its column mapping, the names of the custom
  objects it needs and the statistics of its last ``fit``.

Custom objects are not stored (no pickle): pass them again to
:func:`load_spark_model`, or register them with
``keras.saving.register_keras_serializable``.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ModelError
from .fs import FileSystem, join
from .model_io import ensure_optimizer_built, load_model_bytes, save_archive

FORMAT = "sparkdl_train.SparkModel"
FORMAT_VERSION = 1
MODEL_FILE = "model.keras"
META_FILE = "sparkdl_train.json"


def write_saved(path: str, model: Any, settings: dict[str, Any], overwrite: bool = True, sc: Any = None) -> str:
    """Write ``model.keras`` and ``sparkdl_train.json`` (the format header plus ``settings``: the
    SparkModel's explicit config, columns, custom object names, last fit) under ``path``; returns
    the fully qualified path."""
    import keras

    from . import __version__

    fs = FileSystem(sc)
    meta_path = join(path, META_FILE)
    if not overwrite and fs.exists(meta_path):
        raise FileExistsError(f"{fs.qualified(path)} already holds a saved SparkModel (pass overwrite=True)")
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "sparkdl_train_version": __version__,
        "keras_version": keras.__version__,
        **settings,
    }
    ensure_optimizer_built(model)  # so its (empty) slots are saved and reload without a warning
    fs.write_bytes(join(path, MODEL_FILE), save_archive(model))
    fs.write_bytes(meta_path, json.dumps(meta, indent=2, default=str).encode())
    return fs.qualified(path)


def read_saved(path: str, custom_objects: dict[str, Any] | None = None, sc: Any = None) -> tuple[Any, dict[str, Any]]:
    """The Keras model and the settings saved by :func:`write_saved` under ``path``."""
    fs = FileSystem(sc)
    try:
        meta = json.loads(fs.read_bytes(join(path, META_FILE)))
    except FileNotFoundError:
        raise FileNotFoundError(f"{fs.qualified(path)} holds no saved SparkModel ({META_FILE} is missing)") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ModelError(f"{fs.qualified(path)}: not a SparkModel saved by this version (format {meta.get('format')!r} "
                         f"version {meta.get('format_version')!r})")
    objs = dict(custom_objects or {})
    missing = [name for name in meta.get("custom_objects", []) if name not in objs]
    try:
        model = load_model_bytes(fs.read_bytes(join(path, MODEL_FILE)), objs, meta["config"].get("safe_mode", True))
    except Exception as exc:  # noqa: BLE001
        hint = f"; it was saved with custom objects {missing}: pass them as custom_objects=" if missing else ""
        raise ModelError(f"cannot load the Keras model of {fs.qualified(path)}: {type(exc).__name__}: {exc}{hint}") from exc
    return model, meta
