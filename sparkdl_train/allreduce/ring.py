"""Ring collectives (pure: numpy buffers in, a :class:`Link` for the bytes).

Bandwidth-optimal ring allreduce (Patarasuk & Yuan; the schedule Horovod and
NCCL use): the buffer is cut into ``size`` segments; in ``size - 1``
*reduce-scatter* steps every rank sends one segment to the next rank and adds
the segment it receives from the previous rank into its own copy, so that rank
``r`` ends up owning the full sum of segment ``(r + 1) % size``; in ``size - 1``
*allgather* steps the owned sums travel round the ring. Each rank sends and
receives ``2 (size - 1) / size`` of the buffer, independently of ``size``.

Every segment's sum is computed once, by one chain of additions, and then
copied, so all ranks end with bitwise identical buffers. With a narrower wire
type (``wire_dtype=float16`` or :data:`BF16`, "compression") partial sums are
still added in the buffer's own precision (float32); only the bytes on the
wire are narrowed, and the owner rounds its finished segment the same way so
that ranks stay identical. bfloat16 keeps float32's exponent (gradients too
large for float16's 65504 stay finite) with 8 bits of mantissa; numpy has no
such type, so it travels as the top 16 bits of each float32, rounded to
nearest even (:mod:`sparkdl_train.halfwidth`).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from ..halfwidth import Codec, scratch

DEFAULT_CHUNK_BYTES = 1 << 20


class Link(Protocol):
    """One rank's connections in a ring: to the next rank and from the previous one."""

    def exchange(
        self,
        send: memoryview,
        recv: memoryview,
        on_chunk: Callable[[int, int], None] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        """Send ``send`` to the next rank while receiving ``len(recv)`` bytes from the previous
        one. ``on_chunk(lo, hi)`` is called for each received piece of ``chunk_bytes`` (the
        last one may be shorter), in order, while the rest is still arriving."""

    def send(self, data: memoryview) -> None: ...

    def recv_into(self, buf: memoryview) -> None: ...


def segment_bounds(n: int, size: int) -> list[tuple[int, int]]:
    """``size`` contiguous segments of ``n`` elements, sizes differing by at most one."""
    edges = [n * i // size for i in range(size + 1)]
    return list(zip(edges[:-1], edges[1:]))


def reduce_scatter_schedule(rank: int, size: int) -> list[tuple[int, int]]:
    """``(segment sent, segment received)`` per reduce-scatter step."""
    return [((rank - s) % size, (rank - s - 1) % size) for s in range(size - 1)]


def allgather_schedule(rank: int, size: int) -> list[tuple[int, int]]:
    """``(segment sent, segment received)`` per allgather step."""
    return [((rank - s + 1) % size, (rank - s) % size) for s in range(size - 1)]


def owned_segment(rank: int, size: int) -> int:
    """The segment whose full sum ``rank`` holds after reduce-scatter."""
    return (rank + 1) % size


def bytes_per_rank(nbytes: int, size: int) -> int:
    """Bytes each rank sends (and receives) in one allreduce of ``nbytes``: 2 (N-1)/N * M (rounded per segment)."""
    if size == 1:
        return 0
    return 2 * (size - 1) * -(-nbytes // size)


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a).cast("B")


def allreduce_sum(
    buf: np.ndarray,
    link: Link,
    rank: int,
    size: int,
    *,
    wire_dtype: np.dtype | type | str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """Sum ``buf`` (1-D, contiguous, float) across the ring, in place; returns ``buf``.
    ``wire_dtype``: what travels (``None``: the buffer's type; ``np.float16``; :data:`BF16`)."""
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError("allreduce buffers must be 1-D and contiguous")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} out of range for size {size}")
    if size == 1 or buf.size == 0:
        return buf
    fmt = Codec(buf.dtype, wire_dtype)
    wire, compress = fmt.dtype, fmt.narrow
    bounds = segment_bounds(buf.size, size)
    longest = max(hi - lo for lo, hi in bounds)
    incoming = scratch(longest, wire, 0)
    outgoing = scratch(longest, wire, 1) if compress else None
    step = max(wire.itemsize, chunk_bytes - chunk_bytes % wire.itemsize)

    def seg(i: int) -> np.ndarray:
        lo, hi = bounds[i]
        return buf[lo:hi]

    def wire_view(a: np.ndarray) -> memoryview:
        if not compress:
            return _bytes(a)
        return _bytes(fmt.encode(a, outgoing[: a.size]))

    for send_i, recv_i in reduce_scatter_schedule(rank, size):
        target = seg(recv_i)
        got = incoming[: target.size]
        item = wire.itemsize

        def add(lo: int, hi: int, target=target, got=got) -> None:
            a, b = lo // item, hi // item
            fmt.add(target[a:b], got[a:b])

        link.exchange(wire_view(seg(send_i)), _bytes(got), add, step)

    if compress:  # the owner keeps exactly what the others will receive
        fmt.round(seg(owned_segment(rank, size)))

    for send_i, recv_i in allgather_schedule(rank, size):
        target = seg(recv_i)
        if compress:
            got = incoming[: target.size]
            link.exchange(wire_view(seg(send_i)), _bytes(got))
            fmt.store(target, got)
        else:
            link.exchange(_bytes(seg(send_i)), _bytes(target))
    return buf


def broadcast(buf: np.ndarray, link: Link, rank: int, size: int, root: int = 0, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> np.ndarray:
    """Copy ``root``'s ``buf`` to every rank along the ring, pipelined in chunks; in place."""
    if size == 1:
        return buf
    if not buf.flags.c_contiguous:
        raise ValueError("broadcast buffers must be contiguous")
    view = _bytes(buf)
    pos = (rank - root) % size
    for lo in range(0, max(len(view), 1), chunk_bytes):
        part = view[lo : lo + chunk_bytes]
        if pos > 0:
            link.recv_into(part)
        if pos < size - 1:
            link.send(part)
    return buf
