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
nearest even (:func:`to_bf16`, :func:`from_bf16`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

import numpy as np

DEFAULT_CHUNK_BYTES = 1 << 20
BF16 = "bfloat16"  # wire_dtype for bfloat16 (float32 buffers only)
_BF16_NAN = 0x7FC0


def to_bf16(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 ``a`` as bfloat16 bits in the uint16 array ``out``: rounded to nearest, ties to even
    (what ``ml_dtypes.bfloat16`` and the accelerators do); NaN stays NaN, overflow becomes inf."""
    u = a.view(np.uint32)
    t = scratch(a.size, np.uint32, 2)
    np.right_shift(u, 16, out=t)
    np.bitwise_and(t, 1, out=t)
    t += 0x7FFF
    t += u  # wraps only for NaNs with the sign bit set, fixed below
    t >>= 16
    out[...] = t
    nan = np.isnan(a)
    if nan.any():
        out[nan] = _BF16_NAN
    return out


def from_bf16(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) widened into the float32 array ``out`` (exact)."""
    o = out.view(np.uint32)
    o[...] = bits
    o <<= 16
    return out


class _Wire:
    """How values travel: the buffer's own type, float16 (numpy casts), or bfloat16 (bits)."""

    def __init__(self, buf_dtype: np.dtype, wire_dtype: Any):
        self.bf16 = isinstance(wire_dtype, str) and wire_dtype.lower() in (BF16, "bf16")
        if self.bf16 and buf_dtype != np.float32:
            raise ValueError(f"bfloat16 on the wire needs a float32 buffer, got {buf_dtype}")
        self.dtype = np.dtype(np.uint16) if self.bf16 else np.dtype(wire_dtype) if wire_dtype is not None else buf_dtype
        self.narrow = self.bf16 or self.dtype != buf_dtype

    def encode(self, a: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.bf16:
            return to_bf16(a, out)
        out[...] = a
        return out

    def add(self, target: np.ndarray, got: np.ndarray) -> None:
        """``target += got`` (``got`` in wire form), in the target's precision."""
        if self.bf16:
            got = from_bf16(got, scratch(got.size, np.float32, 3))
        np.add(target, got, out=target, casting="unsafe")

    def store(self, target: np.ndarray, got: np.ndarray) -> None:
        if self.bf16:
            from_bf16(got, target)
        else:
            target[...] = got

    def round(self, a: np.ndarray) -> None:
        """``a`` rounded in place to what the wire carries (the owner's copy of its segment)."""
        if self.bf16:
            from_bf16(to_bf16(a, scratch(a.size, np.uint16, 4)), a)
        else:
            a[...] = a.astype(self.dtype)


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


_scratch = threading.local()


def scratch(n: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
    """A reusable per-thread work buffer of ``n`` elements (fresh pages cost more than loopback TCP)."""
    nbytes = n * np.dtype(dtype).itemsize
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < nbytes:
        buf = bufs[slot] = np.empty(max(nbytes, 1), np.uint8)
    return buf[:nbytes].view(dtype)


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
    fmt = _Wire(buf.dtype, wire_dtype)
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
