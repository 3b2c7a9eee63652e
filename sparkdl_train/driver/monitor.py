"""Running a fit's Spark jobs while the caller's thread stays responsive.

For the duration of one ``fit``, :class:`FitMonitor`

* puts every job in a Spark job group (the caller's, if one is set, else
  ``sparkdl_train-fit-<id>``, cancellable from the Spark UI or with
  ``sc.cancelJobGroup``) and tags them with the fit's own tag, so that
  ``SparkModel.cancel()`` cancels exactly this fit;
* runs the report server when someone listens (a progress bar, callbacks);
* runs each epoch's Spark action on a helper thread (which inherits the
  caller's local properties: job group, scheduler pool) while the caller's
  thread feeds live reports to the progress bar and to the callbacks'
  batch-level hooks, all on the caller's thread;
* cancels the running epoch as soon as a callback sets ``model.stop_training``
  (e.g. ``TerminateOnNaN``) and reports it as :class:`EpochStopped`; a
  ``KeyboardInterrupt`` cancels the fit's jobs before it propagates;
* watches the executors that go away while an epoch runs: one whose container its
  cluster manager killed for its memory (YARN's pmem check, Kubernetes' OOMKilled)
  ends the fit at once with cause ``container_memory``, naming the setting to raise,
  instead of Spark's stage retries meeting the same limit on every new container and
  failing minutes later on the lost shuffle output.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, TypeVar

from ..errors import FitCancelled
from ..failures import SparkFailure, memory_error
from ..net import new_identity, new_secret
from ..worker.report import ReportSettings
from .background import spark_thread
from .executors import memory_kill_since, removed_executors
from .progress import FitProgress
from .reports import EpochTally, ReportServer

log = logging.getLogger(__name__)
_WAKE = object()  # put in the report queue when an epoch's job ends

T = TypeVar("T")

_GROUP = "spark.jobGroup.id"
_GROUP_PROPS = (_GROUP, "spark.job.description", "spark.job.interruptOnCancel")


class EpochStopped(Exception):
    """The running epoch was cancelled because ``model.stop_training`` was set during it."""

    def __init__(self, tally: EpochTally, seconds: float):
        super().__init__(f"epoch {tally.epoch + 1} stopped early after {tally.samples} samples")
        self.tally = tally
        self.seconds = seconds


class FitMonitor:
    def __init__(
        self,
        sc: Any,
        model: Any,
        callbacks: Any,
        progress: FitProgress,
        workers: int,
        host: str,
        interval: float,
        live: bool,
        tls: bool = False,
        removed_before: set[str] | None = None,
        ports: tuple[int, int] | None = None,
    ):
        self.ports = ports  # network.ports: the report server's port comes from it
        self.sc = sc
        self.model = model
        self.callbacks = callbacks
        self.progress = progress
        self.workers = workers
        self.host = host
        self.interval = interval
        self.live = live
        self.fit_id = uuid.uuid4().hex[:12]
        self.tag = f"sparkdl_train-{self.fit_id}"
        self.job_group: str | None = None
        self._saved: dict[str, str | None] = {}
        self._server: ReportServer | None = None
        self._secret = new_secret()
        self._tls = new_identity("sparkdl_train report server") if tls and live else None  # only a running server needs one
        self.stop_requested = False
        self.cancel_requested = False  # cancel() was called: no job of this fit starts after it
        self.reports_received = 0
        self.watch_interval = 2.0  # seconds between two looks at the executors that went away
        # executors gone before the fit began (its preparation's jobs count as the fit's): not this fit's losses
        self._removed_before: set[str] | None = removed_before
        self.memory_failure: SparkFailure | None = None

    # -- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> "FitMonitor":
        if self.live:  # first: if it cannot bind, nothing else has been changed yet
            self._server = ReportServer(self.host, self._secret, tls=self._tls, ports=self.ports).start()
        sc = self.sc
        if sc is not None:
            self._saved = {k: sc.getLocalProperty(k) for k in _GROUP_PROPS}
            self.job_group = self._saved[_GROUP]
            if not self.job_group:  # the caller's group, if any, stays in charge
                self.job_group = f"sparkdl_train-fit-{self.fit_id}"
                sc.setJobGroup(self.job_group, "sparkdl_train fit", interruptOnCancel=True)
            sc.addJobTag(self.tag)
            if self._removed_before is None:
                self._removed_before = set(removed_executors(sc))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.stop()
            self.reports_received = self._server.received
            self._server = None
        sc = self.sc
        if sc is not None:
            sc.removeJobTag(self.tag)
            for k, v in self._saved.items():
                sc.setLocalProperty(k, v)

    def cancel(self) -> None:
        """Cancel this fit's running Spark jobs (from any thread), and its next ones: Spark cancels
        only jobs it is running, and between two epochs this fit runs none."""
        self.cancel_requested = True
        self._cancel_jobs()

    def _cancel_jobs(self) -> None:
        if self.sc is not None:
            self.sc.cancelJobsWithTag(self.tag)

    def report_settings(self, epoch: int) -> ReportSettings | None:
        if self._server is None:
            return None
        host, port = self._server.address
        return ReportSettings(host, port, self._secret, epoch, self.interval,
                              tls=self._tls.for_clients() if self._tls is not None else None)

    # -- one epoch --------------------------------------------------------------------
    def run(self, epoch: int, action: Callable[[], T], abort: Callable[[], BaseException | None] | None = None) -> T:
        """Run ``action`` (one epoch's Spark job) on a helper thread; meanwhile dispatch live reports.
        Raises :class:`FitCancelled` instead when :meth:`cancel` was called before it started, or
        while it was being submitted (its job may have escaped the cancel; it has ended now).
        ``abort()``, polled while the job runs: an error once the epoch has failed on the driver's side (a
        synchronous round that timed out), raised after the job is cancelled, without waiting for Spark's
        retries of the tasks it failed (each would fail again, and each costs a task's start)."""
        self._check_cancelled(epoch)
        start = time.perf_counter()
        tally = EpochTally(epoch, self.workers)
        box: dict[str, Any] = {}
        finished = threading.Event()

        def target() -> None:
            try:
                box["result"] = action()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc
            finally:
                finished.set()
                if self._server is not None:
                    self._server.events.put(_WAKE)  # the dispatch loop stops waiting for reports now

        thread = self._thread(target)
        thread.start()
        watched = time.monotonic()
        aborted: BaseException | None = None
        try:
            while not finished.is_set():
                self._dispatch(tally, timeout=0.1, finished=finished)
                if abort is not None and aborted is None:
                    aborted = abort()
                    if aborted is not None:
                        log.error("epoch %d failed: %s; cancelling its Spark job", epoch + 1, aborted)
                        self._cancel_jobs()
                if self.model.stop_training and not self.stop_requested:
                    self.stop_requested = True
                    log.info("epoch %d: stop_training was set during the epoch; cancelling its Spark job", epoch + 1)
                    self._cancel_jobs()
                if self.memory_failure is None and time.monotonic() - watched >= self.watch_interval:
                    watched = time.monotonic()
                    if self._watch_executors(epoch):
                        self._cancel_jobs()
            thread.join()
            self._dispatch(tally, timeout=0.0)
        except BaseException:  # Ctrl-C, or a callback raised (TerminateOnNaN(raise_error=True))
            self._cancel_jobs()
            thread.join(60)
            raise
        error = box.get("error")
        if aborted is not None:
            raise aborted from error
        if error is not None and (self.memory_failure is not None or self._watch_executors(epoch)):
            raise memory_error(self.memory_failure, f"epoch {epoch + 1}") from error
        if error is not None:
            if isinstance(error, FitCancelled) and self.stop_requested and not self.cancel_requested:
                raise EpochStopped(tally, time.perf_counter() - start) from None
            raise error
        self._check_cancelled(epoch)
        return box["result"]

    def _watch_executors(self, epoch: int) -> bool:
        """Whether an executor that went away during this fit was killed for its memory (then kept in
        :attr:`memory_failure`)."""
        if self.sc is None:
            return False
        self.memory_failure = memory_kill_since(self.sc, self._removed_before or set())
        if self.memory_failure is not None:
            log.error("epoch %d: %s; ending the fit (the next container would be killed too)", epoch + 1,
                      self.memory_failure.summary)
        return self.memory_failure is not None

    def _check_cancelled(self, epoch: int) -> None:
        if self.cancel_requested:
            raise FitCancelled(f"sparkdl_train fit: cancelled (SparkModel.cancel) at epoch {epoch + 1}")

    def _thread(self, target: Callable[[], None]) -> threading.Thread:
        return spark_thread(self.sc, target, f"sparkdl_train-fit-{self.fit_id}")  # the job group, tags and pool go with it

    def _dispatch(self, tally: EpochTally, timeout: float, finished: threading.Event | None = None) -> None:
        """Hand queued reports to the bar and the callbacks, waiting up to ``timeout`` for one
        (returning as soon as ``finished`` is set)."""
        if self._server is None:
            if timeout and finished is not None:
                finished.wait(timeout)
            return
        events = self._server.events
        changed = False
        try:
            report = events.get(timeout=timeout) if timeout else events.get_nowait()
            while True:
                if report is not _WAKE:
                    changed |= tally.add(report)
                report = events.get_nowait()
        except queue.Empty:
            pass
        if not changed:
            return
        self.progress.report(tally)
        if self.callbacks is not None:
            batch = tally.updates - 1
            self.callbacks.on_train_batch_begin(batch)
            self.callbacks.on_train_batch_end(batch, tally.logs())
