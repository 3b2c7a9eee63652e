"""Which weights of a model can be synchronised by rows (driver side: inspects the Keras model)."""

from __future__ import annotations

import logging
from typing import Any

from .. import _compat
from ..worker.sparse import SparseTable

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
