"""Layouts both backends share (pure numpy): the dense weights of a parameter-server push as one
flat vector, and the fused allreduce step's gradient vector."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class FlatLayout:
    """``shapes``, ``sizes`` and ``dtype`` of the dense weights, set by the subclass."""

    shapes: list[tuple[int, ...]]
    sizes: list[int]
    dtype: np.dtype

    def flat_view(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The dense weights as one flat vector (in the order of the model's weights): a view when
        they lie back to back in one buffer (a reply's arrays do, in the receive buffer: valid
        until the next request), else a copy."""
        arrays = [np.asarray(a) for a in arrays]
        total = sum(self.sizes)
        if not arrays:
            return np.zeros(0, self.dtype)
        first = arrays[0]
        start = first.__array_interface__["data"][0]
        pos = start
        adjacent = True
        for a, n in zip(arrays, self.sizes):
            if a.dtype != self.dtype or a.size != n or not a.flags.c_contiguous or a.__array_interface__["data"][0] != pos:
                adjacent = False
                break
            pos += a.nbytes
        base: Any = first
        while isinstance(base, np.ndarray) and base.base is not None:  # reshaped views of frombuffer(memoryview)
            base = base.base
        if adjacent and isinstance(base, memoryview) and base.contiguous:
            origin = np.frombuffer(base, np.uint8).__array_interface__["data"][0]
            if origin <= start and start - origin + total * self.dtype.itemsize <= base.nbytes:
                return np.frombuffer(base, self.dtype, count=total, offset=start - origin)
        return np.concatenate([a.reshape(-1) for a in arrays]).astype(self.dtype, copy=False)

    def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views of ``flat`` shaped as the dense weights."""
        out, pos = [], 0
        for shape, n in zip(self.shapes, self.sizes):
            out.append(flat[pos:pos + n].reshape(shape))
            pos += n
        return out


def first_input(x: Any) -> Any:
    """The first array of a batch's features (its row count is the batch's)."""
    import keras

    return next(i for i in keras.tree.flatten(x) if i is not None)


class FusedLayout:
    """The fused step's vector: every trainable weight's gradient flattened, in the model's order,
    then the rank's weight (``size`` floats). ``sparse``: ``(position in model.weights, the most rows
    one batch looks up)`` of each embedding table whose gradient leaves by rows instead
    (``allreduce.sparseGradients``): they are not in the vector; ``tables`` gives their shapes
    (:class:`sparkdl_train.table_rows.TableShape`)."""

    def __init__(self, model: Any, batch_size: int, sparse: Sequence[tuple[int, int]] = ()):
        from ..table_rows import TableShape

        most = [int(m) for _, m in sparse]
        sparse = [int(i) for i, _ in sparse]
        self.model = model
        self.trainables = list(model.trainable_variables)
        if not self.trainables:
            raise ValueError(f"model {model.name!r} has no trainable weights")
        weights = list(model.weights)
        # positions in trainables: the tables (in model.weights' order), and the vector's weights
        position = {id(v): i for i, v in enumerate(self.trainables)}
        self.table_at = [position.get(id(weights[i])) for i in sparse]
        taken = set(self.table_at)
        if None in taken or len(taken) != len(sparse):
            raise ValueError(f"sparse tables {list(sparse)} are not distinct trainable weights of model {model.name!r}")
        self.dense_at = [i for i in range(len(self.trainables)) if i not in taken]
        self.variables = [self.trainables[i] for i in self.dense_at]
        self.shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(self.sizes) + 1
        self.tables = []
        for i, m in zip(self.table_at, most):
            shape = tuple(int(d) for d in self.trainables[i].shape)
            if len(shape) != 2:
                raise ValueError(f"sparse table {self.trainables[i].path!r} has shape {shape}, not (rows, dim)")
            self.tables.append(TableShape(*shape, most=m))
        self.batch_size = float(batch_size)
        # the last gradient call's (ids, weighted rows) per sparse table
        self.touched: list[tuple[np.ndarray, np.ndarray]] = self.untouched()

    def untouched(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """No rows of any table (a rank out of data)."""
        return [(np.zeros(0, t.id_dtype), np.zeros((0, t.dim), np.float32)) for t in self.tables]

    def check_tables(self, tables: Sequence[Any]) -> None:
        """``apply``'s sparse tables: one ``(ids, rows)`` per table of this step."""
        if len(tables) != len(self.tables):
            raise ValueError(f"{len(tables)} sparse tables handed to a step that has {len(self.tables)}")

    def buckets(self, bucket_bytes: int) -> list[tuple[int, int, int, int]]:
        """The vector cut for overlap (``allreduce.bucketBytes``): buckets of whole weights, taken from
        the last weight backwards (the order in which the backward pass produces gradients), each
        closed once it holds ``bucket_bytes`` of float32 (a larger weight is a bucket of its own).
        Bucket 0 also holds the rank's weight, the vector's last float. Returns ``(first weight, end
        weight, lo, hi)`` per bucket, ``lo:hi`` the bucket's slice of the vector; the slices tile it."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        offsets = [0]
        for n in self.sizes:
            offsets.append(offsets[-1] + n)
        out: list[tuple[int, int, int, int]] = []
        end = len(self.sizes)
        i = end
        while i > 0:
            i -= 1
            if (offsets[end] - offsets[i]) * 4 >= bucket_bytes or i == 0:
                hi = self.size if not out else offsets[end]
                out.append((i, end, offsets[i], hi))
                end = i
        return out
