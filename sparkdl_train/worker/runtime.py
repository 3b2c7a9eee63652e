"""Per-process state on an executor's Python worker.

Spark reuses Python workers between tasks, so TensorFlow stays imported and a
rebuilt model can be kept: models are cached by archive digest (a small LRU),
and TensorFlow's thread pools are sized once, before its first op.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import OrderedDict
from typing import Any

from ..model_io import ModelPayload, load_archive

log = logging.getLogger(__name__)

_MAX_CACHED_MODELS = 2
_models: "OrderedDict[str, Any]" = OrderedDict()
_threads: int | None = None
_PREPARED = "_sparkdl_train_prepared_for"
_import_seconds = 0.0  # TensorFlow's import in this process, not yet reported by a task


def prepare_process(threads: int | None) -> None:
    """Set environment and thread pools for TensorFlow (first call in a process wins)."""
    global _threads
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads is None or _threads is not None:
        return
    import_tensorflow()
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
        _threads = threads
    except RuntimeError:  # TF already initialised in this process: keep its pools
        _threads = tf.config.threading.get_intra_op_parallelism_threads() or threads
        log.debug("TensorFlow already initialised; keeping its thread pools")


def import_tensorflow() -> float:
    """Import TensorFlow; returns the seconds it took (0.0 when this process already had it, as a
    worker forked from :mod:`sparkdl_train.worker.daemon` does)."""
    global _import_seconds
    if "tensorflow" in sys.modules:
        return 0.0
    start = time.perf_counter()
    import tensorflow  # noqa: F401

    seconds = time.perf_counter() - start
    _import_seconds += seconds
    return seconds


def take_import_seconds() -> float:
    """The seconds this process spent importing TensorFlow that no task has reported yet (the
    first task in a fresh worker reports them; 0.0 afterwards)."""
    global _import_seconds
    seconds, _import_seconds = _import_seconds, 0.0
    return seconds


def is_cached(payload: ModelPayload, device: str | None = None, accept: str | None = None) -> bool:
    """Whether this worker holds the model for ``payload`` already (rebuilt and traced), one
    :func:`get_model` with ``accept`` keeps."""
    model = _models.get(f"{payload.digest}@{device}")
    return model is not None and model.__dict__.get(_PREPARED, accept) == accept


def get_model(payload: ModelPayload, device: str | None = None, accept: str | None = None) -> Any:
    """The model for ``payload`` with its variables on ``device`` (a TensorFlow device name,
    ``None``: TensorFlow's default), rebuilt once per Python worker process and device.

    A model a prepare task built for a guessed batch signature (:func:`mark_prepared`) is kept
    only when ``accept`` is that signature, the one the driver found in the data; otherwise it is
    dropped and rebuilt: its compiled metrics may have been resolved for other shapes."""
    key = f"{payload.digest}@{device}"  # variables live on the device they were built on
    model = _models.get(key)
    if model is not None:
        prepared = model.__dict__.pop(_PREPARED, None)
        if prepared is None or prepared == accept:
            _models.move_to_end(key)
            return model
        log.info("dropping the model prepared for %s: the data's batches are %s", prepared, accept)
        del _models[key]
    model = load_archive(payload)
    _models[key] = model
    while len(_models) > _MAX_CACHED_MODELS:
        _models.popitem(last=False)
    return model


def peek_model(payload: ModelPayload, device: str | None = None) -> Any:
    """The cached model for ``payload`` on ``device``, or ``None``; changes nothing."""
    return _models.get(f"{payload.digest}@{device}")


def mark_prepared(model: Any, signature: str) -> None:
    """Record that ``model``'s compiled metrics and loss were built from a batch signature that
    no data has confirmed yet (:func:`get_model` keeps it only for tasks that accept it)."""
    model.__dict__[_PREPARED] = signature  # past Keras' attribute tracking


def cached_model_count() -> int:
    return len(_models)
