"""Which weights of a model can be synchronised by rows (driver side: inspects the Keras model)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .. import _compat
from ..errors import ConfigError
from ..worker.row_sync import SparseTable

log = logging.getLogger(__name__)


def find_tables(model: Any) -> tuple[SparseTable, ...]:
    """Trainable ``keras.layers.Embedding`` tables whose ids come straight from a model input.

    A table fed by another layer (its ids are computed inside the model), a shared
    embedding called on several inputs, or a quantized / LoRA table is kept dense:
    the worker could not tell which rows a batch touches without running the model.
    """
    import keras

    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError):
        return ()  # subclassed model: no graph to inspect
    struct = _compat.inputs_struct(model)
    keys = {id(v): k for k, v in struct.items()} if isinstance(struct, dict) else {}
    position = {id(t): p for p, t in enumerate(inputs)}
    index = {id(w): i for i, w in enumerate(model.weights)}
    out = []
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Embedding) or not layer.trainable:
            continue
        why = None
        nodes = _compat.inbound_nodes(layer)
        if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
            why = "it is quantized or LoRA-enabled"
        elif len(nodes) != 1 or len(nodes[0].input_tensors) != 1:
            why = "it is called on several inputs"
        elif id(nodes[0].input_tensors[0]) not in position:
            why = "its ids are computed inside the model, not read from an input"
        elif id(layer.embeddings) not in index:
            why = "its table is not among the model's weights"
        if why:
            log.info("embedding %r is synchronised densely: %s", layer.name, why)
            continue
        t = nodes[0].input_tensors[0]
        out.append(
            SparseTable(
                index=index[id(layer.embeddings)],
                name=layer.name,
                rows=int(layer.embeddings.shape[0]),
                input_key=keys.get(id(t), t.name),
                input_position=position[id(t)],
            )
        )
    return tuple(sorted(out, key=lambda t: t.index))


def gradient_tables(model: Any, setting: bool | None, ranks: int, batch_size: int) -> tuple[tuple[int, int], ...]:
    """``(position in model.weights, the most rows one batch looks up)`` of each table whose gradient
    the allreduce exchanges as the rows a step touched (``allreduce.sparseGradients``): with ``True``
    every table :func:`find_tables` finds; with ``None`` (auto) those for which the rows of a batch,
    at most ``batch_size`` times the ids an example looks up, move fewer bytes than the dense ring
    (:func:`sparkdl_train.allreduce.row_gather.pays`) and whose gradient is only those rows (no
    regularizer); ``False``: none."""
    from ..allreduce.row_gather import pays

    if setting is False or ranks < 2 and setting is None:
        return ()
    layers = {id(getattr(layer, "embeddings", None)): layer for layer in getattr(model, "layers", [])}
    weights = list(model.weights)
    out = []
    for t in find_tables(model):
        layer = layers.get(id(weights[t.index]))
        dim = int(weights[t.index].shape[1]) if len(weights[t.index].shape) == 2 else 0
        if getattr(layer, "embeddings_regularizer", None) is not None:
            if setting:
                raise ConfigError(f"sparse_gradients=True: embedding {t.name!r} has a regularizer, so its gradient "
                                  "reaches every row, not only the rows a batch looks up; set sparse_gradients=False")
            log.info("embedding %r: dense gradients (its regularizer reaches every row)", t.name)
            continue
        shape = tuple(model.inputs[t.input_position].shape[1:])
        known = dim > 0 and all(d is not None for d in shape)
        lookups = min(t.rows, batch_size * int(np.prod(shape, dtype=np.int64))) if known else t.rows
        if setting is None:
            if not known:
                log.info("embedding %r: dense gradients (ids per example unknown: input shape %s)", t.name, shape)
                continue
            if not pays(t.rows, dim, ranks, lookups):
                log.info("embedding %r: dense gradients (%d ranks x up to %d rows of %d beat the dense ring)",
                         t.name, ranks, lookups, t.rows)
                continue
        out.append((t.index, lookups))
    return tuple(out)
