"""The parameter server's numeric core: weights, versions and the update rules.

No sockets here, so every rule is unit-tested directly. Updates are weight
*deltas* (``w_local - w_pulled`` after some local steps with the worker's own
Keras optimizer):

* ``synchronous``: a round completes when every worker still in the epoch has
  pushed; the server applies the sample-weighted **mean** of the round's deltas
  (model averaging every N steps) and releases all of them with the new weights.
* ``asynchronous``: each delta is applied on arrival under a lock (ASGD /
  GEO-style) into a new snapshot, so a pull never sees a half-applied update.
  Snapshots are reference-counted while being sent and their buffers recycled,
  so steady-state updates allocate no memory. Optional bounded staleness (SSP): a worker more than
  ``staleness_bound`` pushes ahead of the slowest worker waits.
* ``hogwild``: each dense delta is added in place with no lock; pulls may observe a
  partly applied update (lock-free, Hogwild!-style). A table's rows are added under their
  range's lock (below): Hogwild! assumes component-wise atomic additions, and a row's
  gather-add-put without one loses a concurrent push's whole addition to that row, which
  small, hot tables meet on nearly every push.

Sparse tables (embedding matrices named by ``sparse``) live outside the
snapshots, in one array each that is updated in place: a push carries only the
rows its worker touched (:class:`SparseRows`) and a reply carries only the rows
the worker asked for, gathered (copied) under the same lock that orders the
updates. A synchronous round adds the sample-weighted sum of every worker's
rows divided by the round's total samples: exactly the dense mean with zeros
for the rows a worker did not touch.

With ``shards > 1`` (``ps.tableShards``) every table's rows are cut into that many ranges, range
``s`` of all tables under lock ``s``: an asynchronous push applies its dense delta and takes its
version under the state's lock, then adds its rows and gathers its reply's rows range by range
under each range's lock, so pushes copy rows on several cores at once. A reply is consistent
within each range; a synchronous round still adds its rows with every range's lock held.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import ServerStopped
from ..merge import WeightedMean
from . import rows as table_rows
from .narrow import narrow

MODES = ("synchronous", "asynchronous", "hogwild")


class RoundTimeout(TimeoutError):
    """A synchronous round or a staleness wait outlived its timeout."""


def straggler(last: dict[int, int], held: dict[int, float], rounds: int, seconds: float,
              share: float = 0.75, hold: float = 0.25, min_rounds: int = 4) -> tuple[int, int, float] | None:
    """The worker that held a pass's synchronous rounds, if one did: ``(worker, rounds it came last
    in, seconds the others waited for it)`` when it came last in at least ``share`` of at least
    ``min_rounds`` rounds and the waits add up to ``hold`` of ``seconds``, the time the pass's rounds
    took (:attr:`PSStats.round_span_seconds`: from its first push to its last round's end, so neither the
    job's start nor the first step's trace dilutes the waits); else None.
    ``last`` and ``held`` are the pass's own counts (:attr:`PSStats.last_in_round`, ``held_seconds``)."""
    if rounds < min_rounds or not last:
        return None
    worker = max(last, key=lambda w: (last[w], held.get(w, 0.0)))
    waited = held.get(worker, 0.0)
    if last[worker] >= share * rounds and waited >= hold * seconds:
        return worker, last[worker], waited
    return None


@dataclass
class PSStats:
    updates: int = 0
    rounds: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    staleness_waits: int = 0
    wait_seconds: float = 0.0
    rejected_connections: int = 0
    concurrency_sum: int = 0  # workers active when each update arrived, summed
    solo_updates: int = 0  # updates that arrived while their worker was the only one active
    worker_steps: dict[int, int] = field(default_factory=dict)
    worker_samples: dict[int, int] = field(default_factory=dict)
    # synchronous rounds: how often each worker's push was the round's last, and the seconds the round's
    # first push then waited for it (a straggler: a slow host, link or partition holds every round)
    last_in_round: dict[int, int] = field(default_factory=dict)
    held_seconds: dict[int, float] = field(default_factory=dict)
    # the seconds the synchronous rounds took, each epoch from its first push to its last round's end
    round_span_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_bytes(self, received: int = 0, sent: int = 0) -> None:
        with self._lock:
            self.bytes_in += received
            self.bytes_out += sent

    def reject(self) -> None:
        with self._lock:
            self.rejected_connections += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "rounds": self.rounds,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "mean_staleness": self.staleness_sum / self.updates if self.updates else 0.0,
            "max_staleness": self.staleness_max,
            "staleness_waits": self.staleness_waits,
            "wait_seconds": round(self.wait_seconds, 4),
            "rejected_connections": self.rejected_connections,
            "mean_concurrency": self.concurrency_sum / self.updates if self.updates else 0.0,
            "solo_updates": self.solo_updates,
            "worker_steps": dict(sorted(self.worker_steps.items())),
            "worker_samples": dict(sorted(self.worker_samples.items())),
            "last_in_round": dict(sorted(self.last_in_round.items())),
            "held_seconds": {k: round(v, 3) for k, v in sorted(self.held_seconds.items())},
            "round_span_seconds": round(self.round_span_seconds, 4),
        }


@dataclass(frozen=True)
class SparseRows:
    """A delta for some rows of a table: ``table[ids] += rows``; ``ids`` strictly increasing."""

    ids: np.ndarray
    rows: np.ndarray


class Snapshot:
    """One version of the dense weights. ``users`` counts senders still reading it."""

    __slots__ = ("version", "arrays", "users", "wired")

    def __init__(self, version: int, arrays: list[np.ndarray]):
        self.version = version
        self.arrays = arrays
        self.users = 0
        # wire -> (version, the arrays narrowed for it), made by the first reply that needs them; hogwild's
        # one snapshot changes in place, its version with it, so an entry serves its version only
        self.wired: dict[str, tuple[int, list[np.ndarray]]] = {}


class Reply:
    """What to send a worker: the full weight list, dense arrays shared with a
    snapshot (hand the reply back with :meth:`ServerState.release` once sent)
    and table rows copied out for this worker."""

    __slots__ = ("version", "arrays", "snap", "want")

    def __init__(self, version: int, arrays: list[np.ndarray], snap: Snapshot, want: Any = None):
        self.version = version
        self.arrays = arrays
        self.snap = snap
        self.want = want  # sharded tables: the rows still to gather (None: every table whole)

    def on_wire(self, wire: str | None) -> list[np.ndarray]:
        """The arrays to send on ``wire`` (:mod:`.narrow`): the snapshot's dense arrays narrowed once
        per version and wire (a race makes the same copy twice, harmlessly), the rows per reply."""
        if wire is None:
            return self.arrays
        cached = self.snap.wired.get(wire)
        if cached is None or cached[0] != self.version:
            cached = self.snap.wired[wire] = (self.version, [narrow(a, wire) for a in self.snap.arrays])
        shared = cached[1]
        by_id = {id(a): k for k, a in enumerate(self.snap.arrays)}
        return [shared[by_id[id(a)]] if id(a) in by_id else narrow(a, wire) for a in self.arrays]


_MAX_FREE_BUFFERS = 2


def _check_ids(ids: Any, n_rows: int, what: str, unique: bool) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"{what}: row ids must be a 1-D integer array, got {ids.dtype} of shape {ids.shape}")
    if len(ids):
        if int(ids.min()) < 0 or int(ids.max()) >= n_rows:
            raise ValueError(f"{what}: row ids must lie in [0, {n_rows}), got [{int(ids.min())}, {int(ids.max())}]")
        if unique and len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise ValueError(f"{what}: row ids must be strictly increasing (unique)")
    if len(ids) > n_rows:
        raise ValueError(f"{what}: {len(ids)} row ids for a table of {n_rows} rows")
    return ids


def _sum_rows(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Sum rows with equal ids over several ``(ids, rows)`` parts: ``(unique ids, summed rows)``."""
    ids = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    order = np.argsort(ids, kind="stable")
    ids, rows = ids[order], rows[order]
    if len(ids) == 0:
        return ids, rows
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    return ids[starts], np.add.reduceat(rows, starts, axis=0)


class ServerState:
    def __init__(
        self,
        weights: Sequence[np.ndarray],
        mode: str,
        staleness_bound: int | None = None,
        round_timeout: float = 600.0,
        join_timeout: float = 30.0,
        sparse: Sequence[int] = (),
        shards: int = 1,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown parameter-server mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.staleness_bound = staleness_bound
        self.round_timeout = round_timeout
        self.join_timeout = join_timeout
        arrays = [np.array(w, copy=True) for w in weights]
        for i, w in enumerate(arrays):
            if w.dtype.kind != "f":  # sparkdl_train.roles: integer and boolean state is never merged by deltas
                raise ValueError(f"array {i} has dtype {w.dtype}: the parameter server holds floating-point arrays only "
                                 "(pass the model's exchanged weights, sparkdl_train.model_io.exchanged_positions)")
        self.shapes = [w.shape for w in arrays]
        self.dtypes = [w.dtype for w in arrays]
        self.nbytes = sum(w.nbytes for w in arrays)
        for i in sparse:
            if not 0 <= i < len(arrays) or arrays[i].ndim < 1 or arrays[i].dtype.kind != "f":
                raise ValueError(f"sparse table {i} must index a floating-point array with rows")
        self.sparse = tuple(sorted(set(sparse)))
        self._tables = {i: arrays[i] for i in self.sparse}  # live, updated in place
        self._row_views = {i: table_rows.row_view(t) for i, t in self._tables.items()}
        self._dense = [i for i in range(len(arrays)) if i not in self._tables]
        # table shards: every table's rows cut into `shards` ranges, range s of all tables under lock s;
        # row updates and gathers run outside the state's lock, so pushes touching different ranges
        # copy rows on several cores at once (the row copies release the interpreter's lock)
        if int(shards) < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        self.shards = int(shards) if self._tables else 1
        self._shard_locks = [threading.Lock() for _ in range(self.shards)]
        self._bounds = {i: np.linspace(0, t.shape[0], self.shards + 1).astype(np.int64) for i, t in self._tables.items()}
        self._current = Snapshot(0, [arrays[i] for i in self._dense])
        self._free: list[list[np.ndarray]] = []
        self._round_rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._hog_versions = itertools.count(1)
        self._cond = threading.Condition()
        self.stats = PSStats()
        self._expected = 0
        self._joined: set[int] = set()
        self._active: set[int] = set()
        self._clock: dict[int, int] = {}
        self._addresses: dict[int, str] = {}  # each worker's executor address, as its connection came from
        self._join_deadline = 0.0
        self._round = 0
        self._round_acc = WeightedMean()
        self._round_pushed: set[int] = set()
        self._round_began = 0.0  # when the round's first push arrived
        self._span_mark: float | None = None  # the epoch's first push, then its last round's end
        self._failed: str | None = None
        # the first round or staleness wait of the epoch that timed out: every later wait and push of the
        # epoch fails with it at once (a task Spark retries would otherwise push into that round again)
        self._timed_out: str | None = None
        self._waiting = 0  # pushes blocked in a round or by the staleness bound

    def waiting(self) -> int:
        """How many pushes are blocked right now (a synchronous round, the staleness bound)."""
        with self._cond:
            return self._waiting

    def timed_out(self) -> str | None:
        """What timed out in this epoch (its first synchronous round or staleness wait that did), or None:
        the epoch has failed, whatever Spark makes of its tasks' errors."""
        with self._cond:
            return self._timed_out

    # -- epoch and membership ----------------------------------------------------------
    def begin_epoch(self, expected: int) -> None:
        with self._cond:
            self._expected = expected
            self._joined.clear()
            self._active.clear()
            self._clock.clear()
            self._round_pushed.clear()
            self._round_acc = WeightedMean()
            self._round_rows = {}
            self._span_mark = None
            self._join_deadline = time.monotonic() + self.join_timeout
            self._failed = None
            self._timed_out = None

    def join(self, worker: int, address: str | None = None) -> None:
        """``worker`` takes part in the epoch; ``address``: where its connection came from (named by timeouts)."""
        with self._cond:
            if address:
                self._addresses[worker] = address
            self._joined.add(worker)
            self._active.add(worker)
            self._clock.setdefault(worker, 0)
            self._cond.notify_all()

    def leave(self, worker: int) -> None:
        with self._cond:
            if worker not in self._active:
                return
            self._active.discard(worker)
            self._maybe_complete_round()
            self._cond.notify_all()

    def fail(self, reason: str) -> None:
        with self._cond:
            self._failed = reason
            self._cond.notify_all()

    # -- reads -----------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._current.version

    def pull(self, want: dict[int, np.ndarray] | None = None) -> Reply:
        """The current weights (only the ``want`` rows of the tables it names);
        hand the reply back with :meth:`release` once sent."""
        want = self.check_want(want)
        with self._cond:  # in hogwild mode too: updates take no lock, so reads may still see them half applied
            reply = self._reply(want)
        return self._sharded_rows({}, reply)

    def release(self, reply: Reply) -> None:
        with self._cond:
            reply.snap.users -= 1
            self._recycle(reply.snap)

    def snapshot(self) -> list[np.ndarray]:
        """A private copy of the current weights."""
        with self._cond, self._all_shards():
            out: list[Any] = [None] * len(self.shapes)
            for i, w in zip(self._dense, self._current.arrays):
                out[i] = w.copy()
            for i, t in self._tables.items():
                out[i] = t.copy()
            return out

    def assign(self, weights: Sequence[np.ndarray]) -> None:
        """Replace every weight (between epochs: a caller that changed the driver's copy), as a new version."""
        if len(weights) != len(self.shapes):
            raise ValueError(f"assign: {len(weights)} arrays, the server holds {len(self.shapes)}")
        for i, (w, shape) in enumerate(zip(weights, self.shapes)):
            if tuple(np.shape(w)) != tuple(shape):
                raise ValueError(f"assign: array {i} has shape {np.shape(w)}, the server's is {shape}")
        with self._cond, self._all_shards():
            for i, t in self._tables.items():
                t[...] = weights[i]
            old = self._current
            if self.mode == "hogwild":  # its one snapshot's arrays are the live weights: written in place
                for w, i in zip(old.arrays, self._dense):
                    w[...] = weights[i]
                old.version = max(old.version, next(self._hog_versions))
                old.wired.clear()
            else:
                self._current = Snapshot(old.version + 1, [np.array(weights[i], dtype=self.dtypes[i], copy=True) for i in self._dense])
                self._recycle(old)
            self._cond.notify_all()

    @contextlib.contextmanager
    def _all_shards(self):
        """Every shard's lock, in order (after the state's lock, as everywhere)."""
        with contextlib.ExitStack() as stack:
            if self.shards > 1:
                for lock in self._shard_locks:
                    stack.enter_context(lock)
            yield

    def _reply(self, want: dict[int, np.ndarray] | None) -> Reply:
        """Caller holds the lock."""
        snap = self._current
        snap.users += 1
        if not self._tables:
            return Reply(snap.version, snap.arrays, snap)
        arrays: list[Any] = [None] * len(self.shapes)
        for i, w in zip(self._dense, snap.arrays):
            arrays[i] = w
        if self.shards > 1:  # gathered shard by shard once the state's lock is released (_sharded_rows)
            return Reply(snap.version, arrays, snap, want={} if want is None else want)
        for i, t in self._tables.items():
            ids = None if want is None else want.get(i)
            arrays[i] = t.copy() if ids is None else table_rows.gather(t, ids)
        return Reply(snap.version, arrays, snap)

    def _sharded_rows(self, rows: dict[int, SparseRows], reply: Reply) -> Reply:
        """With shards (caller holds no lock): add ``rows`` and gather the reply's rows, one shard at
        a time under its lock, so a push reads its own rows back. Without shards: nothing to do."""
        if self.shards == 1:
            return reply
        # per wanted table: (ids in shard order, the reply's rows, where each range starts and ends in
        # them, the order to put them back in: None when the worker asked in increasing order, as it does)
        wanted: dict[int, tuple[Any, np.ndarray, Any, Any]] = {}
        for i, t in self._tables.items():
            ids = reply.want.get(i)
            if ids is None:
                wanted[i] = (None, np.empty_like(t), self._bounds[i], None)
                continue
            order = None
            if len(ids) > 1 and not bool(np.all(ids[1:] >= ids[:-1])):
                order = np.argsort(ids, kind="stable")
                ids = ids[order]
            wanted[i] = (ids, np.empty((len(ids), *t.shape[1:]), t.dtype), np.searchsorted(ids, self._bounds[i]), order)
        spans = {i: np.searchsorted(r.ids, self._bounds[i]) for i, r in rows.items()}  # ids are sorted
        for s, lock in enumerate(self._shard_locks):
            with lock:
                for i, r in rows.items():
                    a, b = spans[i][s], spans[i][s + 1]
                    if b > a:
                        table_rows.scatter_add(self._tables[i], self._row_views[i], r.ids[a:b], r.rows[a:b])
                for i, (ids, out, cuts, _) in wanted.items():
                    a, b = cuts[s], cuts[s + 1]
                    if b <= a:
                        continue
                    t = self._tables[i]
                    if ids is None:
                        out[a:b] = t[a:b]
                    else:
                        np.take(t, ids[a:b], axis=0, out=out[a:b])
        for i, (_, out, _, order) in wanted.items():
            if order is not None:  # back in the order asked
                back = np.empty_like(out)
                back[order] = out
                out = back
            reply.arrays[i] = out
        reply.want = None
        return reply

    def check_want(self, want: dict[int, np.ndarray] | None) -> dict[int, np.ndarray] | None:
        if want is None:
            return None
        out = {}
        for i, ids in want.items():
            if i not in self._tables:
                raise ValueError(f"rows requested from array {i}, which is not a sparse table")
            out[i] = _check_ids(ids, self.shapes[i][0], f"rows wanted from table {i}", unique=False)
        return out

    # -- snapshots (caller holds the lock) -----------------------------------------------
    def _recycle(self, snap: Snapshot) -> None:
        if snap is not self._current and snap.users == 0 and snap.arrays is not None:
            if len(self._free) < _MAX_FREE_BUFFERS:
                self._free.append(snap.arrays)
            snap.arrays = None

    def _apply(self, update: Sequence[np.ndarray]) -> None:
        """Publish ``current + update`` (dense arrays) as a new snapshot, reusing a free buffer set."""
        old = self._current
        out = self._free.pop() if self._free else [np.empty_like(w) for w in old.arrays]
        for w, u, o in zip(old.arrays, update, out):
            np.add(w, u, out=o, casting="same_kind")
        self._current = Snapshot(old.version + 1, out)
        self._recycle(old)

    # -- updates ---------------------------------------------------------------------
    def check_delta(self, delta: Sequence[Any]) -> tuple[list[np.ndarray], dict[int, SparseRows]]:
        """Validate a delta; split it into the dense arrays and the table rows."""
        if len(delta) != len(self.shapes):
            raise ValueError(f"update has {len(delta)} arrays, the model has {len(self.shapes)}")
        dense: list[np.ndarray] = []
        rows: dict[int, SparseRows] = {}
        for i, (d, s) in enumerate(zip(delta, self.shapes)):
            if isinstance(d, SparseRows):
                if i not in self._tables:
                    raise ValueError(f"update array {i} sends rows, but array {i} is not a sparse table")
                ids = _check_ids(d.ids, s[0], f"update of table {i}", unique=True)
                if d.rows.shape != (len(ids), *s[1:]):
                    raise ValueError(f"update of table {i}: rows have shape {d.rows.shape}, expected {(len(ids), *s[1:])}")
                if d.rows.dtype.kind != "f":
                    raise ValueError(f"update of table {i} has dtype {d.rows.dtype}; deltas must be floating point")
                rows[i] = SparseRows(ids, d.rows)
                continue
            if d.shape != s:
                raise ValueError(f"update array {i} has shape {d.shape}, expected {s}")
            if d.dtype.kind != "f":
                raise ValueError(f"update array {i} has dtype {d.dtype}; deltas must be floating point")
            if i in self._tables:
                rows[i] = SparseRows(np.arange(s[0]), d)  # a whole table sent densely
            else:
                dense.append(d)
        return dense, rows

    def push(
        self, worker: int, base_version: int, delta: Sequence[Any], samples: int, want: dict[int, np.ndarray] | None = None
    ) -> Reply:
        """Apply ``delta`` (arrays, or :class:`SparseRows` for tables) by the mode's rule; returns
        the weights to send back, with only the ``want`` rows of the tables it names (then :meth:`release`)."""
        dense, rows = self.check_delta(delta)
        want = self.check_want(want)
        if self.mode == "synchronous":
            return self._push_sync(worker, dense, rows, samples, want)
        if self.mode == "asynchronous":
            return self._push_async(worker, base_version, dense, rows, samples, want)
        return self._push_hogwild(worker, base_version, dense, rows, samples, want)

    def _add_rows(self, rows: dict[int, SparseRows], locked: bool = True) -> None:
        """``locked``: with every range's lock (a round's rows, under the state's lock: no range is read
        half applied); hogwild adds without any."""
        with self._all_shards() if locked else contextlib.nullcontext():
            for i, r in rows.items():  # ids are unique: no lost additions within one delta
                table_rows.scatter_add(self._tables[i], self._row_views[i], r.ids, r.rows)

    def _count(self, worker: int, samples: int, staleness: int) -> None:
        st = self.stats
        st.updates += 1
        st.staleness_sum += staleness
        st.staleness_max = max(st.staleness_max, staleness)
        active = max(1, len(self._active))
        st.concurrency_sum += active
        st.solo_updates += active == 1
        st.worker_steps[worker] = st.worker_steps.get(worker, 0) + 1
        st.worker_samples[worker] = st.worker_samples.get(worker, 0) + samples

    def _raise_timed_out(self) -> None:
        """Caller holds the lock."""
        if self._timed_out is not None:
            raise RoundTimeout(f"this epoch already failed: {self._timed_out}")

    def _workers(self, workers) -> str:
        return ", ".join(f"worker {w}" + (f" (its executor at {self._addresses[w]})" if w in self._addresses else "")
                         for w in sorted(workers))

    def _wait(self, predicate, what: str, awaited=None) -> None:
        """Caller holds the lock. ``awaited()``: the workers the wait is for, named if it times out. While
        workers of the epoch may still connect (``ps.joinTimeout`` from the epoch's start), the wait
        lasts at least that long: a worker still starting is the join's to wait for, not the round's."""
        deadline = time.monotonic() + self.round_timeout
        if len(self._joined) < self._expected:
            deadline = max(deadline, self._join_deadline)
        self._waiting += 1
        try:
            while not predicate():
                if self._failed:
                    raise ServerStopped(f"parameter server stopped: {self._failed}")
                self._raise_timed_out()
                left = deadline - time.monotonic()
                if left <= 0:
                    late = list(awaited()) if awaited is not None else []  # _workers sorts them
                    self._timed_out = (
                        f"{what} timed out after {self.round_timeout:g} s (spark.sparkdl_train.ps.roundTimeout)"
                        + (f": {self._workers(late)} did not push in time; that host, its link or its executor is down or stuck"
                           if late else ""))
                    self._cond.notify_all()  # the others waiting in the epoch fail with it now
                    raise RoundTimeout(self._timed_out)
                self._cond.wait(min(left, 0.2))
                if self.mode == "synchronous":
                    self._maybe_complete_round()
        finally:
            self._waiting -= 1

    def _push_async(self, worker, base_version, delta, rows, samples, want):
        with self._cond:
            if self.staleness_bound is not None:
                mine = self._clock.get(worker, 0)

                def ready() -> bool:
                    others = [self._clock.get(a, 0) for a in self._active if a != worker]
                    return not others or mine - min(others) <= self.staleness_bound

                if not ready():
                    start = time.monotonic()
                    self.stats.staleness_waits += 1
                    self._wait(ready, f"worker {worker} waiting for slower workers (staleness bound {self.staleness_bound})",
                               lambda: [a for a in self._active if a != worker and mine - self._clock.get(a, 0) > self.staleness_bound])
                    self.stats.wait_seconds += time.monotonic() - start
            self._apply(delta)
            if self.shards == 1:
                self._add_rows(rows)
            self._count(worker, samples, self._current.version - 1 - base_version)
            self._clock[worker] = self._clock.get(worker, 0) + 1
            self._cond.notify_all()
            reply = self._reply(want)
        return self._sharded_rows(rows, reply)  # with shards, the rows are added here, range by range

    def _push_hogwild(self, worker, base_version, delta, rows, samples, want):
        snap = self._current  # never replaced in hogwild mode: one set of live arrays
        for w, d in zip(snap.arrays, delta):
            np.add(w, d, out=w, casting="same_kind")  # no lock: concurrent adds and reads may interleave
        if self.shards == 1 and rows:
            with self._shard_locks[0]:  # the rows' lock only (not the state's): no row addition lost
                self._add_rows(rows, locked=False)
        version = next(self._hog_versions)
        with self._cond:  # bookkeeping only
            snap.version = max(snap.version, version)
            self._count(worker, samples, max(0, version - 1 - base_version))
            reply = self._reply(want)
        return self._sharded_rows(rows, reply)  # with shards, the rows are added here, range by range, under each range's lock

    def _push_sync(self, worker, delta, rows, samples, want):
        with self._cond:
            self._raise_timed_out()
            if worker in self._round_pushed:
                raise ValueError(f"worker {worker} pushed twice in synchronous round {self._round}")
            my_round = self._round
            if not self._round_pushed:
                self._round_began = time.monotonic()  # the round's first push
                if self._span_mark is None:
                    self._span_mark = self._round_began  # the epoch's first
            weight = max(samples, 1)
            self._round_acc = self._round_acc.merge(WeightedMean.of(list(delta), weight))
            for i, r in rows.items():
                self._round_rows.setdefault(i, []).append((r.ids, r.rows.astype(np.float64) * weight))
            self._round_pushed.add(worker)
            self._count(worker, samples, 0)
            self._maybe_complete_round(pusher=worker)
            self._wait(lambda: self._round > my_round, f"synchronous round {my_round}",
                       lambda: self._active - self._round_pushed if self._round == my_round else ())
            reply = self._reply(want)
        return self._sharded_rows({}, reply)

    def _maybe_complete_round(self, pusher: int | None = None) -> None:
        """Caller holds the lock; ``pusher``: the worker whose push may complete the round (None: a
        worker left, or a wait timed out)."""
        if not self._round_pushed or not self._active <= self._round_pushed:
            return
        if len(self._joined) < self._expected and time.monotonic() < self._join_deadline:
            return  # workers of this epoch may still be starting
        if pusher is not None and len(self._round_pushed) > 1:
            s = self.stats
            s.last_in_round[pusher] = s.last_in_round.get(pusher, 0) + 1
            s.held_seconds[pusher] = s.held_seconds.get(pusher, 0.0) + time.monotonic() - self._round_began
        total = self._round_acc.total_weight
        self._apply(self._round_acc.result())
        for i, parts in self._round_rows.items():
            ids, summed = _sum_rows(parts)
            summed /= total
            self._add_rows({i: SparseRows(ids, summed)})
        self._round += 1
        self.stats.rounds += 1
        now = time.monotonic()  # the round's end, its update applied; the mark: set by the epoch's first push
        self.stats.round_span_seconds += now - self._span_mark
        self._span_mark = now
        self._round_acc = WeightedMean()
        self._round_rows = {}
        self._round_pushed = set()
        self._cond.notify_all()
