"""A call that runs Spark jobs on a helper thread: waited for with a timeout, cancelled by its tag.

The driver starts work it needs later (the executors' environment check, a fit's sample job) and
goes on preparing. The helper is Spark's ``InheritableThread``, so the jobs carry the caller's job
group and tags (a fit's cancel reaches them), plus a job tag of the call's own, by which
:meth:`SparkCall.cancel` ends them without touching anyone else's jobs.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Callable

_current = threading.local()


def cancelled() -> bool:
    """Inside a :class:`SparkCall`'s function: whether the call has been cancelled. A function that
    waits before it submits its job checks this first: ``cancel()`` ends the jobs that exist when it
    runs, and one submitted just after would run to its end."""
    call = getattr(_current, "call", None)
    return call is not None and call._cancelled.is_set()


def spark_thread(sc: Any, target: Callable[..., Any], name: str, args: tuple = ()) -> threading.Thread:
    """A daemon thread whose Spark jobs carry the calling thread's job group and tags: Spark's
    ``InheritableThread`` for a SparkContext, :meth:`ConnectContext.thread` for a Spark Connect
    session (whose tags are per thread), a plain thread without either."""
    if sc is None:
        return threading.Thread(target=target, args=args, name=name, daemon=True)
    make = getattr(sc, "thread", None)
    if make is not None:
        return make(target, args=args, name=name)
    from pyspark import InheritableThread

    return InheritableThread(target, args=args, name=name, daemon=True)


class SparkCall:
    """``fn()`` started now on a helper thread, its jobs tagged ``<name>-<random>`` and, with a
    ``description``, labelled so in the Spark UI. Without a SparkContext (in-process data) it runs
    inline. :meth:`result` waits and returns its value or raises what it raised."""

    def __init__(self, sc: Any, fn: Callable[[], Any], name: str, description: str | None = None):
        self._sc = sc
        self._box: dict[str, Any] = {}
        self._thread = None
        self._cancelled = threading.Event()
        self.tag = f"{name}-{uuid.uuid4().hex[:8]}"
        if sc is None:
            self._run(fn, None)
            return
        self._thread = spark_thread(sc, self._run, name, args=(fn, description))
        self._thread.start()

    def _run(self, fn: Callable[[], Any], description: str | None) -> None:
        sc = self._sc
        old = None
        _current.call = self
        if sc is not None:
            sc.addJobTag(self.tag)
            if description is not None:
                old = sc.getLocalProperty("spark.job.description")
                sc.setLocalProperty("spark.job.description", description)
        try:
            self._box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised by result()
            self._box["error"] = exc
        finally:
            _current.call = None
            if sc is not None:
                if description is not None:
                    sc.setLocalProperty("spark.job.description", old)
                sc.removeJobTag(self.tag)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the call has ended, after waiting up to ``timeout`` seconds (``None``: until it ends)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def result(self) -> Any:
        """Its value, once it has ended (waits as long as it takes)."""
        self.wait()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]

    def cancel(self, wait: float = 30.0) -> None:
        """Cancel its Spark jobs, if it still runs, and wait up to ``wait`` seconds for it to end. The
        tag is cancelled again while it waits: a job its function submitted just after the first
        cancel (between its own check of :func:`cancelled` and Spark registering the job) is reached
        too. (A prepare job submitted so was seen running to its end, TensorFlow's import and the
        model's trace, after the fit had failed on its sample.)"""
        self._cancelled.set()
        if self._thread is None or not self._thread.is_alive():
            return
        deadline = time.monotonic() + wait
        while True:
            self._sc.cancelJobsWithTag(self.tag)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._thread.join(min(0.25, left))
            if not self._thread.is_alive():
                return
