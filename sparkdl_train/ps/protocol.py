"""Messages of the parameter server (pure; frames and the handshake are :mod:`sparkdl_train.net`'s).

After the handshake (arrays in model order)::

    PULL    {want: [i, ...]}                    ids of the rows wanted from each listed table
    PUSH    {base_version, samples, rows: [i, ...], want: [i, ...]}
            one delta per weight, except that each table listed in ``rows`` sends
            two arrays instead (its touched ids, strictly increasing, and their
            delta rows); then the wanted ids
    WEIGHTS {version, rows: [i, ...]}        one array per weight; each table in
            ``rows`` sends only the rows that were asked for, in the order asked

A PULL or PUSH may add ``wire: "fp16" | "bf16"`` (``ps.compression``, :mod:`.narrow`): its deltas
are in that type, and so is the reply's WEIGHTS.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..net.framing import ProtocolError, frame_bytes
from .narrow import narrow, widen, wire_of
from .state import SparseRows


def push_meta(base_version: int, samples: int, rows: list[int], want: list[int], wire: str | None = None) -> dict[str, Any]:
    meta = {"base_version": base_version, "samples": samples, "rows": rows, "want": want}
    if wire is not None:
        meta["wire"] = wire
    return meta


def dense_exchange_bytes(weights: Sequence[np.ndarray]) -> int:
    """Bytes of one push with every weight whole plus its reply, as framed on the wire."""
    return frame_bytes(push_meta(10**6, 10**4, [], []), weights) + frame_bytes({"version": 10**6, "rows": []}, weights)


def index_list(meta: dict[str, Any], key: str, n: int) -> list[int]:
    got = meta.get(key, [])
    if not isinstance(got, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in got):
        raise ProtocolError(f"'{key}' must be a list of array indices below {n}")
    if len(set(got)) != len(got):
        raise ProtocolError(f"'{key}' lists an array twice")
    return got


def pack_want(want: dict[int, np.ndarray] | None) -> tuple[list[int], list[np.ndarray]]:
    if not want:
        return [], []
    keys = sorted(want)
    return keys, [np.asarray(want[i]) for i in keys]


def pack_update(delta: Sequence[Any], wire: str | None = None) -> tuple[list[int], list[np.ndarray]]:
    """Flatten a delta (arrays, or :class:`SparseRows` for tables) into frame arrays, its values
    in the ``wire``'s type (ids as they are)."""
    rows: list[int] = []
    arrays: list[np.ndarray] = []
    for i, d in enumerate(delta):
        if isinstance(d, SparseRows):
            rows.append(i)
            arrays.extend((d.ids, narrow(d.rows, wire)))
        else:
            arrays.append(narrow(d, wire))
    return rows, arrays


def unpack_update(meta: dict[str, Any], arrays: list[np.ndarray], n: int) -> tuple[list[Any], dict[int, np.ndarray] | None]:
    """Inverse of :func:`pack_update` plus the wanted rows (shape checks are the state's)."""
    rows = set(index_list(meta, "rows", n))
    want_keys = index_list(meta, "want", n)
    expected = n + len(rows) + len(want_keys)
    if len(arrays) != expected:
        raise ProtocolError(f"update carries {len(arrays)} arrays, its header announces {expected}")
    wire = wire_of(meta)
    delta: list[Any] = []
    pos = 0
    for i in range(n):  # half-width values widened into float32 here: the server adds float32 only
        if i in rows:
            delta.append(SparseRows(arrays[pos], widen(arrays[pos + 1], wire, f"the rows of table {i}")))
            pos += 2
        else:
            delta.append(widen(arrays[pos], wire, f"the delta of array {i}"))
            pos += 1
    return delta, unpack_want(want_keys, arrays[pos:])


def unpack_want(keys: list[int], arrays: list[np.ndarray]) -> dict[int, np.ndarray] | None:
    if len(arrays) != len(keys):
        raise ProtocolError(f"{len(arrays)} id arrays for {len(keys)} wanted tables")
    return dict(zip(keys, arrays)) if keys else None
