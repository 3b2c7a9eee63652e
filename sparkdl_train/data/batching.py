"""Pure, streaming batch plumbing (numpy only; no Spark, no Keras).

A *batch* is ``(x, y, sample_weight)`` where ``x`` is an array, a list of arrays
(multi-input model, in input order) or a dict of arrays keyed by input name, and
``y`` / ``sample_weight`` are arrays or ``None``. Every leaf has the same number
of rows.

Sources yield *chunks* (batches of arbitrary size, e.g. one Arrow record batch);
:func:`rebatch` turns them into batches of exactly ``batch_size`` rows (the last
one may be shorter), holding at most one shuffle buffer in memory.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np

from ..trees import Batch, tree_leaves, tree_map, tree_zip, zero_rows  # noqa: F401 - part of this module's interface


def row_signature(batch: Any) -> str:
    """What a compiled step is traced for: the batch's structure and each leaf's row shape and
    dtype (str / bytes / object leaves are all "string"), not its row count; equal strings, one trace."""

    def leaf(a: Any) -> str:
        a = np.asarray(a)
        return f"{'string' if a.dtype.kind in 'OSU' else a.dtype.name}{list(a.shape[1:])}"

    def walk(struct: Any) -> str:
        if struct is None:
            return "None"
        if isinstance(struct, dict):
            return "{" + ", ".join(f"{k!r}: {walk(struct[k])}" for k in sorted(struct)) + "}"
        if isinstance(struct, (list, tuple)):
            return "(" + ", ".join(walk(v) for v in struct) + ")"
        return leaf(struct)

    return walk(batch)


def tree_concat(structs: list[Any]) -> Any:
    return tree_zip(structs, lambda arrays: np.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0])


def stack_batches(batches: list[Batch]) -> Batch:
    """Batches of one structure and size as one, each leaf stacked along a new first dimension
    (``(len(batches), rows, ...)``); ``None`` leaves stay ``None``. One batch: views, no copy."""
    return tree_zip(batches, lambda arrays: np.stack(arrays) if len(arrays) > 1 else np.asarray(arrays[0])[np.newaxis])


def num_rows(batch: Batch) -> int:
    leaves = tree_leaves(batch)
    if not leaves:
        return 0
    n = len(leaves[0])
    for leaf in leaves[1:]:
        if len(leaf) != n:
            raise ValueError(f"inconsistent row counts inside one batch: {n} vs {len(leaf)}")
    return n


def take_rows(batch: Batch, index: np.ndarray | slice) -> Batch:
    return tree_map(lambda a: a[index], batch)


def rebatch(
    chunks: Iterable[Batch],
    batch_size: int,
    shuffle: bool = False,
    buffer_rows: int = 0,
    rng: np.random.Generator | None = None,
) -> Iterator[Batch]:
    """Stream ``chunks`` as batches of ``batch_size`` rows.

    Without shuffling the row order is preserved. With shuffling, rows are
    gathered into a buffer of at least ``max(buffer_rows, batch_size)`` rows,
    permuted, and emitted; the rows that do not fill a whole batch are carried
    into the next buffer, so only the very last batch of the stream is short.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if shuffle and rng is None:
        rng = np.random.default_rng()
    threshold = max(batch_size, buffer_rows if shuffle else batch_size)
    pending: list[Batch] = []
    pending_rows = 0

    def drain(final: bool) -> Iterator[Batch]:
        nonlocal pending, pending_rows
        block = tree_concat(pending) if len(pending) > 1 else pending[0]
        n = pending_rows
        if shuffle:
            block = take_rows(block, rng.permutation(n))
        full = (n // batch_size) * batch_size
        for start in range(0, full, batch_size):
            yield take_rows(block, slice(start, start + batch_size))
        if full < n:
            rest = take_rows(block, slice(full, n))
            if final:
                yield rest
                pending, pending_rows = [], 0
            else:
                pending, pending_rows = [rest], n - full
        else:
            pending, pending_rows = [], 0

    for chunk in chunks:
        n = num_rows(chunk)
        if n == 0:
            continue
        pending.append(chunk)
        pending_rows += n
        if pending_rows >= threshold:
            yield from drain(final=False)
    if pending_rows:
        yield from drain(final=True)


def _stack_leaf(values: list, what: str) -> np.ndarray:
    try:
        return np.stack([np.asarray(v) for v in values])
    except ValueError as exc:
        shapes = sorted({np.shape(v) for v in values}, key=str)
        raise ValueError(f"cannot stack {what} rows of different shapes {shapes[:4]}: {exc}") from None


def _stack(rows: list, what: str) -> Any:
    """Stack per-row values: a tuple means several model inputs, a dict named inputs,
    anything else (array, list of numbers, scalar) one input."""
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack_leaf([r[k] for r in rows], f"{what}[{k!r}]") for k in first}
    if isinstance(first, tuple):
        return [_stack_leaf([r[i] for r in rows], f"{what}[{i}]") for i in range(len(first))]
    return _stack_leaf(rows, what)


def rows_to_chunks(rows: Iterable, chunk_rows: int, labelled: bool = True) -> Iterator[Batch]:
    """Group RDD elements into chunks of ``chunk_rows`` rows, streaming.

    Elements are ``(x, y)`` or ``(x, y, sample_weight)`` when ``labelled``, else ``x``.
    ``x`` may be an array or list of numbers (one input), a tuple of arrays
    (several inputs, in model input order) or a dict keyed by input name.
    """
    buf: list = []

    def flush() -> Batch:
        if not labelled:
            return (_stack(buf, "x"), None, None)
        widths = {len(r) for r in buf}
        if not widths <= {2, 3} or len(widths) != 1:
            raise ValueError(
                f"RDD elements must all be (x, y) or (x, y, sample_weight) tuples, got lengths {sorted(widths)}"
            )
        x = _stack([r[0] for r in buf], "x")
        y = _stack_leaf([r[1] for r in buf], "y")
        w = _stack_leaf([r[2] for r in buf], "sample_weight") if widths == {3} else None
        return (x, y, w)

    for row in rows:
        if labelled and not isinstance(row, (tuple, list)):
            raise ValueError(f"RDD elements must be (x, y) tuples, got {type(row).__name__}")
        buf.append(row)
        if len(buf) >= chunk_rows:
            yield flush()
            buf = []
    if buf:
        yield flush()
