"""Sparse gradients through the ring: the rows a step touched, gathered from every rank (pure numpy).

An embedding table's gradient for one batch is zero outside the rows the batch looked up: 13k of a
CTR table's 1M rows at batch 512. The dense ring sends the whole table every step (2 (N-1)/N of it
per rank); here each rank packs, per table, the ids its batch touched and its (weighted) gradient
rows for them into one block, and a ring *allgather of variable-length blocks* brings every rank's
block to every rank, in rank order. Each rank then adds the blocks into the table's gradient in
that order (the fused step's apply, one compiled scatter-add), so every rank computes the same
bits, and with 2 ranks the same bits as the dense ring (every element is the same pair of floats).
Per rank and step that moves ``(N-1) * k * (4 d + 4)`` bytes instead of ``2 (N-1)/N * 4 V d``:
less whenever ``N k (d + 1) < 2 V d`` (:func:`pays`).

Block layout (every section padded to 8 bytes): one int64 count per table, then per table its ids
(int32, or int64 for tables of 2^31 rows or more) and its rows in the wire's type (float32,
float16, or bfloat16 as the top 16 bits of float32, :mod:`.ring`). Lengths travel first (one
int64 per rank round the ring), then the blocks, received straight into one buffer; a length
beyond what the tables can hold, a count above a table's bound, or an id outside its table fails
the step naming the rank (the peers are authenticated; a bad id is refused before any scatter).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..halfwidth import Codec
from ..table_rows import TableShape
from .transport import RingError


def pays(rows: int, dim: int, ranks: int, touched: int) -> bool:
    """Whether sending ``touched`` rows per rank (allgather, ids included) moves fewer bytes than the
    dense ring's share of a ``rows`` x ``dim`` table: ``N k (d + 1) < 2 V d``."""
    return ranks * min(touched, rows) * (dim + 1) < 2 * rows * dim


def _pad(n: int) -> int:
    return -(-n // 8) * 8


def block_bytes(shapes: Sequence[TableShape], counts: Sequence[int], wire: Codec) -> int:
    """The packed size of blocks holding ``counts`` rows of each table."""
    n = _pad(8 * len(shapes))
    for s, k in zip(shapes, counts):
        n += _pad(k * s.id_dtype.itemsize) + _pad(k * s.dim * wire.dtype.itemsize)
    return n


def pack(shapes: Sequence[TableShape], tables: Sequence[tuple[np.ndarray, np.ndarray]], wire: Codec) -> np.ndarray:
    """One rank's block: ``tables`` are (ids, float32 rows of shape (len(ids), dim)) per table."""
    if len(tables) != len(shapes):
        raise ValueError(f"{len(tables)} tables packed for {len(shapes)} shapes")
    counts = [len(ids) for ids, _ in tables]
    out = np.zeros(block_bytes(shapes, counts, wire), np.uint8)
    out[: 8 * len(counts)].view(np.int64)[:] = counts
    pos = _pad(8 * len(shapes))
    for s, (ids, rows), k in zip(shapes, tables, counts):
        if rows.shape != (k, s.dim):
            raise ValueError(f"rows of shape {rows.shape} for {k} ids of a table of dimension {s.dim}")
        n = k * s.id_dtype.itemsize
        out[pos : pos + n].view(s.id_dtype)[:] = ids
        pos += _pad(n)
        n = k * s.dim * wire.dtype.itemsize
        target = out[pos : pos + n].view(wire.dtype)
        flat = np.ascontiguousarray(rows, np.float32).reshape(-1)
        if wire.narrow:
            wire.encode(flat, target)
        else:
            target[:] = flat
        pos += _pad(n)
    return out


def unpack(shapes: Sequence[TableShape], block: np.ndarray, wire: Codec, origin: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ids, rows in the wire's type, flat)`` per table of a block from rank ``origin``; views into ``block``."""
    head = _pad(8 * len(shapes))
    if block.nbytes < head:
        raise RingError(f"a sparse block of {block.nbytes} bytes from rank {origin} lacks its header")
    counts = block[: 8 * len(shapes)].view(np.int64)
    if (counts < 0).any() or any(int(k) > s.limit for k, s in zip(counts, shapes)):
        raise RingError(f"rank {origin} sent row counts {counts.tolist()} for tables of at most {[s.limit for s in shapes]} "
                        "rows a step")
    if block_bytes(shapes, [int(k) for k in counts], wire) != block.nbytes:
        raise RingError(f"rank {origin} sent a sparse block of {block.nbytes} bytes for row counts {counts.tolist()}")
    out, pos = [], head
    for s, k in zip(shapes, counts):
        k = int(k)
        n = k * s.id_dtype.itemsize
        ids = block[pos : pos + n].view(s.id_dtype)
        if k and (int(ids.min()) < 0 or int(ids.max()) >= s.rows):
            bad = ids[(ids < 0) | (ids >= s.rows)]
            raise RingError(f"rank {origin} sent row id {int(bad[0])} for a table of {s.rows} rows")
        pos += _pad(n)
        n = k * s.dim * wire.dtype.itemsize
        out.append((ids, block[pos : pos + n].view(wire.dtype)))
        pos += _pad(n)
    return out


def allgather_blocks(block: np.ndarray, link: Any, rank: int, size: int, limit: int) -> tuple[np.ndarray, list[int]]:
    """Every rank's ``block`` (bytes) on every rank: one buffer holding them in rank order, and the
    ``size + 1`` offsets that cut it. ``limit``: the most bytes a rank's block may hold."""
    lengths = np.zeros(size, np.int64)
    lengths[rank] = block.nbytes
    steps = [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]  # send the block just received
    for send_i, recv_i in steps:
        link.exchange(memoryview(lengths[send_i : send_i + 1]).cast("B"), memoryview(lengths[recv_i : recv_i + 1]).cast("B"))
        got = int(lengths[recv_i])
        if not 0 <= got <= limit:
            raise RingError(f"rank {recv_i} announced a sparse block of {got} bytes; at most {limit} fit its tables")
    offsets = [0, *np.cumsum(lengths).tolist()]
    out = np.empty(offsets[-1], np.uint8)
    out[offsets[rank] : offsets[rank + 1]] = block
    for send_i, recv_i in steps:
        link.exchange(memoryview(out[offsets[send_i] : offsets[send_i + 1]]),
                      memoryview(out[offsets[recv_i] : offsets[recv_i + 1]]))
    return out, offsets


def exchange(shapes: Sequence[TableShape], tables: Sequence[tuple[np.ndarray, np.ndarray]], link: Any, rank: int,
             size: int, wire_dtype: Any = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every rank's touched rows of every table, on every rank: per table ``(ids, rows)``, the ranks'
    ids concatenated in rank order (repeats across ranks kept) and their float32 rows (as the wire
    carried them), ready to be added into the table's gradient in that order."""
    wire = Codec(np.dtype(np.float32), wire_dtype)
    if link is None or size == 1:  # nothing travels, nothing is rounded (as the dense ring of one rank)
        return [(np.asarray(ids, s.id_dtype), np.asarray(rows, np.float32).reshape(-1, s.dim)) for s, (ids, rows) in zip(shapes, tables)]
    mine = pack(shapes, tables, wire)
    limit = block_bytes(shapes, [s.limit for s in shapes], wire)
    gathered, offsets = allgather_blocks(mine, link, rank, size, limit)
    blocks = [unpack(shapes, gathered[offsets[r] : offsets[r + 1]], wire, r) for r in range(size)]
    out = []
    for t, s in enumerate(shapes):
        ids = np.concatenate([b[t][0] for b in blocks])
        rows = _widen(np.concatenate([b[t][1] for b in blocks]), wire, s)
        out.append((ids, rows))
    return out


def _widen(rows: np.ndarray, wire: Codec, s: TableShape) -> np.ndarray:
    if not wire.narrow:
        return rows.reshape(-1, s.dim)
    out = np.empty(rows.size, np.float32)
    wire.store(out, rows)
    return out.reshape(-1, s.dim)


def bytes_per_rank(shapes: Sequence[TableShape], counts: Sequence[Sequence[int]], wire_dtype: Any = None) -> int:
    """What rank 0 receives in :func:`exchange` when rank ``r`` touched ``counts[r][t]`` rows of table ``t``."""
    wire = Codec(np.dtype(np.float32), wire_dtype)
    size = len(counts)
    if size == 1:
        return 0
    return 8 * (size - 1) + sum(block_bytes(shapes, c, wire) for c in counts) - block_bytes(shapes, counts[0], wire)
