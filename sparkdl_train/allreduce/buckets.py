"""Overlap: a buffer's buckets reduced on a background thread while the backward pass still runs.

The fused step hands each bucket of its gradient vector over as soon as the backward pass has
produced it (:meth:`BucketRing.ready`, called from the framework's own thread, never blocks); a
thread of this rank reduces the buckets *in bucket order* (every rank runs the same sequence of
collectives, whatever order its framework finished them in), and the train loop waits for the
last one only before the optimizer's update (:meth:`BucketRing.wait`). Horovod's tensor fusion and
PyTorch DDP's buckets do the same with NCCL; here the collective is any ``reduce(view)``, the
project's ring in practice. Pure Python and numpy: tested with an in-memory ring.

Timing, per step and summed: ``exchange_s`` is the seconds the thread spent reducing, ``exposed_s``
the seconds the train loop waited for it after its backward pass. ``1 - exposed / exchange`` is
the fraction of the exchange hidden behind compute.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np


class BucketRing:
    """Reduce ``buf[lo:hi]`` for each of ``bounds`` on a thread, one step after another."""

    def __init__(self, buf: np.ndarray, bounds: Sequence[tuple[int, int]], reduce: Callable[[np.ndarray], None],
                 timeout: float, name: str = "sparkdl-buckets"):
        if not bounds:
            raise ValueError("no buckets")
        self.buf = buf
        self.bounds = [(int(lo), int(hi)) for lo, hi in bounds]
        self._reduce = reduce
        self._timeout = float(timeout)
        self._cond = threading.Condition()
        self._ready = [False] * len(self.bounds)
        self._done = len(self.bounds)  # buckets of the current step reduced (none started yet: "all done")
        self._active = False
        self._error: BaseException | None = None
        self._closed = False
        self.exchange_s = 0.0
        self.exposed_s = 0.0
        self.steps = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def start_step(self) -> None:
        """A new step: every bucket waits for its hand-over. The previous step must be waited for."""
        with self._cond:
            self._raise_if_failed()
            if self._active:
                raise RuntimeError("start_step before the previous step was waited for")
            self._ready = [False] * len(self.bounds)
            self._done = 0
            self._active = True
            self._cond.notify_all()

    def ready(self, index: int) -> None:
        """Bucket ``index`` of this step is in the buffer (any thread; returns at once)."""
        with self._cond:
            if not self._active:
                raise RuntimeError(f"bucket {index} handed over outside a step")
            self._ready[index] = True
            self._cond.notify_all()

    def ready_all(self) -> None:
        """Every bucket is in the buffer (a rank out of data hands over zeros at once)."""
        for k in range(len(self.bounds)):
            self.ready(k)

    def wait(self) -> float:
        """Block until this step's buckets are reduced; returns the seconds waited. Raises what the
        thread raised (a peer's loss, a timeout); a bucket never handed over times out."""
        t0 = time.perf_counter()
        with self._cond:
            deadline = t0 + self._timeout
            while self._done < len(self.bounds) and self._error is None:
                left = deadline - time.perf_counter()
                if left <= 0:
                    missing = [k for k, r in enumerate(self._ready) if not r]
                    raise TimeoutError(f"gradient buckets not reduced within {self._timeout:.0f} s "
                                       f"(bucket(s) {missing} never handed over by the backward pass)")
                self._cond.wait(left)
            self._raise_if_failed()
            self._active = False
        waited = time.perf_counter() - t0
        self.exposed_s += waited
        self.steps += 1
        return waited

    def close(self) -> None:
        """Stop the thread. One still inside a reduce (a step that failed while a bucket was on the
        ring) is left to end when the caller closes the ring's link: waited for at most 5 s."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(min(self._timeout, 5.0))

    def __enter__(self) -> "BucketRing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    k = self._done
                    while not self._closed and not (self._active and k < len(self.bounds) and self._ready[k]):
                        self._cond.wait()
                        k = self._done
                    if self._closed:
                        return
                lo, hi = self.bounds[k]
                t0 = time.perf_counter()
                self._reduce(self.buf[lo:hi])
                spent = time.perf_counter() - t0
                with self._cond:
                    self.exchange_s += spent
                    self._done = k + 1
                    self._cond.notify_all()
        except BaseException as e:  # handed to the train loop's wait()
            with self._cond:
                self._error = e
                self._cond.notify_all()
