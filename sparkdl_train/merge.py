"""Pure merge rules for results coming back from workers (no Spark, no Keras).

* model state (weights, optimizer slots) is averaged, weighted by the number of
  samples each worker trained on; integer state (e.g. the optimizer's step
  counter) takes the maximum, because averaging a counter is meaningless
  (:mod:`sparkdl_train.roles` decides which is which);
* metric state (Keras metric variables: totals, counts, confusion counts) is
  summed, which makes the final metric exactly what one process would have
  computed over the union of the data.

Workers return a :class:`Partial`; partials merge associatively, so Spark can
combine them with ``treeReduce`` and the driver never holds one copy per worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import wire
from .roles import is_numeric_mergeable


class WeightedMean:
    """Sample-weighted running mean of a list of arrays (float64 accumulation).

    One worker's mean (:meth:`of`) keeps that worker's arrays (``source``: what travels, half the
    bytes of the float64 sums for float32 state) and scales them into float64 ``sums`` only when
    something reads the sums (a merge, the result): a worker that returns its state never pays for
    the sums (twice its state's bytes: 216 MB for the flagship model with its optimizer)."""

    __slots__ = ("total_weight", "_sums", "dtypes", "source")

    def __init__(self, total_weight: float = 0.0, sums: list[np.ndarray] | None = None,
                 dtypes: list[str] | None = None, source: list[np.ndarray] | None = None):
        self.total_weight = total_weight
        self._sums = sums
        self.dtypes = dtypes
        self.source = source

    @property
    def sums(self) -> list[np.ndarray] | None:
        if self._sums is None and self.source is not None:
            self._sums = _scaled(self.source, self.total_weight)
        return self._sums

    def __repr__(self) -> str:
        return f"WeightedMean(total_weight={self.total_weight!r}, arrays={len(self.dtypes or [])})"

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray], weight: float) -> "WeightedMean":
        """One worker's arrays with its weight; the arrays are the caller's no longer (kept, not copied)."""
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        if weight == 0:
            return cls()
        arrays = [np.asarray(a) for a in arrays]
        return cls(float(weight), None, [a.dtype.str for a in arrays], arrays)

    def merge(self, other: "WeightedMean") -> "WeightedMean":
        if other.sums is None:
            return self
        if self.sums is None:
            return other
        if len(self.sums) != len(other.sums):
            raise ValueError(f"cannot merge states of {len(self.sums)} and {len(other.sums)} arrays")
        for i, (a, b) in enumerate(zip(self.sums, other.sums)):
            if a.shape != b.shape:
                raise ValueError(f"state array {i}: shape {a.shape} != {b.shape}")
            if is_numeric_mergeable(self.dtypes[i]):
                np.add(a, b, out=a)
            else:
                np.maximum(a, b, out=a)
        self.total_weight += other.total_weight
        self.source = None  # the sums are no longer one worker's arrays
        return self

    def result(self) -> list[np.ndarray]:
        if self.sums is None or self.total_weight <= 0:
            raise ValueError("no weighted contribution to average (every worker saw zero samples)")
        out = []
        for a, dt in zip(self.sums, self.dtypes):
            dt = np.dtype(dt)
            out.append(np.asarray(a / self.total_weight, dtype=dt) if is_numeric_mergeable(dt) else np.asarray(a, dtype=dt))
        return out


def _scaled(arrays: Sequence[np.ndarray], weight: float) -> list[np.ndarray]:
    """Float arrays as float64 times ``weight``, the others copied."""
    sums = []
    for a in arrays:
        if is_numeric_mergeable(a.dtype):
            s = np.array(a, dtype=np.float64, copy=True)
            np.multiply(s, weight, out=s)  # in place: 0-d arrays must stay arrays
        else:
            s = np.array(a, copy=True)
        sums.append(s)
    return sums


def sum_states(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> list[np.ndarray] | None:
    """Element-wise sum of two metric-state lists (either may be None = empty)."""
    if a is None:
        return b
    if b is None:
        return a
    if len(a) != len(b):
        raise ValueError(f"cannot merge metric states of {len(a)} and {len(b)} variables")
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            raise ValueError(f"metric variable {i}: shape {x.shape} != {y.shape}")
        out.append(x + y)
    return out


@dataclass
class Partial:
    """What one or more workers contribute to an epoch (or an evaluation)."""

    samples: int = 0
    batches: int = 0
    model: WeightedMean = field(default_factory=WeightedMean)
    metrics: list[np.ndarray] | None = None
    partitions: dict[int, dict[str, Any]] = field(default_factory=dict)

    def merge(self, other: "Partial") -> "Partial":
        overlap = set(self.partitions) & set(other.partitions)
        if overlap:
            raise ValueError(f"partition(s) {sorted(overlap)} reported twice")
        self.samples += other.samples
        self.batches += other.batches
        self.model = self.model.merge(other.model)
        self.metrics = sum_states(self.metrics, other.metrics)
        self.partitions.update(other.partitions)
        return self

    @property
    def empty_partitions(self) -> list[int]:
        return sorted(p for p, info in self.partitions.items() if info.get("samples", 0) == 0)

    # -- binary form (used where results travel through Arrow) ----------------
    def to_bytes(self) -> bytes:
        """Its binary form; one worker's model state travels as that worker's arrays (float32 for
        most models) and is scaled on arrival exactly as :meth:`WeightedMean.of` scales it."""
        scaled = self.model.source is None
        model = (self.model.sums if scaled else self.model.source) or []
        metrics = self.metrics or []
        meta = {
            "samples": self.samples,
            "batches": self.batches,
            "weight": self.model.total_weight,
            "dtypes": self.model.dtypes,
            "scaled": scaled,
            "n_model": len(model),
            "n_metrics": len(metrics) if self.metrics is not None else None,
            "partitions": {str(k): v for k, v in self.partitions.items()},
        }
        return wire.encode(meta, [*model, *metrics])

    @classmethod
    def from_bytes(cls, data: bytes) -> "Partial":
        meta, arrays = wire.decode(data, copy=True)
        n_model = int(meta["n_model"])
        if n_model and meta.get("scaled") is False:
            model = WeightedMean.of(arrays[:n_model], float(meta["weight"]))
        else:
            model = WeightedMean(
                total_weight=float(meta["weight"]),
                sums=arrays[:n_model] if n_model else None,
                dtypes=meta["dtypes"],
            )
        metrics = arrays[n_model:] if meta["n_metrics"] is not None else None
        return cls(
            samples=int(meta["samples"]),
            batches=int(meta["batches"]),
            model=model,
            metrics=metrics,
            partitions={int(k): v for k, v in meta["partitions"].items()},
        )


def merge_partials(a: Partial, b: Partial) -> Partial:
    return a.merge(b)
