"""Per-process state on an executor's Python worker.

Spark reuses Python workers between tasks, so TensorFlow stays imported and a
rebuilt model can be kept: models are cached by architecture digest (a small LRU;
the weights travel apart), and TensorFlow's thread pools are sized once, before
its first op.
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
_BUILT_FOR = "_sparkdl_train_built_for"  # (labels signature, confirmed by data)
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


def _keeps(model: Any, labels: str | None) -> bool:
    """Whether a cached ``model`` may serve a task whose labels have signature ``labels``.

    Keras builds a model's compiled loss and metrics from the first labels it sees (it resolves
    ``"accuracy"`` from their shape), so a cached model is marked with the labels it was built
    for: one a prepare task built from a guess (``confirmed=False``) serves only the labels the
    driver then found; one built from data serves tasks with the same labels or with none
    (``predict``)."""
    mark = model.__dict__.get(_BUILT_FOR)
    if mark is None:
        return True
    built, confirmed = mark
    return built == labels or (confirmed and labels is None)


def is_cached(payload: ModelPayload, device: str | None = None, labels: str | None = None) -> bool:
    """Whether this worker holds the model for ``payload`` already (rebuilt and traced), one
    :func:`get_model` with ``labels`` keeps."""
    model = _models.get(f"{payload.digest}@{device}")
    return model is not None and _keeps(model, labels)


def get_model(payload: ModelPayload, device: str | None = None, labels: str | None = None, confirmed: bool = True) -> Any:
    """The model for ``payload`` with its variables on ``device`` (a TensorFlow device name,
    ``None``: TensorFlow's default), rebuilt once per Python worker process and device, and
    shared by every payload of the same architecture (:func:`sparkdl_train.model_io.architecture_digest`).

    ``labels`` is the signature (:func:`sparkdl_train.data.batching.row_signature`) of the labels
    the task trains or evaluates on, as the driver found them in the data; ``None``: no labels.
    A cached model whose compiled loss and metrics were built for other labels (:func:`_keeps`)
    is dropped and rebuilt. ``confirmed=False``: ``labels`` is a guess (a prepare task's, from
    column types); the model serves only tasks whose labels turn out to have it."""
    key = f"{payload.digest}@{device}"  # variables live on the device they were built on
    model = _models.get(key)
    if model is not None and not _keeps(model, labels):
        log.info("dropping the cached model built for labels %s: this task's are %s", model.__dict__[_BUILT_FOR][0], labels)
        del _models[key]
        model = None
    if model is None:
        model = load_archive(payload)
        _models[key] = model
        while len(_models) > _MAX_CACHED_MODELS:
            _models.popitem(last=False)
    else:
        _models.move_to_end(key)
    if labels is not None and model.__dict__.get(_BUILT_FOR) != (labels, True):
        model.__dict__[_BUILT_FOR] = (labels, confirmed)  # past Keras' attribute tracking
    return model


def peek_model(payload: ModelPayload, device: str | None = None, labels: str | None = None) -> Any:
    """The cached model for ``payload`` on ``device`` that a task with ``labels`` would get, or
    ``None``; changes nothing."""
    model = _models.get(f"{payload.digest}@{device}")
    return model if model is not None and _keeps(model, labels) else None


def mark_prepared(model: Any, labels: str) -> None:
    """Record that ``model``'s compiled loss and metrics were just built from ``labels``, a guess
    no data has confirmed yet (a prepare task's): :func:`get_model` keeps it only for tasks whose
    labels have that signature."""
    model.__dict__[_BUILT_FOR] = (labels, False)


def cached_model_count() -> int:
    return len(_models)
