"""Half-width floats on the parameter server's wire (``ps.compression``; pure numpy).

A worker that asks for ``fp16`` or ``bf16`` sends its deltas (dense arrays and table rows) in that
type and gets the server's weights back in it: half the bytes each way. The server keeps its
weights in their own type (float32) and adds a delta widened exactly; a worker widens a reply back
exactly, so its copy of the weights is the server's rounded to the wire's type, and its next delta is
taken against that copy. ``bf16`` travels as the top 16 bits of float32 (``uint16`` arrays, rounded to
nearest even as :func:`sparkdl_train.halfwidth.to_bf16`); ``fp16`` as numpy's float16. Ids and
other integer arrays travel as they are.
"""

from __future__ import annotations

import numpy as np

from ..halfwidth import BF16, Codec
from ..net.framing import ProtocolError

WIRES = ("fp16", "bf16")


def _wire(wire: str, dtype: np.dtype) -> Codec:
    """The half-width codec the ring uses too, for ``wire``, from and into arrays of ``dtype`` (bfloat16: float32)."""
    return Codec(np.dtype(np.float32) if wire == "bf16" else np.dtype(dtype), BF16 if wire == "bf16" else np.float16)


def wire_of(meta: dict) -> str | None:
    """The wire type a request asks for (None: the weights' own)."""
    wire = meta.get("wire")
    if wire is not None and wire not in WIRES:
        raise ProtocolError(f"'wire' must be one of {list(WIRES)}, got {wire!r}")
    return wire


def narrow(a: np.ndarray, wire: str | None) -> np.ndarray:
    """A floating-point ``a`` in the wire's type (a new array); anything else as it is."""
    a = np.asarray(a)
    if wire is None or a.dtype.kind != "f":
        return a
    w = _wire(wire, a.dtype)
    flat = np.ascontiguousarray(a, np.float32 if w.bf16 else a.dtype).reshape(-1)  # the ring's conversions take flat arrays
    return w.encode(flat, np.empty(flat.size, w.dtype)).reshape(a.shape)


def widen(a: np.ndarray, wire: str | None, what: str) -> np.ndarray:
    """``a`` as sent on ``wire`` back in float32 (exactly: every half-width value is a float32);
    ``a`` of another type than the wire's fails naming ``what``."""
    if wire is None:
        return a
    w = _wire(wire, np.float32)
    if a.dtype != w.dtype:
        raise ProtocolError(f"{what} arrived as {a.dtype} on a {wire!r} wire, expected {w.dtype}")
    out = np.empty(a.size, np.float32)
    w.store(out, np.ascontiguousarray(a).reshape(-1))
    return out.reshape(a.shape)
