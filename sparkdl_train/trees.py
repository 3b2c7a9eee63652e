"""Nested structures of arrays (pure numpy): what a batch is made of.

A *batch* is ``(x, y, sample_weight)`` where ``x`` is an array, a list of arrays (multi-input model,
in input order) or a dict of arrays keyed by input name, and ``y`` / ``sample_weight`` are arrays or
``None``. The backends and the data path both walk them with these functions.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Batch = tuple  # (x, y, sample_weight)


def tree_map(fn: Callable[[np.ndarray], Any], struct: Any) -> Any:
    if struct is None:
        return None
    if isinstance(struct, dict):
        return {k: tree_map(fn, v) for k, v in struct.items()}
    if isinstance(struct, (list, tuple)):
        return type(struct)(tree_map(fn, v) for v in struct)
    return fn(struct)


def tree_leaves(struct: Any) -> list[np.ndarray]:
    if struct is None:
        return []
    if isinstance(struct, dict):
        return [leaf for k in struct for leaf in tree_leaves(struct[k])]
    if isinstance(struct, (list, tuple)):
        return [leaf for v in struct for leaf in tree_leaves(v)]
    return [struct]


def tree_zip(structs: list[Any], leaf: Callable[[list[np.ndarray]], Any]) -> Any:
    """``structs`` of one structure as one: ``leaf`` of the arrays at each position (``None`` stays ``None``)."""
    first = structs[0]
    if first is None:
        return None
    if isinstance(first, dict):
        return {k: tree_zip([s[k] for s in structs], leaf) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(tree_zip([s[i] for s in structs], leaf) for i in range(len(first)))
    return leaf(structs)


def zero_rows(batch: Batch, rows: int) -> Batch:
    """A batch of ``rows`` zero rows with ``batch``'s signature (it may have no rows itself): what a
    backend that compiles per shape compiles a full batch's step for."""
    return tree_map(lambda a: np.zeros((rows,) + np.shape(a)[1:], np.asarray(a).dtype), batch)
