"""Driver side of the prepare job: the executors rebuild a fit's model and trace its step while
the driver still prepares the fit (worker side and rationale: :mod:`sparkdl_train.worker.prepare`).

``fit`` starts it once it knows its workers (after planning), beside its sample job, and lets
the first epoch go on once it has ended (:meth:`PendingPrepare.go_ahead`,
``FitStats.phases["prepare"]`` is what is left of it after the driver's own preparation); it is
cancelled if it has not ended within the preflight timeout, and its reports are read after the
first epoch (``FitStats.prepare``: what the tasks did). It runs in the kind of stage the fit's data runs
in (DataFrame stages and RDD stages have separate Python worker pools), two tasks per slot up to
a bound (:func:`prepare_tasks`): Spark hands each new task the longest-idle worker of its pool,
so preparing every idle worker of a small pool is what makes the epoch's tasks land on prepared
ones.

Its tasks trace for a signature guessed from column types or, where those tell none (an RDD, a
transform), the signature of the driver's sample. The epoch's tasks carry the labels' signature
the driver found in its sample (``StepSettings.labels``) and use a prepared model only when its
labels were guessed right (:mod:`sparkdl_train.worker.runtime`); :meth:`PendingPrepare.confirms`
compares the whole signature and logs a wrong guess.

``spark.sparkdl_train.worker.prepare=false`` (``SparkModel(prepare_workers=False)``) turns it off.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

from ..data.adapters import DataAdapter
from ..data.batching import Batch, row_signature, take_rows
from ..worker.prepare import PrepareTask
from ..worker.tasks import StepSettings
from .background import SparkCall, cancelled

log = logging.getLogger(__name__)

# at most this many prepare tasks per training worker: a large cluster's idle slots are not all
# worth a model copy
TASKS_PER_WORKER = 4


class PendingPrepare:
    """A prepare job under way (:func:`start_prepare`)."""

    def __init__(self, call: SparkCall | None, signature: str | None, tasks: int):
        self._call = call
        self.signature = signature  # what its tasks traced for; None: they only rebuild
        self.tasks = tasks
        self.reports: list[dict[str, Any]] = []

    def go_ahead(self, timeout: float, watch: Callable[[], None] | None = None) -> None:
        """Let the fit's first epoch go on once this job has ended, waiting up to ``timeout``
        seconds (then it is cancelled: its tasks would hold the epoch's slots); :meth:`finish`
        collects it.

        Not once it is submitted, though that would save the driver's round trip between the two
        jobs (30 ms of a 0.45 s fit on ``local[2]``): the epoch's job could then reach Spark's
        scheduler first (a DataFrame's ``collect`` plans before it submits), and a first-epoch task
        run on a worker whose prepare task came after it; and queued behind the prepare job, the
        epoch's tasks take slots as single prepare tasks end, so a slow prepare task (a Python
        worker still starting) leaves both of a short epoch's tasks to one worker, one after the
        other, and the first epoch runs narrower than the cluster (seen on ``local[2]`` and a
        loaded local-cluster). Offered every slot at once, Spark places them one per free slot.

        ``watch`` is called every 2 s while it waits, and may raise to end the fit (an executor killed
        for its memory while it rebuilt the model: the epoch's would be killed too)."""
        if self._call is None:
            return
        deadline = time.monotonic() + timeout
        step = 2.0 if watch is not None else timeout
        while True:
            ended = self._call.wait(max(0.0, min(step, deadline - time.monotonic())))
            if watch is not None:
                watch()
            if ended:
                return
            if time.monotonic() >= deadline:
                break
        log.info("prepare: the executors' prepare job did not end within %g s; cancelled, the first epoch goes on", timeout)
        self._call.cancel(5.0)

    def finish(self, timeout: float = 5.0) -> dict[str, Any]:
        """After the first epoch: :meth:`wait` up to ``timeout`` seconds (its tasks ran before
        the epoch's, unless they ran on slots the epoch did not use), then cancel what is left."""
        summary = self.wait(timeout)
        self.cancel()
        return summary

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait up to ``timeout`` seconds; returns a summary of what the tasks did. Never raises:
        a failed or late prepare job leaves the epoch's tasks to rebuild, as they would anyway."""
        if self._call is None:
            return {"tasks": 0}
        if not self._call.wait(timeout):
            log.info("prepare: the executors' prepare job did not end within %g s", timeout)
            return {"tasks": self.tasks, "finished": False}
        try:
            self.reports = [json.loads(r) for r in self._call.result()]
        except Exception as exc:  # noqa: BLE001 - the epoch's tasks meet (and report) any real problem
            log.info("prepare: the executors' prepare job failed (%s: %s); the first epoch rebuilds", type(exc).__name__,
                     str(exc).splitlines()[0] if str(exc) else "")
            return {"tasks": self.tasks, "finished": False, "error": f"{type(exc).__name__}"}
        errors = [r for r in self.reports if "error" in r]
        for r in errors[:1]:
            log.info("prepare: a prepare task failed (the first epoch rebuilds there): %s\n%s", r["error"], r.get("traceback", ""))
        return {
            "tasks": self.tasks,
            "finished": True,
            "python_workers": sorted({(r.get("host"), r.get("pid")) for r in self.reports}),
            "rebuilt": sum(1 for r in self.reports if r.get("cached") is False),
            "cache_misses": sorted({r["cache_miss"] for r in self.reports if r.get("cache_miss")}),
            "traced": sum(1 for r in self.reports if r.get("traced")),
            "kinds": sorted({k for r in self.reports for k in r.get("traced", ())}),
            "errors": len(errors),
            "slowest": max((r.get("seconds", 0.0) for r in self.reports), default=0.0),
            # the slowest task's model rebuild and its steps' trace (and instantiation), seconds
            "rebuild": max((r.get("rebuild", 0.0) for r in self.reports), default=0.0),
            "trace": max((r.get("trace", 0.0) for r in self.reports), default=0.0),
        }

    def confirms(self, sample: Batch) -> bool:
        """Whether the driver's ``sample`` of the data has the signature the tasks traced for
        (when they traced): otherwise the epoch's tasks rebuild (a model built for other labels)
        or trace again (other features), and this says so in the log."""
        if self.signature is None:
            return True
        found = row_signature(sample)
        if found != self.signature:
            log.info("prepare: the data's batches are %s, not %s as their column types said; the first epoch rebuilds "
                     "or traces again", found, self.signature)
            return False
        return True

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel(5.0)


def start_prepare(adapter: DataAdapter, payload_ref: Any, settings: StepSettings, kinds: Sequence[str], workers: int,
                  after: SparkCall | None = None, digest: str | None = None, check: Any = None,
                  check_timeout: float = 0.0) -> PendingPrepare:
    """Start the prepare job for a fit on ``adapter`` with ``workers`` workers, on a helper thread,
    once ``after`` (the fit's sample job) has ended: Spark gives free slots to the job submitted
    first, and a prepare job ahead of the sample holds them until its tasks end, delaying the
    sample the driver waits for by as long. Data whose column types tell no signature (an RDD, a
    transform) is traced for the signature of that sample, rows taken off.

    An architecture (``digest``) fitted before in this process starts at once, for the signature
    its last fit's sample had (:func:`remember_sample`): its workers most likely hold the model
    traced, so the tasks take a millisecond each and delay no sample, and its first epoch no longer
    waits for a prepare job that starts after the sample (0.1 s of a small fit).

    ``check`` (a :class:`~sparkdl_train.driver.preflight.PendingCheck`, given on a cluster): the job
    is submitted only once the executors' environment check has ended too (up to ``check_timeout``
    seconds). A check task still starting its executor's Python workers holds that executor's slot,
    and the prepare tasks, a few milliseconds each once one has built the model, would all go to the
    executors that were free: the busy executor's first epoch task then rebuilds the model (seen on a
    loaded standalone cluster, all four prepare tasks in one executor's worker)."""
    sc = adapter.spark_context()
    if sc is None:
        return PendingPrepare(None, None, 0)
    guess = adapter.empty_batch()
    known = _last_batches.get(digest) if digest is not None else None
    at_once = known is not None and (guess is None or row_signature(guess) == row_signature(known))
    if at_once:
        guess = known
    tasks = prepare_tasks(workers, int(sc.defaultParallelism))
    session = adapter.spark_session()

    def collect(task: PrepareTask) -> list[str]:
        if session is not None:
            frame = session.range(0, tasks, 1, tasks).mapInArrow(_arrow_stage(task), "report string")
            return [row[0] for row in frame.collect()]
        return sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(_rdd_stage(task)).collect()

    def job() -> list[str]:
        batch = guess
        if after is not None and not at_once:
            after.wait()
            if batch is None:
                batch = _rows_off(after)
        if check is not None:
            check.wait(check_timeout)  # a failed check fails the fit, which cancels this job
        if cancelled():  # the fit failed (its sample) while this waited: no job
            return []
        return collect(PrepareTask(payload_ref, settings, batch, tuple(kinds) if batch is not None else ()))

    call = SparkCall(sc, job, "sparkdl_train-prepare", "sparkdl_train fit: preparing the executors' model")
    return PendingPrepare(call, row_signature(guess) if guess is not None else None, tasks)


# each architecture's (digest's) last sample signature, as a batch of zero rows: start_prepare's
# guess for its next fit
_last_batches: "OrderedDict[str, Batch]" = OrderedDict()
_MAX_REMEMBERED = 16


def remember_sample(digest: str, sample: Batch) -> None:
    """Record the signature of a fit's data (its driver's ``sample``) for the architecture ``digest``."""
    _last_batches[digest] = take_rows(sample, slice(0, 0))
    _last_batches.move_to_end(digest)
    while len(_last_batches) > _MAX_REMEMBERED:
        _last_batches.popitem(last=False)


def prepare_tasks(workers: int, slots: int) -> int:
    """How many prepare tasks a fit with ``workers`` workers runs on a cluster of ``slots`` task
    slots: two waves of the slots, at most :data:`TASKS_PER_WORKER` per worker. Spark hands each
    task the longest-idle Python worker of its pool, and a worker's tasks go back to the end of
    that queue, so the second wave reaches idle workers the first did not (a pool grows past the
    slots when jobs overlap); on a worker already prepared a task finds the model cached (1 ms)."""
    return max(workers, min(2 * slots, TASKS_PER_WORKER * workers))


def _rows_off(sample: SparkCall) -> Batch | None:
    """The driver's sample batch with no rows (its signature), or ``None`` if the sample failed
    (the driver's own check reports why)."""
    try:
        batch = sample.result()
    except Exception:  # noqa: BLE001 - reported by the driver's check of the same sample
        return None
    return take_rows(batch, slice(0, 0))


def _rdd_stage(task: PrepareTask) -> Any:
    def run(index: int, _rows: Any) -> Any:
        yield json.dumps(task(index))

    return run


def _arrow_stage(task: PrepareTask) -> Any:
    def run(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        for _ in batches:
            pass
        ctx = TaskContext.get()
        yield pa.RecordBatch.from_pydict({"report": [json.dumps(task(ctx.partitionId() if ctx else 0))]})

    return run
