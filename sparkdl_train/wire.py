"""Binary framing of numpy arrays: a JSON header plus raw buffers, never pickle.

Layout of one encoded message (all integers little-endian)::

    magic  b"SDLT"      4 bytes
    version             u8
    header_len          u32
    header              JSON (utf-8): {"meta": {...}, "arrays": [{"dtype", "shape", "nbytes"}, ...]}
    buffers             the raw C-order bytes of each array, back to back

Decoding validates every length against the buffer before touching the data, so a
truncated or forged message raises :class:`FrameError` instead of reading garbage.
Only plain numeric dtypes are accepted (no object arrays).
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any, Sequence

import numpy as np

MAGIC = b"SDLT"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")
MAX_HEADER_BYTES = 16 * 1024 * 1024
_ALLOWED_KINDS = frozenset("biuf")  # bool, signed, unsigned, float
_DTYPE_RE = re.compile(r"\A[<>|=]?[biuf][1-8]\Z")  # those kinds as plain dtype codes, e.g. "<f4", "|b1"


class FrameError(ValueError):
    """A message is malformed, truncated, oversized or uses a forbidden dtype."""


def _check_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject:
        raise FrameError(f"dtype {dtype} is not allowed on the wire (numeric dtypes only)")
    return dtype


def encode(meta: dict[str, Any], arrays: Sequence[np.ndarray]) -> bytes:
    """Encode ``meta`` (JSON-serialisable) and ``arrays`` into one bytes object."""
    parts = encode_parts(meta, arrays)
    return b"".join(bytes(p) if not isinstance(p, bytes) else p for p in parts)


def encode_parts(meta: dict[str, Any], arrays: Sequence[np.ndarray]) -> list:
    """Like :func:`encode` but returns buffers to send without joining (zero-copy)."""
    descs = []
    bufs: list = []
    for a in arrays:
        a = np.asarray(a)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
        dt = _check_dtype(a.dtype)
        descs.append({"dtype": dt.str, "shape": list(a.shape), "nbytes": int(a.nbytes)})
        bufs.append(memoryview(a).cast("B") if a.nbytes else b"")
    header = json.dumps({"meta": meta, "arrays": descs}, separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise FrameError(f"header of {len(header)} bytes exceeds {MAX_HEADER_BYTES}")
    return [_PREFIX.pack(MAGIC, VERSION, len(header)), header, *bufs]


def decode(data: bytes | bytearray | memoryview, copy: bool = False) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Decode a message made by :func:`encode`.

    With ``copy=False`` the arrays are read-only views into ``data``.
    """
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size:
        raise FrameError(f"message of {len(view)} bytes is shorter than its {_PREFIX.size}-byte prefix")
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported wire version {version}")
    if header_len > MAX_HEADER_BYTES:
        raise FrameError(f"header length {header_len} exceeds {MAX_HEADER_BYTES}")
    pos = _PREFIX.size
    if pos + header_len > len(view):
        raise FrameError("message truncated inside its header")
    try:
        header = json.loads(bytes(view[pos : pos + header_len]))
        meta = header["meta"]
        descs = header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise FrameError(f"header is not valid JSON of the expected form: {exc}") from None
    if not isinstance(descs, list) or not isinstance(meta, dict):
        raise FrameError("header has the wrong structure")
    pos += header_len
    arrays = []
    for i, d in enumerate(descs):
        try:
            code = d["dtype"]
            # a strict form first: np.dtype parses free text (comma lists, literal_eval) otherwise
            if not isinstance(code, str) or not _DTYPE_RE.match(code):
                raise FrameError(f"array {i}: dtype {str(code)[:40]!r} is not allowed on the wire (plain numeric dtype codes only)")
            dtype = _check_dtype(np.dtype(code))
            shape = tuple(int(s) for s in d["shape"])
            nbytes = int(d["nbytes"])
        except FrameError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise FrameError(f"array {i} has a bad descriptor: {exc}") from None
        if len(shape) > 32 or any(s < 0 for s in shape) or nbytes != math.prod(shape) * dtype.itemsize:
            raise FrameError(f"array {i}: nbytes {nbytes} does not match shape {shape} and dtype {dtype}")
        if pos + nbytes > len(view):
            raise FrameError(f"message truncated inside array {i}")
        arr = np.frombuffer(view, dtype=dtype, count=nbytes // dtype.itemsize, offset=pos).reshape(shape)
        arrays.append(arr.copy() if copy else arr)
        pos += nbytes
    if pos != len(view):
        raise FrameError(f"{len(view) - pos} trailing bytes after the last array")
    return meta, arrays
