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

from . import backend
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
        blob = _cloudpickle().dumps(objs) if objs else b""
        return cls(archive=archive, custom_objects_blob=blob, safe_mode=safe_mode, digest=architecture_digest(archive, blob))

    def custom_objects(self) -> dict[str, Any]:
        return _cloudpickle().loads(self.custom_objects_blob) if self.custom_objects_blob else {}


def _cloudpickle():
    try:
        from pyspark import cloudpickle
    except ImportError:  # pragma: no cover - pyspark is a dependency
        import cloudpickle
    return cloudpickle


def architecture_digest(archive: bytes, custom_objects_blob: bytes = b"") -> str:
    """Hash of what a rebuilt model's behaviour depends on: the archive's config (layers, compile
    config) in :func:`canonical_config`'s form, which ignores weight values and the names Keras
    generates, and the custom objects' pickled code.

    Executors keep rebuilt models (and their traced steps) keyed by it, so a second
    ``fit``/``predict`` of the same model, and a fit of the same architecture built again (a
    notebook cell run twice), reuse the rebuilt model and only load new state. A custom class
    redefined with other code pickles differently, so its models are rebuilt."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        config = json.loads(zf.read("config.json"))
    h = hashlib.sha256(json.dumps(canonical_config(config), sort_keys=True).encode())
    h.update(hashlib.sha256(custom_objects_blob).digest())
    return h.hexdigest()[:16]


def canonical_config(config: Any) -> Any:
    """A model archive's config with what differs between two builds of the same architecture
    made equal: a functional or Sequential model's layer names (``dense_3`` in one build,
    ``dense_7`` in the next), where it defines and where it references them, become their
    positions; the model's own name and the optimizer's go; ``shared_object_id`` values (Python
    object ids) become the order of first appearance. Kept as they are: a functional model's input
    layers' names (the keys of dict inputs; a Sequential model's input is positional), output layers' names when there are several (Keras maps dict labels and
    names metrics by them), and every other value, so two configs that are equal here build models
    that compute the same function from the same state (layers are positional in that state)."""
    config = json.loads(json.dumps(config))  # a copy to rewrite
    ids: dict[Any, int] = {}

    def shared(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "shared_object_id":
                    node[k] = ids.setdefault(v, len(ids))
                else:
                    shared(v)
        elif isinstance(node, list):
            for v in node:
                shared(v)

    shared(config)
    _canonical_layers(config)
    inner = config.get("config") if isinstance(config, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("layers"), list):
        inner.pop("name", None)  # a functional or Sequential model's own name (``sequential_3``)
    optimizer = (config.get("compile_config") or {}).get("optimizer") if isinstance(config, dict) else None
    if isinstance(optimizer, dict) and isinstance(optimizer.get("config"), dict):
        optimizer["config"].pop("name", None)
    return config


def _canonical_layers(node: Any) -> None:
    """Rename the layers of every functional or Sequential model config under ``node`` (nested
    ones too)."""
    if isinstance(node, list):
        for v in node:
            _canonical_layers(v)
        return
    if not isinstance(node, dict):
        return
    for v in node.values():
        _canonical_layers(v)  # nested models first: their own names are theirs
    inner = node.get("config")
    if not (isinstance(inner, dict) and isinstance(inner.get("layers"), list)):
        return
    functional = "output_layers" in inner
    if not functional and node.get("class_name") != "Sequential":
        return  # a layer or a subclassed model: its config holds its own arguments only
    layers = [layer for layer in inner["layers"] if isinstance(layer, dict)]
    keep = set(_layer_refs(inner.get("input_layers")))
    outputs = _layer_refs(inner.get("output_layers"))
    if len(outputs) > 1 or isinstance(inner.get("output_layers"), dict):
        keep.update(outputs)
    names = [layer.get("name", (layer.get("config") or {}).get("name")) for layer in layers]  # a Sequential's: in their config
    # a functional model's input names are the keys of its dict inputs, so they stay; a Sequential
    # model takes one positional input, and its InputLayer's generated name (``input_layer_3``)
    # would make every build of the same architecture another one to its executors' model caches
    rename = {name: f"#{i}" for i, (name, layer) in enumerate(zip(names, layers))
              if isinstance(name, str) and name not in keep and (not functional or layer.get("class_name") != "InputLayer")}
    if not rename:
        return

    def ref(entry: Any) -> Any:  # [layer name, node index, tensor index]
        if isinstance(entry, list) and entry and isinstance(entry[0], str):
            return [rename.get(entry[0], entry[0]), *entry[1:]]
        if isinstance(entry, list):
            return [ref(e) for e in entry]
        if isinstance(entry, dict):
            return {k: ref(v) for k, v in entry.items()}
        return entry

    def history(n: Any) -> None:
        if isinstance(n, dict):
            for k, v in n.items():
                if k == "keras_history" and isinstance(v, list) and v and isinstance(v[0], str):
                    n[k] = [rename.get(v[0], v[0]), *v[1:]]
                else:
                    history(v)
        elif isinstance(n, list):
            for v in n:
                history(v)

    for name, layer in zip(names, layers):
        if name in rename:
            if "name" in layer:
                layer["name"] = rename[name]
            if isinstance(layer.get("config"), dict) and layer["config"].get("name") == name:
                layer["config"]["name"] = rename[name]
        history(layer.get("inbound_nodes"))
    for key in ("input_layers", "output_layers"):
        if key in inner:
            inner[key] = ref(inner[key])


def _layer_refs(entry: Any) -> list[str]:
    """The layer names in a functional config's ``input_layers`` / ``output_layers``."""
    if isinstance(entry, list) and entry and isinstance(entry[0], str):
        return [entry[0]]
    if isinstance(entry, list):
        return [n for e in entry for n in _layer_refs(e)]
    if isinstance(entry, dict):
        return [n for e in entry.values() for n in _layer_refs(e)]
    return []


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
    """Serialize on the driver and prove it can be rebuilt (once per architecture and process),
    or raise :class:`ModelError`."""
    check_compiled(model)
    ensure_optimizer_built(model)
    try:
        archive = save_archive(model)
    except Exception as exc:  # noqa: BLE001 - report any save failure uniformly
        raise ModelError(f"model {model.name!r} cannot be serialized: {type(exc).__name__}: {exc}") from exc
    objs = {**_referenced_custom_objects(archive), **(custom_objects or {})}
    payload = ModelPayload.create(archive, objs, safe_mode)
    if (payload.digest, safe_mode) in _rebuilt:  # this architecture was rebuilt here before: it can be
        return payload
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
    if len(_rebuilt) >= _MAX_REBUILT:
        _rebuilt.clear()
    _rebuilt.add((payload.digest, safe_mode))
    log.debug("serialized model %s: %d bytes, custom objects %s", model.name, len(archive), sorted(objs))
    return payload


# architectures (digest, safe_mode) serialize_model has rebuilt in this process: the same
# canonical config and custom objects' code rebuild the same way, so a model built again (a
# notebook cell run twice) skips the driver's rebuild (0.05 s on a small CTR model)
_rebuilt: set[tuple[str, bool]] = set()
_MAX_REBUILT = 64


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
    """Weights and optimizer variables on the host (one batched transfer where the backend has one)."""
    return backend.current().read_values(state_variables(model))


def assign(variables: list, arrays: list[np.ndarray], what: str = "state") -> None:
    """Give each variable its array's value, checked for count and shape, copied: on JAX's CPU
    build Keras' ``Variable.assign`` of a numpy array can alias its buffer (when 64-byte aligned),
    so a caller that then reuses the buffer (a receive buffer, a ring's) would change the model
    under it; the backend's ``assign_values`` never aliases, and moves the arrays in one batch."""
    if len(variables) != len(arrays):
        raise ModelError(f"{what} has {len(arrays)} arrays but the model has {len(variables)} variables")
    for v, a in zip(variables, arrays):
        if tuple(v.shape) != tuple(np.shape(a)):
            raise ModelError(f"{what} array for {v.path!r} has shape {np.shape(a)}, expected {tuple(v.shape)}")
    backend.current().assign_values(variables, arrays)


def set_state(model: Any, arrays: list[np.ndarray]) -> None:
    assign(state_variables(model), arrays)


def set_weights(model: Any, arrays: list[np.ndarray]) -> None:
    """``model.set_weights`` through :func:`assign`."""
    assign(list(model.weights), arrays, "weights")


def set_optimizer_state(model: Any, arrays: list[np.ndarray]) -> None:
    assign(list(model.optimizer.variables), arrays, "optimizer state")


def get_metric_state(model: Any) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in model.metrics_variables]


def set_metric_state(model: Any, arrays: list[np.ndarray]) -> None:
    variables = model.metrics_variables
    if len(variables) != len(arrays):
        raise ModelError(
            f"workers reported {len(arrays)} metric variables but the driver's model has {len(variables)}; "
            "were the metrics changed after the model was handed to SparkModel?"
        )
    assign(list(variables), arrays, "metric state")


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
