"""Shipping a compiled Keras model from the driver to executors, and its state.

The model travels as the bytes of a native ``.keras`` archive (architecture,
weights, optimizer config and slots, loss and metrics) plus the custom objects
it needs. Custom classes registered with ``keras.saving.register_keras_serializable``
are picked up automatically when the archive names them; anything else goes in
``custom_objects``. :func:`serialize_model` rebuilds the model on the driver once,
so a model that cannot be rebuilt fails there, before any Spark job.

*State* is the flat list ``model.weights + optimizer.variables``; *metric state*
is ``model.metrics_variables``. Both are exchanged as plain numpy arrays.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelPayload:
    """Everything an executor needs to rebuild the model. Plain data only.

    Custom objects travel as cloudpickle bytes (like Spark closures: classes
    defined in ``__main__`` or a notebook go by value), because broadcasts use
    plain pickle, which would only record an import path the executor may lack.
    """

    archive: bytes
    custom_objects_blob: bytes = b""
    safe_mode: bool = True
    digest: str = ""  # architecture + compile config, not weights: executors cache by it

    @classmethod
    def create(cls, archive: bytes, custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> "ModelPayload":
        objs = dict(custom_objects or {})
        return cls(
            archive=archive,
            custom_objects_blob=_cloudpickle().dumps(objs) if objs else b"",
            safe_mode=safe_mode,
            digest=architecture_digest(archive, objs),
        )

    def custom_objects(self) -> dict[str, Any]:
        return _cloudpickle().loads(self.custom_objects_blob) if self.custom_objects_blob else {}


def _cloudpickle():
    try:
        from pyspark import cloudpickle
    except ImportError:  # pragma: no cover - pyspark is a dependency
        import cloudpickle
    return cloudpickle


def architecture_digest(archive: bytes, custom_objects: dict[str, Any]) -> str:
    """Hash of the archive's config (layers, compile config), ignoring weight values.

    Executors keep rebuilt models keyed by it, so a second ``fit``/``predict`` of
    the same model reuses the rebuilt model and only loads new state.
    """
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        config = zf.read("config.json")
    h = hashlib.sha256(config)
    for name in sorted(custom_objects):
        h.update(name.encode())
    return h.hexdigest()[:16]


def _keras():
    import keras

    return keras


def check_compiled(model: Any) -> None:
    keras = _keras()
    if not isinstance(model, keras.Model):
        raise ModelError(f"expected a keras.Model, got {type(model).__name__}")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ModelError(
            f"model {model.name!r} is not compiled: call model.compile(optimizer=..., loss=..., metrics=...) "
            "before handing it to SparkModel"
        )
    weights = (model.get_compile_config() or {}).get("loss_weights") if hasattr(model, "get_compile_config") else None
    if isinstance(weights, (list, tuple)) and any(isinstance(w, str) for w in weights):
        raise ModelError(
            f"model {model.name!r} was compiled with loss_weights={list(weights)!r}: names of metrics? Keras 3's third "
            "positional compile argument is loss_weights (Keras 2's was metrics); compile with metrics=[...]"
        )
    if not model.built:
        raise ModelError(
            f"model {model.name!r} is not built: give it an Input layer, or call model.build(input_shape) "
            "(or run it once on data) before handing it to SparkModel"
        )


def ensure_optimizer_built(model: Any) -> None:
    opt = model.optimizer
    if not opt.built:
        opt.build(model.trainable_variables)


def _referenced_custom_objects(archive: bytes) -> dict[str, Any]:
    """Registered custom objects whose registered name appears in the archive's config."""
    keras = _keras()
    registry = keras.saving.get_custom_objects()
    if not registry:
        return {}
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        config = zf.read("config.json").decode()
    return {name: obj for name, obj in registry.items() if json.dumps(name) in config}


def save_archive(model: Any) -> bytes:
    keras = _keras()
    with tempfile.TemporaryDirectory(prefix="sparkdl_train_") as tmp:
        path = os.path.join(tmp, "model.keras")
        keras.saving.save_model(model, path)
        with open(path, "rb") as f:
            return f.read()


def load_model_bytes(archive: bytes, custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> Any:
    """A compiled model from the bytes of a ``.keras`` archive."""
    keras = _keras()
    with tempfile.TemporaryDirectory(prefix="sparkdl_train_") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(archive)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=True, safe_mode=safe_mode)


def load_archive(payload: ModelPayload) -> Any:
    model = load_model_bytes(payload.archive, payload.custom_objects(), payload.safe_mode)
    if model.optimizer is None:
        raise ModelError("the rebuilt model has no optimizer (was it compiled before saving?)")
    ensure_optimizer_built(model)
    return model


def serialize_model(model: Any, custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> ModelPayload:
    """Serialize on the driver and prove it can be rebuilt, or raise :class:`ModelError`."""
    check_compiled(model)
    ensure_optimizer_built(model)
    try:
        archive = save_archive(model)
    except Exception as exc:  # noqa: BLE001 - report any save failure uniformly
        raise ModelError(f"model {model.name!r} cannot be serialized: {type(exc).__name__}: {exc}") from exc
    objs = {**_referenced_custom_objects(archive), **(custom_objects or {})}
    payload = ModelPayload.create(archive, objs, safe_mode)
    try:
        clone = load_archive(payload)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(
            f"model {model.name!r} was saved but cannot be rebuilt from its config, so executors could not "
            f"load it: {type(exc).__name__}: {exc}\nPass the custom layers/losses/metrics it uses as "
            "SparkModel(..., custom_objects={'Name': Class}) or register them with "
            "@keras.saving.register_keras_serializable(); for Lambda layers pass safe_mode=False."
        ) from exc
    _check_same_layout(model, clone)
    log.debug("serialized model %s: %d bytes, custom objects %s", model.name, len(archive), sorted(objs))
    return payload


def _check_same_layout(model: Any, clone: Any) -> None:
    a = [tuple(v.shape) for v in state_variables(model)]
    b = [tuple(v.shape) for v in state_variables(clone)]
    if a != b:
        raise ModelError(
            f"model {model.name!r} rebuilt from its config has a different set of variables "
            f"({len(b)} vs {len(a)}); does a custom layer's get_config()/build() lose information?"
        )
    for i, (va, vb) in enumerate(zip(model.weights, clone.weights)):
        if not np.array_equal(np.asarray(va), np.asarray(vb)):
            raise ModelError(f"weight {va.path!r} differs after a save/load round trip")


# -- state ---------------------------------------------------------------------

def state_variables(model: Any) -> list:
    return [*model.weights, *model.optimizer.variables]


def get_state(model: Any) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in state_variables(model)]


def set_state(model: Any, arrays: list[np.ndarray]) -> None:
    variables = state_variables(model)
    if len(variables) != len(arrays):
        raise ModelError(f"state has {len(arrays)} arrays but the model has {len(variables)} variables")
    for v, a in zip(variables, arrays):
        if tuple(v.shape) != tuple(a.shape):
            raise ModelError(f"state array for {v.path!r} has shape {a.shape}, expected {tuple(v.shape)}")
        v.assign(a)


def set_optimizer_state(model: Any, arrays: list[np.ndarray]) -> None:
    variables = model.optimizer.variables
    if len(variables) != len(arrays):
        raise ModelError(f"optimizer state has {len(arrays)} arrays but the optimizer has {len(variables)} variables")
    for v, a in zip(variables, arrays):
        v.assign(a)


def get_metric_state(model: Any) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in model.metrics_variables]


def set_metric_state(model: Any, arrays: list[np.ndarray]) -> None:
    variables = model.metrics_variables
    if len(variables) != len(arrays):
        raise ModelError(
            f"workers reported {len(arrays)} metric variables but the driver's model has {len(variables)}; "
            "were the metrics changed after the model was handed to SparkModel?"
        )
    for v, a in zip(variables, arrays):
        if tuple(v.shape) != tuple(a.shape):
            raise ModelError(f"metric variable {v.path!r}: shape {a.shape} != {tuple(v.shape)}")
        v.assign(a.astype(v.dtype) if hasattr(a, "astype") else a)


def metrics_result(model: Any) -> dict[str, float]:
    """``model.get_metrics_result()`` as plain floats (the same logs Keras' fit reports),
    ordered like ``model.metrics_names`` (loss first), as ``model.evaluate`` lists them."""
    raw = model.get_metrics_result()
    order = [k for k in getattr(model, "metrics_names", []) if k in raw]
    order += [k for k in raw if k not in order]
    out = {}
    for k in order:
        arr = np.asarray(raw[k])
        out[k] = float(arr) if arr.ndim == 0 else arr.tolist()
    return out


def input_infos(model: Any):
    """The model's inputs (name, per-sample shape, dtype) or None when unknown (subclassed)."""
    from .data.spec import InputInfo

    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    if not inputs:
        return None
    infos = []
    for t in inputs:
        shape = tuple(t.shape)[1:]
        name = getattr(t, "name", None) or f"input_{len(infos)}"
        infos.append(InputInfo(name=name, shape=shape, dtype=str(t.dtype)))
    return infos
