"""Screening a chunk stream for NaN / infinite values (pure numpy).

One non-finite feature or label turns the loss into NaN, and with model averaging or a
parameter server one worker's NaN spreads to every worker at the next merge. The policy
(``SparkModel(nan_policy=...)``, ``spark.sparkdl_train.data.nanPolicy``):

* ``"fail"`` (default): the task fails with a :class:`~sparkdl_train.errors.DataError`
  naming the input (or label), the partition and the row;
* ``"skip"``: rows holding a non-finite value are dropped and counted
  (``skipped_rows`` in the partition's statistics);
* ``"ignore"``: no check (the rows reach the model as they are).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..config import NAN_POLICIES
from ..errors import ConfigError, DataError
from .batching import Batch, num_rows, take_rows


def _named_leaves(batch: Batch, input_names: Sequence[str] = ()) -> list[tuple[str, np.ndarray]]:
    x, y, w = (tuple(batch) + (None, None))[:3]
    names = list(input_names)
    out: list[tuple[str, np.ndarray]] = []
    if isinstance(x, dict):
        out += [(f"input {k!r}", v) for k, v in x.items()]
    elif isinstance(x, (list, tuple)):
        out += [(f"input {names[i]!r}" if i < len(names) else f"input #{i}", v) for i, v in enumerate(x)]
    elif x is not None:
        out.append((f"input {names[0]!r}" if len(names) == 1 else "the features", x))
    if y is not None:
        leaves = y.items() if isinstance(y, dict) else enumerate(y) if isinstance(y, (list, tuple)) else [("", y)]
        out += [(f"label {k!r}" if k != "" else "the label", v) for k, v in leaves]
    if w is not None:
        out.append(("the sample weight", w))
    return out


def bad_rows(batch: Batch, input_names: Sequence[str] = ()) -> tuple[np.ndarray | None, str | None]:
    """A boolean mask of rows holding a non-finite value (``None`` if all are finite), and
    the name of the first input where one was found."""
    mask = None
    first = None
    for name, leaf in _named_leaves(batch, input_names):
        a = np.asarray(leaf)
        if a.dtype.kind not in "fc" or a.size == 0:
            continue
        ok = np.isfinite(a)
        if ok.all():
            continue
        row_bad = ~ok.reshape(len(a), -1).all(axis=1)
        mask = row_bad if mask is None else (mask | row_bad)
        first = first or name
    return mask, first


class Screen:
    """Applies a NaN policy to a partition's chunks; counts what it dropped."""

    def __init__(self, policy: str, partition: int, model: Any = None):
        if policy not in NAN_POLICIES:
            raise ConfigError(f"unknown nan_policy {policy!r}; expected one of {', '.join(NAN_POLICIES)}")
        self.policy = policy
        self.partition = partition
        self.skipped = 0
        try:
            self.input_names = [t.name for t in model.inputs] if model is not None else []
        except (AttributeError, ValueError, TypeError):  # a subclassed model has no symbolic inputs
            self.input_names = []

    def __call__(self, chunks: Iterable[Batch]) -> Iterator[Batch]:
        if self.policy == "ignore":
            yield from chunks
            return
        seen = 0
        for chunk in chunks:
            n = num_rows(chunk)
            mask, name = bad_rows(chunk, self.input_names)
            if mask is not None:
                if self.policy == "fail":
                    row = seen + int(np.argmax(mask))
                    raise DataError(
                        f"non-finite value (NaN or inf) in {name}, partition {self.partition}, row {row} of the "
                        f"partition ({int(mask.sum())} such rows in its chunk); clean the data, or pass "
                        "nan_policy='skip' (spark.sparkdl_train.data.nanPolicy=skip) to drop such rows"
                    )
                self.skipped += int(mask.sum())
                chunk = take_rows(chunk, np.flatnonzero(~mask))
            seen += n
            yield chunk

    def info(self) -> dict[str, Any]:
        return {"skipped_rows": self.skipped} if self.policy == "skip" else {}
