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
* ``hogwild``: each delta is added in place with no lock; pulls may observe a
  partly applied update (lock-free, Hogwild!-style).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..merge import WeightedMean

MODES = ("synchronous", "asynchronous", "hogwild")


class RoundTimeout(TimeoutError):
    """A synchronous round or a staleness wait outlived its timeout."""


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
    worker_steps: dict[int, int] = field(default_factory=dict)
    worker_samples: dict[int, int] = field(default_factory=dict)
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
            "worker_steps": dict(sorted(self.worker_steps.items())),
            "worker_samples": dict(sorted(self.worker_samples.items())),
        }


class Snapshot:
    """One version of the weights. ``users`` counts senders still reading it."""

    __slots__ = ("version", "arrays", "users")

    def __init__(self, version: int, arrays: list[np.ndarray]):
        self.version = version
        self.arrays = arrays
        self.users = 0


_MAX_FREE_BUFFERS = 2


class ServerState:
    def __init__(
        self,
        weights: Sequence[np.ndarray],
        mode: str,
        staleness_bound: int | None = None,
        round_timeout: float = 600.0,
        join_timeout: float = 30.0,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown parameter-server mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.staleness_bound = staleness_bound
        self.round_timeout = round_timeout
        self.join_timeout = join_timeout
        self._current = Snapshot(0, [np.array(w, copy=True) for w in weights])
        self._free: list[list[np.ndarray]] = []
        self.shapes = [w.shape for w in self._current.arrays]
        self.dtypes = [w.dtype for w in self._current.arrays]
        self.nbytes = sum(w.nbytes for w in self._current.arrays)
        self._hog_versions = itertools.count(1)
        self._cond = threading.Condition()
        self.stats = PSStats()
        self._expected = 0
        self._joined: set[int] = set()
        self._active: set[int] = set()
        self._clock: dict[int, int] = {}
        self._join_deadline = 0.0
        self._round = 0
        self._round_acc = WeightedMean()
        self._round_pushed: set[int] = set()
        self._failed: str | None = None

    # -- epoch and membership ----------------------------------------------------------
    def begin_epoch(self, expected: int) -> None:
        with self._cond:
            self._expected = expected
            self._joined.clear()
            self._active.clear()
            self._clock.clear()
            self._round_pushed.clear()
            self._round_acc = WeightedMean()
            self._join_deadline = time.monotonic() + self.join_timeout
            self._failed = None

    def join(self, worker: int) -> None:
        with self._cond:
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

    def pull(self) -> Snapshot:
        """The current weights; hand the snapshot back with :meth:`release` once sent."""
        with self._cond:
            snap = self._current
            snap.users += 1
            return snap

    def release(self, snap: Snapshot) -> None:
        with self._cond:
            snap.users -= 1
            self._recycle(snap)

    def snapshot(self) -> list[np.ndarray]:
        """A private copy of the current weights."""
        with self._cond:
            return [w.copy() for w in self._current.arrays]

    # -- snapshots (caller holds the lock) -----------------------------------------------
    def _recycle(self, snap: Snapshot) -> None:
        if snap is not self._current and snap.users == 0 and snap.arrays is not None:
            if len(self._free) < _MAX_FREE_BUFFERS:
                self._free.append(snap.arrays)
            snap.arrays = None

    def _apply(self, update: Sequence[np.ndarray]) -> None:
        """Publish ``current + update`` as a new snapshot, reusing a free buffer set."""
        old = self._current
        out = self._free.pop() if self._free else [np.empty_like(w) for w in old.arrays]
        for w, u, o in zip(old.arrays, update, out):
            np.add(w, u, out=o, casting="same_kind")
        self._current = Snapshot(old.version + 1, out)
        self._recycle(old)

    # -- updates ---------------------------------------------------------------------
    def check_delta(self, delta: Sequence[np.ndarray]) -> None:
        if len(delta) != len(self.shapes):
            raise ValueError(f"update has {len(delta)} arrays, the model has {len(self.shapes)}")
        for i, (d, s) in enumerate(zip(delta, self.shapes)):
            if d.shape != s:
                raise ValueError(f"update array {i} has shape {d.shape}, expected {s}")
            if d.dtype.kind != "f":
                raise ValueError(f"update array {i} has dtype {d.dtype}; deltas must be floating point")

    def push(self, worker: int, base_version: int, delta: Sequence[np.ndarray], samples: int) -> Snapshot:
        """Apply ``delta`` by the mode's rule; returns the weights to send back (then :meth:`release`)."""
        self.check_delta(delta)
        if self.mode == "synchronous":
            return self._push_sync(worker, delta, samples)
        if self.mode == "asynchronous":
            return self._push_async(worker, base_version, delta, samples)
        return self._push_hogwild(worker, base_version, delta, samples)

    def _count(self, worker: int, samples: int, staleness: int) -> None:
        st = self.stats
        st.updates += 1
        st.staleness_sum += staleness
        st.staleness_max = max(st.staleness_max, staleness)
        st.worker_steps[worker] = st.worker_steps.get(worker, 0) + 1
        st.worker_samples[worker] = st.worker_samples.get(worker, 0) + samples

    def _wait(self, predicate, what: str) -> None:
        deadline = time.monotonic() + self.round_timeout
        while not predicate():
            if self._failed:
                raise RuntimeError(f"parameter server stopped: {self._failed}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoundTimeout(f"{what} timed out after {self.round_timeout:.0f} s")
            self._cond.wait(min(left, 0.2))
            if self.mode == "synchronous":
                self._maybe_complete_round()

    def _push_async(self, worker, base_version, delta, samples):
        with self._cond:
            if self.staleness_bound is not None:
                mine = self._clock.get(worker, 0)

                def ready() -> bool:
                    others = [self._clock.get(a, 0) for a in self._active if a != worker]
                    return not others or mine - min(others) <= self.staleness_bound

                if not ready():
                    start = time.monotonic()
                    self.stats.staleness_waits += 1
                    self._wait(ready, f"worker {worker} waiting for slower workers (staleness bound {self.staleness_bound})")
                    self.stats.wait_seconds += time.monotonic() - start
            self._apply(delta)
            self._count(worker, samples, self._current.version - 1 - base_version)
            self._clock[worker] = self._clock.get(worker, 0) + 1
            self._cond.notify_all()
            snap = self._current
            snap.users += 1
            return snap

    def _push_hogwild(self, worker, base_version, delta, samples):
        snap = self._current  # never replaced in hogwild mode: one set of live arrays
        for w, d in zip(snap.arrays, delta):
            np.add(w, d, out=w, casting="same_kind")  # no lock: concurrent adds and reads may interleave
        version = next(self._hog_versions)
        with self._cond:  # bookkeeping only
            snap.version = max(snap.version, version)
            self._count(worker, samples, max(0, version - 1 - base_version))
            snap.users += 1
            return snap

    def _push_sync(self, worker, delta, samples):
        with self._cond:
            if worker in self._round_pushed:
                raise ValueError(f"worker {worker} pushed twice in synchronous round {self._round}")
            my_round = self._round
            self._round_acc = self._round_acc.merge(WeightedMean.of(list(delta), max(samples, 1)))
            self._round_pushed.add(worker)
            self._count(worker, samples, 0)
            self._maybe_complete_round()
            self._wait(lambda: self._round > my_round, f"synchronous round {my_round} (waiting for workers {sorted(self._active - self._round_pushed)})")
            snap = self._current
            snap.users += 1
            return snap

    def _maybe_complete_round(self) -> None:
        """Caller holds the lock."""
        if not self._round_pushed or not self._active <= self._round_pushed:
            return
        if len(self._joined) < self._expected and time.monotonic() < self._join_deadline:
            return  # workers of this epoch may still be starting
        self._apply(self._round_acc.result())
        self._round += 1
        self.stats.rounds += 1
        self._round_acc = WeightedMean()
        self._round_pushed = set()
        self._cond.notify_all()
