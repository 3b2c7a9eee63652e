"""Gather and scatter-add of table rows: the parameter server's per-row work.

``table[ids] += rows`` and ``table[ids]`` go through numpy's general (n-dimensional) fancy
indexing, about 87 ns per 36-byte row for the apply and the reply's gather on this project's CI
machine. ``np.take`` along axis 0, an in-place add and ``np.put`` on a view of the table as one
opaque item per row do the same work in about 30 ns (``bench/ps/rows.py`` measures both ways).
Both release the interpreter's lock while they copy, so applies to different tables (or shards)
run in parallel on a driver with free cores; what serialises them is the server's own lock.
"""

from __future__ import annotations

import numpy as np


def row_view(table: np.ndarray) -> np.ndarray:
    """``table`` (C-contiguous, rows along axis 0) seen as a 1-D array of one opaque item per row."""
    if not table.flags.c_contiguous:
        raise ValueError("a table must be C-contiguous to be updated by rows")
    n = table.shape[0]
    width = table.dtype.itemsize * (table.size // n if n else int(np.prod(table.shape[1:], dtype=np.int64)))
    if width == 0:
        raise ValueError(f"a table of shape {table.shape} has empty rows")
    return table.reshape(n, -1).view(np.dtype((np.void, width))).reshape(n)


def gather(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A copy of ``table[ids]`` (ids may repeat)."""
    return np.take(table, ids, axis=0)


def scatter_add(table: np.ndarray, rows_of_table: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
    """``table[ids] += rows`` for unique ``ids``; ``rows_of_table`` is :func:`row_view` of ``table``.

    Not atomic: two concurrent calls on overlapping ids can lose an addition (callers lock, or
    accept it, as hogwild does)."""
    if len(ids) == 0:
        return
    updated = np.take(table, ids, axis=0)
    np.add(updated, rows, out=updated, casting="same_kind")
    np.put(rows_of_table, ids, row_view(updated))
