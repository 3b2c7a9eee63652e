"""Every Keras private attribute sparkdl_train relies on, in one place.

Keras 3 offers no public way to do a few things a distributed trainer needs: build a model's
compiled metrics from a data batch, compute the loss exactly as ``train_step`` does (loss
tracker included) in a split gradient step, map a functional model's input names, walk a layer's
inbound nodes, or tell a learning-rate schedule from a constant. Each use goes through a helper
here, with the public fallback where there is one; :func:`missing` lists the attributes a given
Keras no longer has, and ``tests/unit/test_compat.py`` fails naming them when an upgrade removes one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)

# (owner, attribute, what sparkdl_train uses it for)
PRIVATE = (
    ("keras.Model", "_symbolic_build", "build compiled metrics and loss from a data batch before the first step"),
    ("keras.Model", "_compute_loss", "the loss of a split (allreduce) gradient step, as train_step computes it"),
    ("keras.Model", "_loss_tracker", "the running loss metric a split gradient step updates"),
    ("keras.Model", "_call_has_training_arg", "whether call() takes training="),
    ("functional keras.Model", "_inputs_struct", "input names of a functional model (sparse embedding tables)"),
    ("keras.layers.Layer", "_inbound_nodes", "which model input feeds an embedding table"),
    ("keras.optimizers.Optimizer", "_learning_rate", "a learning-rate schedule versus a constant (lr_scaling)"),
    ("keras.Model", "_compile_config", "undo the legacy HDF5 writer's removal of the optimizer from it (Elephas .h5 files)"),
)


def symbolic_build(model: Any, batch: Any) -> None:
    """Build the model's compiled loss and metrics (and optimizer) for ``batch``, symbolically.

    ``fit`` does this before its first step on JAX and torch, and on TensorFlow only under a
    distribution strategy (``_maybe_symbolic_build``); otherwise TensorFlow creates them in the
    first trace, and a ``tf.function`` that creates variables traces twice. Building them here
    saves that second trace (0.3-0.5 s on a worker's first step with ``metrics=["accuracy"]``).
    A model that cannot be built symbolically is left to its first step, as ``fit`` leaves it.
    """
    build = getattr(model, "_symbolic_build", None)
    if build is None:
        return
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow's; JAX models have none
    try:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            build(data_batch=_string_specs(batch))
    except Exception as exc:  # noqa: BLE001 - its first step builds it, or fails with the real error
        log.debug("symbolic build of %s failed, left to the first step: %s", getattr(model, "name", model), exc)


class _StringSpec:
    """A string column's shape and Keras' dtype for it, where its numpy array says ``object``."""

    def __init__(self, shape: tuple) -> None:
        self.shape, self.dtype = shape, "string"


def _string_specs(batch: Any) -> Any:
    """``batch`` with its arrays of strings (numpy's object, bytes and str dtypes, which Keras' symbolic
    inputs refuse: "Invalid dtype: object") as string specs of their shape: a model fed a text column
    (``TextVectorization``, ``StringLookup``) builds symbolically like any other."""
    import numpy as np

    from .trees import tree_map

    def spec(leaf: Any) -> Any:
        return _StringSpec(leaf.shape) if isinstance(leaf, np.ndarray) and leaf.dtype.kind in "OSU" else leaf

    return tree_map(spec, batch)


def compiled_metrics_built(model: Any) -> bool:
    """Whether the model's compiled loss and metrics are built (``compile`` leaves them to the
    first step or :func:`symbolic_build`, which resolves names such as ``"accuracy"`` from the
    batch's shapes)."""
    parts = (getattr(model, "_compile_metrics", None), getattr(model, "_compile_loss", None))
    return all(p is None or getattr(p, "built", True) for p in parts)


def compute_loss(model: Any) -> Any:
    """The loss function ``train_step`` uses (``_compute_loss`` wraps ``compute_loss`` with loss scaling hooks)."""
    return getattr(model, "_compute_loss", None) or model.compute_loss


def loss_tracker(model: Any) -> Any:
    return getattr(model, "_loss_tracker", None)


def call_takes_training(model: Any) -> bool:
    return getattr(model, "_call_has_training_arg", True)


def inputs_struct(model: Any) -> Any:
    return getattr(model, "_inputs_struct", None)


def inbound_nodes(layer: Any) -> list:
    return getattr(layer, "_inbound_nodes", [])


def raw_learning_rate(optimizer: Any) -> Any:
    """The optimizer's learning rate as given: a variable, or a schedule (callable)."""
    return getattr(optimizer, "_learning_rate", None)


def save_legacy_h5(model: Any, path: str) -> None:
    """``model.save(path)`` in Keras' legacy HDF5 format, leaving the model as it was: Keras' HDF5
    writer pops ``optimizer`` from the model's own compile config, after which a ``.keras`` save of
    the same model loses its optimizer."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    optimizer = config.get("optimizer") if isinstance(config, dict) else None
    try:
        model.save(path)
    finally:
        if optimizer is not None and "optimizer" not in config:
            config["optimizer"] = optimizer


def missing(model: Any) -> list[str]:
    """The attributes of :data:`PRIVATE` that this Keras lacks, checked on a compiled functional
    ``model`` that has an optimizer and at least one layer."""
    owners = {
        "keras.Model": model,
        "functional keras.Model": model,
        "keras.layers.Layer": model.layers[-1],
        "keras.optimizers.Optimizer": model.optimizer,
    }
    out = []
    for owner, attr, _ in PRIVATE:
        obj = owners[owner]
        present = hasattr(obj, attr)
        if not present:
            out.append(f"{owner}.{attr}")
    return out


def assign_raw(variable: Any, value: Any) -> None:
    """Give a Keras variable a new value of its own shape and dtype without ``assign``'s checks and
    conversion (JAX: the array a compiled step returned); ``assign`` where Keras has no such hook."""
    direct = getattr(variable, "_direct_assign", None)
    if direct is None:
        variable.assign(value)
    else:
        direct(value)


def jax_update_metrics(model: Any, metrics_variables: Any, loss: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """JAX: the metric variables' new values after a step's loss tracker and compiled metrics update
    (statelessly), as Keras' own JAX ``train_step`` computes them."""
    _, new = model._update_metrics_variables(metrics_variables, loss, x, y, y_pred, sample_weight)
    return new
