"""Half-width floats for the wire (pure numpy): float16 by numpy's casts, bfloat16 as bits.

The ring (:mod:`sparkdl_train.allreduce.ring`, :mod:`sparkdl_train.allreduce.row_gather`) and the
parameter server (:mod:`sparkdl_train.ps.narrow`) both narrow what they send through :class:`Codec`.
bfloat16 keeps float32's exponent (values too large for float16's 65504 stay finite) with 8 bits of
mantissa; numpy has no such type, so it travels as the top 16 bits of each float32, rounded to
nearest even (:func:`to_bf16`, :func:`from_bf16`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

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


class Codec:
    """How values travel: the buffer's own type, float16 (numpy casts), or bfloat16 (bits).

    ``Codec(buffer_dtype, wire_dtype)``: ``wire_dtype`` ``None`` (the buffer's type), ``np.float16`` or
    :data:`BF16`. Sums are kept in the buffer's precision; only what travels is narrowed."""

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
