"""Embedding-table rows (pure numpy): a table's shape as the row exchanges see it, and the sum of
gathered rows per id. Used by the ring's row gather (:mod:`sparkdl_train.allreduce.row_gather`) and the
backends' fused steps, which apply what it gathered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TableShape:
    """A table exchanged by rows: ``rows`` x ``dim`` float32 gradients, at most ``most`` rows from a
    rank per step (the ids one batch looks up; 0: ``rows``)."""

    rows: int
    dim: int
    most: int = 0

    @property
    def id_dtype(self) -> np.dtype:
        return np.dtype(np.int32 if self.rows < 2**31 else np.int64)

    @property
    def limit(self) -> int:
        return min(self.rows, self.most) if self.most > 0 else self.rows


def combine(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gathered ``(ids, rows)`` of a table with each id once (sorted) and its rows added in the
    order they come (rank order): what a sequential scatter-add of them gives, computed on the host,
    so that a device whose scatter-add of repeated ids is not ordered (a GPU's atomics) still gives
    every rank the same bits."""
    if len(ids) == 0:
        return ids, rows
    unique, where = np.unique(ids, return_inverse=True)
    sums = np.zeros((len(unique), rows.shape[1]), np.float32)
    np.add.at(sums, where.reshape(-1), rows)
    return unique.astype(ids.dtype, copy=False), sums
