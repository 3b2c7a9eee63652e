"""Overlapping input preparation with training on an executor.

Reading Arrow batches from Spark, converting columns and re-batching take a
few milliseconds per step of Python work; TensorFlow's step releases the GIL,
so a producer thread can prepare the next batches while the current one
trains (what ``tf.data``'s prefetch does for ``model.fit``). The queue is
bounded (``depth`` batches), so memory stays flat however large the partition.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

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
