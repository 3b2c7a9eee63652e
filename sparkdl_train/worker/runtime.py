"""Per-process state on an executor's Python worker.

Spark reuses Python workers between tasks, so TensorFlow stays imported and a
rebuilt model can be kept: models are cached by architecture digest (a small LRU;
the weights travel apart), and TensorFlow's thread pools are sized once, before
its first op.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Any

from .. import backend
from ..errors import ConfigError
from ..model_io import ModelPayload, load_archive

log = logging.getLogger(__name__)

_MAX_CACHED_MODELS = 2
_models: "OrderedDict[str, Any]" = OrderedDict()
_threads: int | None = None
_BUILT_FOR = "_sparkdl_train_built_for"  # (labels signature, confirmed by data)
_import_seconds = 0.0  # TensorFlow's import in this process, not yet reported by a task


def prepare_process(threads: int | None, keras_backend: str | None = None) -> None:
    """Set the environment and thread pools for the Keras backend (first call in a process wins).

    ``keras_backend`` is the driver's model's backend: a process that has not imported Keras yet
    runs that one; one that has (a worker forked from a daemon that preloaded it) must run it, or
    the task fails with a ConfigError naming both and the fix."""
    global _threads
    os.environ.setdefault("KERAS_BACKEND", keras_backend or backend.DEFAULT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if keras_backend is not None:
        with backend.without_speculative_imports():  # a worker's first import of Keras: see Capabilities
            here = backend.keras_backend()
        if here != keras_backend:
            raise ConfigError(
                f"the driver's model runs on the Keras {keras_backend!r} backend, this executor's Python worker on "
                f"{here!r} (KERAS_BACKEND={os.environ.get('KERAS_BACKEND')!r}): set spark.executorEnv.KERAS_BACKEND="
                f"{keras_backend} (sparkdl_train sets it for its own stages when the session lets it) and ship an "
                f"environment with {keras_backend} installed (./run pack --backend {keras_backend})"
            )
    if threads is None or _threads is not None:
        return
    import_tensorflow()
    _threads = backend.current().configure_threads(threads)


def import_tensorflow() -> float:
    """Import the Keras backend's framework (the name stays from when it was always TensorFlow);
    returns the seconds it took (0.0 when this process already had it, as a worker forked from
    :mod:`sparkdl_train.worker.daemon` does)."""
    global _import_seconds
    with backend.without_speculative_imports():
        seconds = backend.current().import_framework()
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


def _cache_key(payload: ModelPayload, device: str | None) -> str:
    return f"{payload.digest}@{device}"  # variables live on the device they were built on


def is_cached(payload: ModelPayload, device: str | None = None, labels: str | None = None) -> bool:
    """Whether this worker holds the model for ``payload`` already (rebuilt and traced), one
    :func:`get_model` with ``labels`` keeps."""
    model = _models.get(_cache_key(payload, device))
    return model is not None and _keeps(model, labels)


def cache_miss(payload: ModelPayload, device: str | None = None, labels: str | None = None) -> str:
    """Why :func:`is_cached` is false for these arguments (``FitStats`` shows it per task)."""
    model = _models.get(_cache_key(payload, device))
    if model is None:
        return f"not cached (this worker holds {len(_models)} other model(s))"
    built, confirmed = model.__dict__.get(_BUILT_FOR, (None, True))
    return f"cached for labels {built} ({'seen in data' if confirmed else 'a guess'}), the task's are {labels}"


def get_model(payload: ModelPayload, device: str | None = None, labels: str | None = None, confirmed: bool = True) -> Any:
    """The model for ``payload`` with its variables on ``device`` (a TensorFlow device name,
    ``None``: TensorFlow's default), rebuilt once per Python worker process and device, and
    shared by every payload of the same architecture (:func:`sparkdl_train.model_io.architecture_digest`).

    ``labels`` is the signature (:func:`sparkdl_train.data.batching.row_signature`) of the labels
    the task trains or evaluates on, as the driver found them in the data; ``None``: no labels.
    A cached model whose compiled loss and metrics were built for other labels (:func:`_keeps`)
    is dropped and rebuilt. ``confirmed=False``: ``labels`` is a guess (a prepare task's, from
    column types); the model serves only tasks whose labels turn out to have it."""
    key = _cache_key(payload, device)
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
    model = _models.get(_cache_key(payload, device))
    return model if model is not None and _keeps(model, labels) else None


def mark_prepared(model: Any, labels: str) -> None:
    """Record that ``model``'s compiled loss and metrics were just built from ``labels``, a guess
    no data has confirmed yet (a prepare task's): :func:`get_model` keeps it only for tasks whose
    labels have that signature."""
    model.__dict__[_BUILT_FOR] = (labels, False)


def cached_model_count() -> int:
    return len(_models)
