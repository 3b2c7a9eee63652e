"""Driver side of the prepare job: the executors rebuild a fit's model and trace its step while
the driver still prepares the fit (worker side and rationale: :mod:`sparkdl_train.worker.prepare`).

``fit`` starts it once it knows its workers (after planning), beside its sample job, and waits
for it, bounded, before the first epoch (``FitStats.phases["prepare"]`` is what is left of that
wait; ``FitStats.prepare`` what the tasks did). It runs in the kind of stage the fit's data runs
in (DataFrame stages and RDD stages have separate Python worker pools), one task per slot up to
a bound: Spark hands each new task the longest-idle worker of its pool, so preparing every idle
worker of a small pool is what makes the epoch's tasks land on prepared ones.

Its tasks trace for a signature guessed from column types; :meth:`PendingPrepare.accepted`
compares it with the driver's sample, and only a confirmed signature goes to the epoch's tasks,
which otherwise rebuild (``StepSettings.prepared``).

``spark.sparkdl_train.worker.prepare=false`` (``SparkModel(prepare_workers=False)``) turns it off.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

from ..data.adapters import DataAdapter
from ..data.batching import Batch, row_signature
from ..worker.prepare import PrepareTask
from ..worker.tasks import StepSettings
from .background import SparkCall

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

    def wait(self, timeout: float) -> dict[str, Any]:
        """Wait up to ``timeout`` seconds; returns a summary of what the tasks did. Never raises:
        a failed or late prepare job leaves the epoch's tasks to rebuild, as they would anyway."""
        if self._call is None:
            return {"tasks": 0}
        if not self._call.wait(timeout):
            log.info("prepare: the executors' prepare job did not end within %g s; the first epoch goes on", timeout)
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
            "traced": sum(1 for r in self.reports if r.get("traced")),
            "kinds": sorted({k for r in self.reports for k in r.get("traced", ())}),
            "errors": len(errors),
            "slowest": max((r.get("seconds", 0.0) for r in self.reports), default=0.0),
        }

    def accepted(self, sample: Batch) -> str | None:
        """The signature the epoch's tasks may use prepared models under: the traced one when the
        driver's ``sample`` of the data has it, else ``None`` (they rebuild)."""
        if self.signature is None:
            return None
        found = row_signature(sample)
        if found != self.signature:
            log.info("prepare: the data's batches are %s, not %s as their column types said; the first epoch rebuilds",
                     found, self.signature)
            return None
        return self.signature

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel(5.0)


def start_prepare(adapter: DataAdapter, payload_ref: Any, settings: StepSettings, kinds: Sequence[str], workers: int,
                  after: SparkCall | None = None) -> PendingPrepare:
    """Start the prepare job for a fit on ``adapter`` with ``workers`` workers, on a helper thread,
    once ``after`` (the fit's sample job) has ended: Spark gives free slots to the job submitted
    first, and a prepare job ahead of the sample holds them until its tasks end, delaying the
    sample the driver waits for by as long."""
    sc = adapter.spark_context()
    if sc is None:
        return PendingPrepare(None, None, 0)
    batch = adapter.empty_batch()
    tasks = max(workers, min(int(sc.defaultParallelism), TASKS_PER_WORKER * workers))
    task = PrepareTask(payload_ref, settings, batch, tuple(kinds) if batch is not None else ())
    session = adapter.spark_session()
    if session is not None:
        frame = session.range(0, tasks, 1, tasks).mapInArrow(_arrow_stage(task), "report string")

        def collect() -> list[str]:
            return [row[0] for row in frame.collect()]
    else:
        collect = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(_rdd_stage(task)).collect

    def job() -> list[str]:
        if after is not None:
            after.wait()
        return collect()

    call = SparkCall(sc, job, "sparkdl_train-prepare", "sparkdl_train fit: preparing the executors' model")
    return PendingPrepare(call, row_signature(batch) if batch is not None else None, tasks)


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
