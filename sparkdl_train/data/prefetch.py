"""Overlapping input preparation with training on an executor.

Reading Arrow batches from Spark, converting columns and re-batching take a
few milliseconds per step of Python work; TensorFlow's step releases the GIL,
so a producer thread can prepare the next batches while the current one
trains (what ``tf.data``'s prefetch does for ``model.fit``). The queue is
bounded (``depth`` batches), so memory stays flat however large the partition.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
U = TypeVar("U")

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def prefetch(items: Iterable[T], depth: int = 8) -> Iterator[T]:
    """Yield ``items`` in order, produced up to ``depth`` ahead by a background thread.

    An exception in the producer is re-raised here, in the consumer's thread; when
    the consumer stops early (error, ``close()``), the producer stops at its next item.
    """
    if depth <= 0:
        yield from items
        return
    q: "queue.Queue[object]" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(obj: object) -> bool:
        while not stop.is_set():
            try:
                q.put(obj, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(_Failure(exc))

    thread = threading.Thread(target=produce, name="sparkdl_train-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            obj = q.get()
            if obj is _DONE:
                return
            if isinstance(obj, _Failure):
                raise obj.exc
            yield obj  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=5.0)


def ordered_map(fn: Callable[[T], U], items: Iterable[T], threads: int, depth: int | None = None) -> Iterator[U]:
    """``map(fn, items)`` on a pool of ``threads`` threads, yielding in input order, at most
    ``depth`` (default ``2 * threads``) results ahead of the consumer. ``items`` is read in the
    consumer's thread. The first exception is re-raised in order; pending work is cancelled
    when the consumer stops early."""
    if threads <= 1:
        yield from map(fn, items)
        return
    from concurrent.futures import ThreadPoolExecutor

    depth = max(threads, depth or 2 * threads)
    pending: "collections.deque" = collections.deque()
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sparkdl_train-transform")
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
