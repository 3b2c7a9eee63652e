"""An RDD's chunks as plain bytes: what a fit of several epochs keeps of an RDD of rows (``data.cacheRdd``).

An RDD of ``(x, y)`` rows costs its reader one unpickled Python object per array per row: on a
plain MLP's 32 floats, about as long as the training steps of the epoch. A fit of several epochs
reads the RDD once, in a job of its own before the first epoch, into chunks of the rows the
epochs' tasks would have grouped (the same ``chunk_rows``, so every batch is the same), encodes
each chunk as one ``bytes`` value and persists that RDD (``MEMORY_AND_DISK``); every epoch then
reads the chunks. Spark keeps the blocks where they were made, moves them if a task runs
elsewhere, and recomputes a lost one from the RDD's lineage (reading the rows again); the fit
unpersists them when it ends.

The encoding is numpy's raw buffers behind a JSON header (no pickle: a block may come from
another executor): the chunk's structure (a batch's ``x`` an array, a list/tuple or a dict of
them; ``y`` and the sample weights an array, a structure or none) and each leaf's dtype, shape
and length. An object column of strings (or bytes) travels as numpy's fixed-width strings and comes back as objects.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from ..trees import Batch

MAGIC = b"SDTC\x01"
_HEADER = struct.Struct(">I")  # the JSON header's length


class ChunkEncodingError(ValueError):
    """A chunk holds something with no plain numpy form (a column of mixed Python objects)."""


class _Strings(np.ndarray):
    """An object column of strings as numpy's fixed-width strings, marked to come back as objects."""

    _sdt_object = True


def _plain(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == object:
        values = a.ravel().tolist()
        for kind in (str, bytes):
            if all(isinstance(v, kind) for v in values):
                return np.array(values, dtype=kind).reshape(a.shape).view(_Strings)
        kinds = sorted({type(v).__name__ for v in values})
        raise ChunkEncodingError(f"a column of Python objects ({', '.join(kinds[:4])}) has no plain array form")
    return np.ascontiguousarray(a)


def _layout(s: Any, leaves: list[np.ndarray]) -> Any:
    """The structure of ``s`` as JSON (leaves appended to ``leaves`` in order)."""
    if s is None:
        return None
    if isinstance(s, dict):
        return {"dict": [[str(k), _layout(v, leaves)] for k, v in s.items()]}
    if isinstance(s, (list, tuple)):
        return {"list" if isinstance(s, list) else "tuple": [_layout(v, leaves) for v in s]}
    leaves.append(_plain(s))
    return len(leaves) - 1


def encode(chunk: Batch) -> bytes:
    """``chunk`` (``(x, y, sample_weight)``) as one bytes value: :func:`decode` gives it back equal, leaf for leaf."""
    leaves: list[np.ndarray] = []
    layout = _layout(tuple(chunk), leaves)
    objects = [i for i, a in enumerate(leaves) if getattr(a, "_sdt_object", False)]
    meta = {"layout": layout, "leaves": [[a.dtype.str, list(a.shape), a.nbytes] for a in leaves], "objects": objects}
    head = json.dumps(meta, separators=(",", ":")).encode()
    return b"".join([MAGIC, _HEADER.pack(len(head)), head, *(a.tobytes() for a in leaves)])


def _build(layout: Any, leaves: list[np.ndarray]) -> Any:
    if layout is None:
        return None
    if isinstance(layout, int):
        return leaves[layout]
    (kind, items), = layout.items()
    if kind == "dict":
        return {k: _build(v, leaves) for k, v in items}
    values = [_build(v, leaves) for v in items]
    return values if kind == "list" else tuple(values)


def decode(blob: bytes) -> Batch:
    """The chunk :func:`encode` made (each leaf a writable array of its own)."""
    view = memoryview(blob)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a cached chunk of sparkdl_train's (wrong magic)")
    at = len(MAGIC) + _HEADER.size
    (size,) = _HEADER.unpack(view[len(MAGIC):at])
    meta = json.loads(bytes(view[at:at + size]))
    at += size
    leaves = []
    for dtype, shape, nbytes in meta["leaves"]:
        if at + nbytes > len(view):
            raise ValueError("a cached chunk is shorter than its header says")
        kind = np.dtype(dtype)
        a = np.frombuffer(view[at:at + nbytes], dtype=kind).reshape(shape).copy() if nbytes else np.empty(shape, kind)
        leaves.append(a)
        at += nbytes
    if at != len(view):
        raise ValueError("a cached chunk is longer than its header says")
    for i in meta["objects"]:
        leaves[i] = leaves[i].astype(object)
    return _build(meta["layout"], leaves)
