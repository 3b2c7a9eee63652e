"""The parameter server's numeric core: weights, versions and the update rules.

No sockets here, so every rule is unit-tested directly. Updates are weight
*deltas* (``w_local - w_pulled`` after some local steps with the worker's own
Keras optimizer):

* ``synchronous``: a round completes when every worker still in the epoch has
  pushed; the server applies the sample-weighted **mean** of the round's deltas
  (model averaging every N steps) and releases all of them with the new weights.
* ``asynchronous``: each delta is applied on arrival under a lock (ASGD /
  GEO-style); weights are replaced copy-on-write, so a pull never sees a
  half-applied update. Optional bounded staleness (SSP): a worker more than
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
        self._weights = [np.array(w, copy=True) for w in weights]
        self.shapes = [w.shape for w in self._weights]
        self.dtypes = [w.dtype for w in self._weights]
        self.nbytes = sum(w.nbytes for w in self._weights)
        self._version = 0
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
        return self._version

    def pull(self) -> tuple[int, list[np.ndarray]]:
        if self.mode == "hogwild":
            return self._version, self._weights  # live arrays: lock-free reads may be torn
        with self._cond:
            return self._version, self._weights  # copy-on-write: this list is never mutated

    def snapshot(self) -> list[np.ndarray]:
        with self._cond:
            return [w.copy() for w in self._weights]

    # -- updates ---------------------------------------------------------------------
    def check_delta(self, delta: Sequence[np.ndarray]) -> None:
        if len(delta) != len(self.shapes):
            raise ValueError(f"update has {len(delta)} arrays, the model has {len(self.shapes)}")
        for i, (d, s) in enumerate(zip(delta, self.shapes)):
            if d.shape != s:
                raise ValueError(f"update array {i} has shape {d.shape}, expected {s}")
            if d.dtype.kind != "f":
                raise ValueError(f"update array {i} has dtype {d.dtype}; deltas must be floating point")

    def push(self, worker: int, base_version: int, delta: Sequence[np.ndarray], samples: int) -> tuple[int, list[np.ndarray]]:
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
            self._weights = [np.add(w, d, dtype=w.dtype) for w, d in zip(self._weights, delta)]
            self._version += 1
            self._count(worker, samples, self._version - 1 - base_version)
            self._clock[worker] = self._clock.get(worker, 0) + 1
            self._cond.notify_all()
            return self._version, self._weights

    def _push_hogwild(self, worker, base_version, delta, samples):
        for w, d in zip(self._weights, delta):
            np.add(w, d, out=w, casting="same_kind")
        version = next(self._hog_versions)
        self._version = max(self._version, version)
        with self._cond:  # bookkeeping only; the weights above were updated without a lock
            self._count(worker, samples, max(0, version - 1 - base_version))
        return self._version, self._weights

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
            return self._version, self._weights

    def _maybe_complete_round(self) -> None:
        """Caller holds the lock."""
        if not self._round_pushed or not self._active <= self._round_pushed:
            return
        if len(self._joined) < self._expected and time.monotonic() < self._join_deadline:
            return  # workers of this epoch may still be starting
        mean = self._round_acc.result()
        self._weights = [np.add(w, m, dtype=w.dtype) for w, m in zip(self._weights, mean)]
        self._version += 1
        self._round += 1
        self.stats.rounds += 1
        self._round_acc = WeightedMean()
        self._round_pushed = set()
        self._cond.notify_all()
