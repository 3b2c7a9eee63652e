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

import contextlib
import hashlib
import inspect
import io
import json
import logging
import os
import sys
import sysconfig
import tempfile
import threading
import types
import zipfile
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import backend
from .errors import ModelError
from .roles import Role, exchanged, role

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
    # a function that builds the compiled model (``SparkModel(build_model)``), by value; executors call it
    # instead of reading ``archive`` (empty then)
    builder_blob: bytes = b""
    # a few rows of features (by value) that build a model that builds on its first batch (subclassed, no Input)
    build_batch_blob: bytes = b""

    @classmethod
    def create(cls, archive: bytes, custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> "ModelPayload":
        objs = dict(custom_objects or {})
        blob = dumps_by_value(objs) if objs else b""
        return cls(archive=archive, custom_objects_blob=blob, safe_mode=safe_mode, digest=architecture_digest(archive, blob))

    @classmethod
    def from_builder(cls, builder: Any, custom_objects: dict[str, Any] | None = None, build_batch: Any = None) -> "ModelPayload":
        blob = dumps_by_value(builder)
        objs = dumps_by_value(dict(custom_objects)) if custom_objects else b""
        batch = dumps_by_value(build_batch) if build_batch is not None else b""
        digest = hashlib.sha256(b"builder" + hashlib.sha256(blob).digest() + hashlib.sha256(objs + batch).digest()).hexdigest()[:16]
        return cls(archive=b"", custom_objects_blob=objs, digest=digest, builder_blob=blob, build_batch_blob=batch)

    def custom_objects(self) -> dict[str, Any]:
        return _cloudpickle().loads(self.custom_objects_blob) if self.custom_objects_blob else {}

    def build_batch(self) -> Any:
        return _cloudpickle().loads(self.build_batch_blob) if self.build_batch_blob else None


def _cloudpickle():
    try:
        from pyspark import cloudpickle
    except ImportError:  # pragma: no cover - pyspark is a dependency
        import cloudpickle
    return cloudpickle


# top-level packages whose objects are never the user's own: never discovered as custom objects, always by reference
_FRAMEWORKS = ("keras", "tensorflow", "tf_keras", "jax", "numpy", "builtins", "sparkdl_train")
# modules pickled by reference (executors have them): the standard library, installed packages, sparkdl_train
_INSTALLED = tuple({p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")) if p})


def _local_module(name: str) -> bool:
    """Whether module ``name`` is the user's own code (a file beside a notebook or job, not an
    installed package), which executors may not be able to import."""
    if not name or name == "__main__" or name.split(".")[0] in _FRAMEWORKS:
        return False  # __main__ already goes by value
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or not path:
        return False
    path = os.path.realpath(path)
    return not any(path.startswith(os.path.realpath(p) + os.sep) for p in _INSTALLED) and "site-packages" not in path


_BY_VALUE_LOCK = threading.Lock()


def dumps_by_value(obj: Any) -> bytes:
    """cloudpickle bytes of ``obj``, with the classes and functions of the user's own modules (and
    ``__main__``'s, a notebook's) pickled by value: executors need not import them. Made on the
    driver; travels in a broadcast or task closure (Spark's channels), never over sparkdl_train's
    sockets, which refuse pickle."""
    cp = _cloudpickle()
    modules = sorted({m for m in _referenced_modules(obj) if _local_module(m)})
    with _BY_VALUE_LOCK:  # cloudpickle's registry is process-wide: two fits serializing at once share it
        registered = []
        # the user's own registrations stay (the registry lives in the module that defines the function)
        already = set(getattr(sys.modules[cp.register_pickle_by_value.__module__], "_PICKLE_BY_VALUE_MODULES", ()))
        for name in modules:
            if name in already:
                continue
            try:
                cp.register_pickle_by_value(sys.modules[name])
            except ValueError:  # not a module cloudpickle takes by value: it goes by reference, as before
                continue
            registered.append(name)
        try:
            return cp.dumps(obj)
        finally:
            for name in registered:
                with contextlib.suppress(ValueError):
                    cp.unregister_pickle_by_value(sys.modules[name])


def _referenced_modules(obj: Any, depth: int = 0) -> set[str]:
    """Modules of the classes and functions in ``obj`` (a callable, a class, or dicts/lists of them)
    and, for a function, of the globals and closure cells it uses."""
    out: set[str] = set()
    if depth > 3:
        return out
    if isinstance(obj, dict):
        for v in obj.values():
            out |= _referenced_modules(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            out |= _referenced_modules(v, depth + 1)
    elif isinstance(obj, type):
        out |= {c.__module__ for c in obj.__mro__ if c.__module__ not in ("builtins",)}
    elif isinstance(obj, types.FunctionType):
        out.add(obj.__module__)
        code_names = set(obj.__code__.co_names)
        for k in code_names & set(obj.__globals__):
            v = obj.__globals__[k]
            if isinstance(v, (type, types.FunctionType)):
                out |= _referenced_modules(v, depth + 1)
            elif isinstance(v, types.ModuleType):
                out.add(v.__name__)
        for cell in obj.__closure__ or ():
            try:
                out |= _referenced_modules(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                pass
    elif obj is not None and not isinstance(obj, (str, bytes, int, float, bool, np.ndarray)):
        out.add(type(obj).__module__)
    return out


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


def check_compiled(model: Any, built: bool = True) -> None:
    """A compiled ``keras.Model`` (and built, unless ``built`` is False: a model that builds on its first
    batch, as ``model.fit`` builds it, is built by :func:`build_from_batch` before it is shipped)."""
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
    if built and not model.built:
        raise ModelError(
            f"model {model.name!r} is not built: give it an Input layer, or call model.build(input_shape) "
            "(or run it once on data) before handing it to SparkModel"
        )


def build_from_batch(model: Any, x: Any) -> None:
    """Build a model that builds on its first batch (a subclassed model without ``Input``), as
    ``model.fit`` does, by running it on the features ``x`` of a few rows (inference mode: no
    statistic moves). A model already built is left as it is."""
    if model.built:
        return
    try:
        model(x, training=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"model {model.name!r} is not built and could not be built by running it on a batch of the data: "
                         f"{type(exc).__name__}: {exc}") from exc
    if not model.built:
        model.built = True  # called successfully: every layer it uses was built by the call


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
    """The compiled model a payload describes: its builder's (``SparkModel(build_model)``), built on the
    payload's rows if it builds on its first batch, or the archive's."""
    if payload.builder_blob:
        model = build_with(_cloudpickle().loads(payload.builder_blob), payload.build_batch())
    else:
        model = load_model_bytes(payload.archive, payload.custom_objects(), payload.safe_mode)
    if model.optimizer is None:
        raise ModelError("the rebuilt model has no optimizer (was it compiled before saving?)")
    ensure_optimizer_built(model)
    return model


def build_with(builder: Any, build_batch: Any = None) -> Any:
    """``builder()``: a compiled model (built on ``build_batch``'s features when it builds on its first batch)."""
    try:
        model = builder()
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"the model-building function {getattr(builder, '__name__', builder)!r} failed: "
                         f"{type(exc).__name__}: {exc}") from exc
    check_compiled(model, built=False)
    if not model.built and build_batch is not None:  # none: the driver's, built later on the fit's sample rows
        build_from_batch(model, build_batch)
    return model


def _outside_keras(obj: Any) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module.split(".")[0] not in _FRAMEWORKS


def discover_custom_objects(model: Any) -> dict[str, Any]:
    """The classes and functions outside Keras that a model's config names, keyed as Keras' config
    names them: every layer's and nested model's class (the model's own, if subclassed), functions a
    layer holds (an activation, ``TextVectorization``'s ``standardize`` / ``split``), and the compile
    arguments' (losses, metrics, the optimizer, a learning-rate schedule). Shipped by value
    (:func:`dumps_by_value`) as ``custom_objects``: executors need neither registration nor the module."""
    keras = _keras()
    found: dict[str, Any] = {}

    def add(obj: Any, depth: int = 0) -> None:
        if depth > 3 or obj is None:
            return
        if isinstance(obj, dict):
            for v in obj.values():
                add(v, depth + 1)
            return
        if isinstance(obj, (list, tuple)):
            for v in obj:
                add(v, depth + 1)
            return
        if isinstance(obj, types.FunctionType):
            # plain functions only: a method (``NoKwargs.build``, which Keras wraps per instance) names no config entry
            plain = "." not in obj.__qualname__.replace("<locals>.", "")
            if _outside_keras(obj) and obj.__name__ != "<lambda>" and plain:
                found.setdefault(obj.__name__, obj)
            return
        cls = obj if isinstance(obj, type) else type(obj)
        if _outside_keras(cls) and hasattr(cls, "from_config"):
            found.setdefault(keras.saving.get_registered_name(cls), _lenient(cls))
        if not isinstance(obj, type) and isinstance(obj, (keras.losses.Loss, keras.metrics.Metric,
                                                           keras.optimizers.schedules.LearningRateSchedule)):
            for v in getattr(obj, "__dict__", {}).values():  # a LossFunctionWrapper's fn, a schedule's pieces
                if isinstance(v, (types.FunctionType, type)):
                    add(v, depth + 1)

    for layer in model._flatten_layers(include_self=True, recursive=True):
        add(type(layer))
        for v in vars(layer).values():
            if isinstance(v, (types.FunctionType, list, tuple, dict)) and not isinstance(v, keras.layers.Layer):
                add(v, 1)
            elif isinstance(v, (keras.losses.Loss, keras.optimizers.schedules.LearningRateSchedule)):
                add(v, 1)
    compiled = getattr(model, "_compile_config", None)  # compile()'s own arguments (losses, metrics, optimizer)
    if compiled is not None:
        add(getattr(compiled, "config", None))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        add(optimizer)
        add(getattr(optimizer, "_learning_rate", None))
    return found


class LenientLayer:
    """``custom_objects``' entry for a layer class whose ``__init__`` takes no ``**kwargs`` but whose
    ``get_config`` extends the base layer's (``name``, ``trainable``, ``dtype``): Keras' ``from_config``
    passes those to ``__init__`` and fails. This builds it from the keys ``__init__`` takes and sets the
    others after, as the base layer would have. Shipped by value with the class."""

    def __init__(self, cls: type):
        self.cls = cls
        self.__name__ = cls.__name__

    def from_config(self, config: dict[str, Any]) -> Any:
        params = inspect.signature(self.cls.__init__).parameters
        obj = self.cls(**{k: v for k, v in config.items() if k in params})
        if "name" in config and "name" not in params:
            obj.name = config["name"]
        if "trainable" in config and "trainable" not in params:
            obj.trainable = config["trainable"]
        if config.get("dtype") is not None and "dtype" not in params:
            obj.dtype_policy = _keras().dtype_policies.get(config["dtype"])
        return obj


def _lenient(cls: type) -> Any:
    """``cls``, or a :class:`LenientLayer` for a layer class whose ``__init__`` takes no ``**kwargs`` and keeps
    Keras' own ``from_config`` (which passes the base layer's keys to ``__init__``)."""
    keras = _keras()
    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)) or issubclass(cls, keras.Model):
        return cls
    if getattr(cls.from_config, "__func__", None) is not getattr(keras.layers.Layer.from_config, "__func__", None):
        return cls  # its own from_config knows what it wants
    try:
        params = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return cls
    return cls if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params) else LenientLayer(cls)


def _failing_layer(model: Any, custom_objects: dict[str, Any], safe_mode: bool) -> str | None:
    """Which layer's config does not rebuild it (the innermost one), and why, or ``None``."""
    keras = _keras()
    layers = list(model._flatten_layers(include_self=True, recursive=True))
    for layer in reversed(layers):  # pre-order reversed: a layer's sublayers come before it
        try:
            config = keras.saving.serialize_keras_object(layer)
            keras.saving.deserialize_keras_object(config, custom_objects=custom_objects, safe_mode=safe_mode)
        except Exception as exc:  # noqa: BLE001
            cls = type(layer)
            why = " ".join(str(exc).split())
            why = why if len(why) <= 240 else why[:240] + "..."
            return (f"layer {layer.name!r} (class {cls.__name__} from {cls.__module__}) cannot be rebuilt from its config: "
                    f"{type(exc).__name__}: {why}")
    return None


def _unshippable(model: Any, what: str, exc: Exception, custom_objects: dict[str, Any], safe_mode: bool) -> ModelError:
    where = _failing_layer(model, custom_objects, safe_mode)
    detail = where or f"{type(exc).__name__}: {exc}"
    return ModelError(
        f"model {model.name!r} {what}, so executors could not rebuild it: {detail}\n"
        "Either give that class a get_config() returning its __init__ arguments (and accept **kwargs in __init__), or "
        "hand SparkModel a function that builds and compiles the model instead of the model: SparkModel(build_model, ...) "
        "(executors call it, shipped by value with the classes it uses; the driver's weights are loaded into what it builds)."
    )


def serialize_builder(builder: Any, model: Any, custom_objects: dict[str, Any] | None = None, build_batch: Any = None) -> ModelPayload:
    """The payload of ``SparkModel(build_model)``: the function by value; proven on the driver (once per
    function) to build a model with ``model``'s variables, so executors build the same layout."""
    ensure_optimizer_built(model)
    payload = ModelPayload.from_builder(builder, custom_objects, build_batch)
    if (payload.digest, True) in _rebuilt:
        return payload
    try:
        clone = load_archive(payload)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"the model-building function cannot be shipped: {type(exc).__name__}: {exc}") from exc
    _check_same_layout(model, clone, compare_values=False, how="built again by the model-building function")
    _remember_rebuilt((payload.digest, True))
    return payload


def serialize_model(model: Any, custom_objects: dict[str, Any] | None = None, safe_mode: bool = True) -> ModelPayload:
    """Serialize on the driver and prove it can be rebuilt (once per architecture and process),
    or raise :class:`ModelError` naming the layer that cannot be. The model's own classes and
    functions outside Keras (:func:`discover_custom_objects`) travel by value with it."""
    check_compiled(model)
    ensure_optimizer_built(model)
    objs = {**discover_custom_objects(model), **(custom_objects or {})}
    try:
        archive = save_archive(model)
    except Exception as exc:  # noqa: BLE001 - report any save failure uniformly
        raise _unshippable(model, "cannot be serialized", exc, objs, safe_mode) from exc
    objs = {**_referenced_custom_objects(archive), **objs}
    payload = ModelPayload.create(archive, objs, safe_mode)
    if (payload.digest, safe_mode) in _rebuilt:  # this architecture was rebuilt here before: it can be
        return payload
    try:
        clone = load_archive(payload)
    except Exception as exc:  # noqa: BLE001
        if not safe_mode or "safe_mode" not in str(exc):
            raise _unshippable(model, "was saved but cannot be rebuilt from its config", exc, objs, safe_mode) from exc
        raise ModelError(
            f"model {model.name!r} was saved but cannot be rebuilt from its config, so executors could not "
            f"load it: {type(exc).__name__}: {exc}\nFor Lambda layers pass safe_mode=False (their code is shipped by value)."
        ) from exc
    _check_same_layout(model, clone)
    _remember_rebuilt((payload.digest, safe_mode))
    log.debug("serialized model %s: %d bytes, custom objects %s", model.name, len(archive), sorted(objs))
    return payload


# architectures (digest, safe_mode) serialize_model has rebuilt in this process: the same
# canonical config and custom objects' code rebuild the same way, so a model built again (a
# notebook cell run twice) skips the driver's rebuild (0.05 s on a small CTR model)
_rebuilt: set[tuple[str, bool]] = set()
_MAX_REBUILT = 64


def _remember_rebuilt(key: tuple[str, bool]) -> None:
    """Record an architecture (or building function) proven on the driver, the set kept bounded."""
    if len(_rebuilt) >= _MAX_REBUILT:
        _rebuilt.clear()
    _rebuilt.add(key)


def _check_same_layout(model: Any, clone: Any, compare_values: bool = True, how: str = "rebuilt from its config") -> None:
    a = [tuple(v.shape) for v in state_variables(model)]
    b = [tuple(v.shape) for v in state_variables(clone)]
    if a != b:
        raise ModelError(
            f"model {model.name!r} {how} has a different set of variables "
            f"({len(b)} vs {len(a)}); does a custom layer's get_config()/build() lose information, or does the "
            "model-building function build another model?"
        )
    if not compare_values:
        return
    for i, (va, vb) in enumerate(zip(model.weights, clone.weights)):
        if not np.array_equal(np.asarray(va), np.asarray(vb)):
            raise ModelError(f"weight {va.path!r} differs after a save/load round trip")


# -- state ---------------------------------------------------------------------

def state_variables(model: Any) -> list:
    return [*model.weights, *model.optimizer.variables]


def variable_roles(variables: Any) -> list[Role]:
    """Each variable's :class:`~sparkdl_train.roles.Role` (weight, statistic, discrete, random)."""
    return [role(v.dtype, bool(getattr(v, "trainable", False)), getattr(v, "path", "") or "") for v in variables]


def seed_random_state(model: Any, key: Sequence[int]) -> int:
    """Give every random generator the model holds (``keras.random.SeedGenerator``: ``Dropout``'s,
    ``GaussianNoise``'s, a random augmentation layer's) a state drawn from ``key`` (the fit's seed,
    the epoch, the partition), so that a task's dropout masks and noise depend on what it trains and
    not on which Python worker ran it or what that worker ran before; returns how many it seeded.
    A generator's state is ``[seed, counter]``: the seed drawn, the counter from zero."""
    every = model.variables  # a walk of the model's layers: once
    variables = [v for v, r in zip(every, variable_roles(every)) if r is Role.RANDOM]
    if not variables:
        return 0
    rng = np.random.default_rng([int(k) for k in key])
    arrays = []
    for v in variables:
        a = np.zeros(tuple(v.shape), dtype=np.dtype(getattr(v.dtype, "name", v.dtype)))
        a.flat[0] = rng.integers(1, 2**31 - 1)
        arrays.append(a)
    backend.current().assign_values(variables, arrays)
    return len(variables)


def exchanged_positions(model: Any) -> list[int]:
    """Positions in ``model.weights`` whose values engines add and average (floating weights and
    statistics); the others (integer and boolean state) keep the driver's value on every worker."""
    return exchanged(variable_roles(model.weights))


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
