"""Continuous training from a Structured Streaming DataFrame: ``SparkModel.fit_stream``.

A streaming DataFrame goes in, a :class:`StreamFit` (the ``StreamingQuery`` and what it trained) comes
out. The query's sink is ``foreachBatch``: each micro-batch is one training pass of the fit's engine
(its parameter server, ring or averaging), run by the same code as an epoch of ``fit``. The engine,
its servers, the shipped model and the executors' prepared steps are set up on the first micro-batch
that has rows and kept until the query ends, so a micro-batch costs its Spark job, not a fit's start.

Exactly once
    ``checkpoint_location`` holds Spark's own checkpoint (``<location>/query``: offsets and commits)
    and the model's (``<location>/model``: weights and optimizer state after each trained
    micro-batch, with its batch id, written through :class:`~sparkdl_train.driver.checkpoint.Checkpointer`:
    state file first, then the pointer, renamed into place). Spark marks a micro-batch done only after
    the sink returns, and the sink returns after the model's commit; a restarted query (same
    location) restores the model's state and re-runs at most the last micro-batch, with the offsets
    it had: the sink finds its id already committed and skips it. So no micro-batch is trained twice or
    skipped, and the model equals an uninterrupted run's (exactly for the deterministic engines,
    within the usual asynchrony for the others).

    A micro-batch whose training fails (a task, an executor, the server) is retried from the state
    of the last commit: the engine is closed, the driver's model set back to the committed state (a
    parameter server's partial updates go with it) and the pass run again, ``stream_retries`` times
    at most; then the query fails with the error.

Model versions
    Every ``publish_every`` trained micro-batches the model is saved (:meth:`SparkModel.save` format)
    to ``<publish_dir>/v000001`` ... through a temporary name renamed into place, then
    ``<publish_dir>/LATEST`` (a small JSON: version, path, batch id, the stream's offsets for that
    batch from Spark's offset log) is replaced the same way: :func:`load_latest` never reads a
    half-written version.

Limits: a classic SparkSession (on Spark Connect, foreachBatch runs in a process of the server's);
no validation data; a progress bar is not drawn (a log line per micro-batch, ``StreamFit.batches``, ``StreamFit.progress()``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..config import FitConfig
from ..errors import BatchTimeout, ConfigError, DataError
from ..fs import FileSystem, join
from ..model_io import ensure_optimizer_built, get_state, set_state
from .background import SparkCall
from .checkpoint import Checkpointer
from .connect import is_connect
from .engines import evaluate_logs
from .stream_ids import FILE as IDS_FILE
from .stream_ids import IdTables, Reset, reset_rows

log = logging.getLogger(__name__)

LATEST = "LATEST"
_KEEP_STATS = 100  # the engine's per-pass stats kept in sm.stats.epochs (a stream has no last epoch)
_CANCEL_WAIT = 60.0  # seconds a timed-out micro-batch gets to end once its jobs are cancelled


class _Stuck(BatchTimeout):
    """A timed-out micro-batch that did not end once cancelled: not retried (its thread still holds the model)."""


@dataclass
class BatchRecord:
    """What happened to one micro-batch."""

    batch_id: int
    rows: int = 0
    seconds: float = 0.0
    logs: dict[str, float] = field(default_factory=dict)
    # metrics of the model before it trained on the batch (prequential evaluation), when asked for
    prequential: dict[str, float] | None = None
    attempts: int = 0
    skipped: str | None = None  # why it was not trained: "committed" (a replay after a restart), "empty"
    error: str | None = None  # why its last attempt failed (the query then stopped)
    version: int | None = None  # the model version published after it
    published_at: float | None = None  # when that version was in place (time.time()): freshness = this - event time
    executors: list[str] = field(default_factory=list)
    # from Spark's progress report for the batch (posted a moment after the sink returns; None until then):
    # offsets the source still held after it (Kafka's maxOffsetsBehindLatest; None where the source does not
    # say, as the file source), and the rates Spark saw: rows arriving and rows the query processed, per second
    reported: bool = False
    lag: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    # dynamic_ids: per id column, the micro-batch's distinct ids, those admitted, rows given to new ids, ids waiting
    # for a row (the table full of recently seen ones) and ids holding a row after it
    ids: dict[str, dict[str, int]] | None = None


@dataclass(frozen=True)
class StreamProgress:
    """What a person watches on a running stream (:meth:`StreamFit.progress`): over the last ``window`` trained
    micro-batches, rows trained per second of training and the prequential metrics' means; the newest lag
    Spark reported; the committed batch and the newest version."""

    trained_batches: int  # micro-batches this process trained
    trained_rows: int
    rows_per_second: float | None  # the window's rows over its micro-batches' seconds
    lag: int | None  # offsets behind the source's end after the newest reported micro-batch (Kafka)
    prequential: dict[str, float]  # each metric's mean over the window (with prequential=True)
    committed: int
    version: int | None
    failed_attempts: int  # attempts that failed and were trained again, all micro-batches together

    def __str__(self) -> str:
        rate = "-" if self.rows_per_second is None else f"{self.rows_per_second:,.0f}"
        metrics = " ".join(f"{k}={v:.4g}" for k, v in self.prequential.items())
        return (f"{self.trained_batches} micro-batches, {self.trained_rows:,} rows, {rate} rows/s, lag "
                f"{'-' if self.lag is None else self.lag}, committed {self.committed}, version {self.version or '-'}"
                + (f", prequential {metrics}" if metrics else ""))


def summarize(batches: Sequence[BatchRecord], committed: int, version: int | None, window: int = 10) -> StreamProgress:
    """:class:`StreamProgress` of ``batches`` (pure: the records alone)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"StreamFit.progress: window must be a positive integer, got {window!r}")
    trained = [b for b in batches if b.skipped is None and b.error is None and b.attempts]
    recent = trained[-window:]
    seconds = sum(b.seconds for b in recent)
    scored = [b.prequential for b in recent if b.prequential]
    metrics = {k: sum(p[k] for p in scored if k in p) / sum(1 for p in scored if k in p)
               for k in dict.fromkeys(k for p in scored for k in p)}
    lag = next((b.lag for b in reversed(batches) if b.reported and b.lag is not None), None)
    return StreamProgress(len(trained), sum(b.rows for b in trained),
                          sum(b.rows for b in recent) / seconds if recent and seconds > 0 else None, lag, metrics,
                          committed, version, sum(max(b.attempts - 1, 0) for b in batches))


@dataclass(frozen=True)
class StreamSettings:
    """``fit_stream``'s own arguments (the engine's come from the SparkModel)."""

    batch_size: int = 32
    passes: int = 1  # training passes over each micro-batch
    publish_every: int | None = None
    publish_dir: str | None = None
    prequential: bool = False
    retries: int = 2
    shuffle: bool = True
    registered_model: str | None = None  # the MLflow model each published version is registered under
    batch_timeout: float | None = None  # seconds a micro-batch's attempt may run before its jobs are cancelled

    def __post_init__(self) -> None:
        for name in ("batch_size", "passes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"fit_stream: {name} must be a positive integer, got {value!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"fit_stream: stream_retries must be a non-negative integer, got {self.retries!r}")
        if (self.publish_every is None) != (self.publish_dir is None):
            raise ConfigError("fit_stream: publish_every and publish_dir go together (how often, and where model versions go)")
        if self.registered_model is not None and (not isinstance(self.registered_model, str) or not self.registered_model
                                                  or self.publish_every is None):
            raise ConfigError(f"fit_stream: registered_model names the MLflow model that published versions are registered "
                              f"under (with publish_every and publish_dir), got {self.registered_model!r}")
        if self.batch_timeout is not None and (isinstance(self.batch_timeout, bool) or not isinstance(self.batch_timeout, (int, float))
                                               or not self.batch_timeout > 0):
            raise ConfigError(f"fit_stream: batch_timeout is the seconds a micro-batch may take (a positive number), "
                              f"got {self.batch_timeout!r}")
        if self.publish_every is not None and (isinstance(self.publish_every, bool) or not isinstance(self.publish_every, int)
                                               or self.publish_every < 1):
            raise ConfigError(f"fit_stream: publish_every must be a positive number of micro-batches, got {self.publish_every!r}")


class StreamFit:
    """A running ``fit_stream``: the ``StreamingQuery`` (``.query``) and the micro-batches it trained.

    ``stop()`` stops the query and releases the engine; ``awaitTermination`` and ``processAllAvailable``
    are the query's. ``batches`` lists a :class:`BatchRecord` per micro-batch this process saw;
    ``committed`` is the last trained batch id (``-1``: none), ``version`` the last published version.
    """

    def __init__(self, trainer: "_Trainer", query: Any):
        self._trainer = trainer
        # micro-batches whose report left Spark's buffer of recent ones unread (a reader that looked too seldom):
        # they stay unreported, and are not looked for again
        self._reports_gone: set[int] = set()
        self.query = query

    @property
    def batches(self) -> list[BatchRecord]:
        self._read_reports()
        return list(self._trainer.batches)

    @property
    def committed(self) -> int:
        return self._trainer.committed

    @property
    def version(self) -> int | None:
        return self._trainer.version

    @property
    def spark_model(self) -> Any:
        return self._trainer.sm

    def progress(self, window: int = 10) -> StreamProgress:
        """Rows/s, lag and rolling prequential metrics over the last ``window`` trained micro-batches
        (``print(fit.progress())`` gives a line)."""
        return summarize(self.batches, self.committed, self.version, window)

    def _read_reports(self) -> None:
        """Spark's progress reports (``query.recentProgress``, kept after the query ends) onto the records that
        lack theirs: the lag and the rates of each micro-batch."""
        waiting = {b.batch_id: b for b in self._trainer.batches if not b.reported and b.batch_id not in self._reports_gone}
        if not waiting:
            return
        try:
            reports = self.query.recentProgress or []
        except Exception as exc:  # noqa: BLE001 - a query whose session is gone: the records stay unreported
            log.debug("fit_stream: no progress reports (%s)", exc)
            return
        for progress in reports:  # oldest first: a micro-batch's own report comes before later idle ones
            record = waiting.pop(progress.get("batchId"), None)
            if record is not None:
                _report(record, progress)
        ids = [p.get("batchId") for p in reports if isinstance(p.get("batchId"), int)]
        if ids:
            self._reports_gone.update(b for b in waiting if b < min(ids))

    def awaitTermination(self, timeout: float | None = None) -> Any:  # noqa: N802 - StreamingQuery's name
        try:
            return self.query.awaitTermination(timeout) if timeout is not None else self.query.awaitTermination()
        finally:
            if not self.query.isActive:
                self._trainer.close()

    def processAllAvailable(self) -> None:  # noqa: N802 - StreamingQuery's name
        self.query.processAllAvailable()

    def exception(self) -> Any:
        return self.query.exception()

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return self.query.isActive

    def stop(self) -> None:
        """Stop the query (an in-flight micro-batch is interrupted; its rows are trained again on restart) and
        release the engine's servers."""
        try:
            self.query.stop()
        finally:
            self._trainer.close()

    def __enter__(self) -> "StreamFit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start(sm: Any, stream_df: Any, settings: StreamSettings, checkpoint_location: str, trigger: dict[str, Any] | None,
          callbacks: Sequence[Any] | None, query_name: str | None, mlflow: bool, dynamic_ids: Any = None) -> StreamFit:
    """Start the query behind ``SparkModel.fit_stream`` (which documents the arguments)."""
    if not getattr(stream_df, "isStreaming", False):
        raise DataError("fit_stream needs a streaming DataFrame (spark.readStream...); for data at rest call fit")
    session = stream_df.sparkSession
    if is_connect(session):
        raise ConfigError("fit_stream needs a classic SparkSession: on Spark Connect, foreachBatch runs in a Python process of "
                          "the server's, away from this session's model and servers")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise ConfigError(f"fit_stream: checkpoint_location must be a path (Spark's offsets and the model's state go there), "
                          f"got {checkpoint_location!r}")
    ids = IdTables(sm.model, dynamic_ids) if dynamic_ids else None
    if ids is not None:
        ids.check(stream_df)
    trainer = _Trainer(sm, settings, checkpoint_location, callbacks, mlflow, session.sparkContext, ids)
    writer = stream_df.writeStream.foreachBatch(trainer).option("checkpointLocation", join(checkpoint_location, "query"))
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    query = writer.start()
    trainer.watch(session, query)
    return StreamFit(trainer, query)


class _Trainer:
    """The query's foreachBatch function: one training pass per micro-batch, committed with its batch id."""

    def __init__(self, sm: Any, settings: StreamSettings, location: str, callbacks: Sequence[Any] | None, mlflow: bool, sc: Any,
                 ids: IdTables | None = None):
        self.sm = sm
        self.settings = settings
        self.location = location
        self.callbacks = list(callbacks or [])
        self.mlflow = mlflow
        self.sc = sc
        self.batches: list[BatchRecord] = []
        self.version: int | None = None
        self._lock = threading.Lock()
        self._session: Any = None  # the open fit session's context manager
        self._engine: Any = None
        self._loop: Any = None
        self._closed = False
        self._listener: Any = None
        self._session_ref: Any = None
        self.ids = ids
        self.checkpointer = Checkpointer(join(location, "model"), sc=sc)
        restored = self.checkpointer.restore(sm.model)
        self.committed = int(restored.info.get("batch_id", -1)) if restored is not None else -1
        self.trained = restored.epochs_done if restored is not None else 0  # micro-batches trained, all runs together
        if restored is not None:
            self._restore_ids(restored.info.get("ids"))
            self.version = restored.info.get("version")
            log.info("fit_stream: resuming after micro-batch %d (%d trained)", self.committed, self.trained)
            latest = latest_version(settings.publish_dir, sc) if settings.publish_dir and self.version else None
            if self.version and (latest is None or latest["version"] < self.version):
                self._publish(self.version, BatchRecord(self.committed))  # committed, but the driver died before publishing it
        ensure_optimizer_built(sm.model)
        self._committed_state = [a.copy() for a in get_state(sm.model)]

    def _restore_ids(self, name: str | None) -> None:
        if (name is None) != (self.ids is None):
            raise ConfigError(f"fit_stream: the checkpoint at {self.location} was written {'with' if name else 'without'} "
                              f"dynamic_ids and this query has {'none' if self.ids is None else 'them'}: the embedding rows "
                              "would mean other ids; use a new checkpoint location")
        if name is not None:
            self.ids.restore(FileSystem(self.sc).read_bytes(join(join(self.location, "model"), name)))

    # ---- the query's lifetime
    def watch(self, session: Any, query: Any) -> None:
        """Release the engine when the query ends, however it ends (stopped through the query itself, failed)."""
        from pyspark.sql.streaming import StreamingQueryListener

        trainer, query_id = self, query.id

        class _Ended(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                if str(event.id) == str(query_id):
                    trainer.close()

        self._listener, self._session_ref = _Ended(), session
        session.streams.addListener(self._listener)
        if not query.isActive:  # ended before the listener was there
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_session(None)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._session_ref.streams.removeListener(self._listener)
            self._listener = None

    def _close_session(self, exc: BaseException | None) -> None:
        if self._session is None:
            return
        cm, self._session, self._engine, self._loop = self._session, None, None, None
        if exc is None:
            cm.__exit__(None, None, None)
        else:
            with contextlib.suppress(BaseException):  # the caller raises or retries with exc itself
                cm.__exit__(type(exc), exc, exc.__traceback__)

    # ---- one micro-batch
    def __call__(self, df: Any, batch_id: int) -> None:
        with self._lock:
            if self._closed:
                raise ConfigError("fit_stream: this stream was stopped")
            record = BatchRecord(int(batch_id))
            self.batches.append(record)
            if batch_id <= self.committed:  # a replay of a micro-batch trained before a restart
                record.skipped = "committed"
                log.info("fit_stream: micro-batch %d was trained and committed before: skipped", batch_id)
                return
            df = df.persist()
            mapped, shared = None, None
            try:
                if df.isEmpty():
                    record.skipped = "empty"
                    return
                resets: list[Reset] = []
                if self.ids is not None:  # the ids' rows: admitted and evicted on the driver, mapped on the executors
                    resets, record.ids = self.ids.observe(df, self.sm.model)
                    mapped, shared = self.ids.mapped(df)
                    mapped = mapped.persist()
                self._train(df if mapped is None else mapped, record, resets)
            except BaseException as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                if mapped is not None:
                    mapped.unpersist()
                if shared is not None:
                    shared.unpersist()
                df.unpersist()

    def _train(self, df: Any, record: BatchRecord, resets: Sequence[Reset] = ()) -> None:
        started = time.perf_counter()
        for attempt in range(self.settings.retries + 1):
            record.attempts = attempt + 1
            try:
                if resets:  # rows given to new ids start afresh (again after a failed attempt: the commit lacks them)
                    reset_rows(self.sm.model, resets)
                    if self._engine is not None:
                        self._engine.reload(self.sm.model)
                logs, stats = self._attempt(df, record)
                break
            except Exception as exc:  # noqa: BLE001 - retried from the committed state, then raised
                self._close_session(exc)
                set_state(self.sm.model, self._committed_state)  # a partial pass leaves nothing behind
                if attempt == self.settings.retries or isinstance(exc, _Stuck):
                    log.error("fit_stream: micro-batch %d failed %d times; the query stops: %s", record.batch_id, attempt + 1, exc)
                    raise
                log.warning("fit_stream: micro-batch %d failed (%s); training it again from the committed state", record.batch_id, exc)
        record.logs = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
        record.rows = stats.samples
        record.executors = stats.executors
        self.trained += 1
        published = self.trained % self.settings.publish_every == 0 if self.settings.publish_every else False
        version = (self.version or 0) + 1 if published else self.version
        # the commit: the model's state with the batch id (and the version it is about to publish); the ids'
        # tables first, in a file of their own that the checkpoint's pointer names
        info = {"batch_id": record.batch_id, "rows": record.rows, "version": version, "stream": True}
        if self.ids is not None:
            info["ids"] = self._save_ids()
        self.checkpointer.save(self.sm.model, self.trained, record.logs, info)
        self.committed = record.batch_id
        self._committed_state = [a.copy() for a in get_state(self.sm.model)]
        if published:
            self._publish(version, record)
        record.seconds = time.perf_counter() - started
        stats_list = self.sm.stats.epochs
        if len(stats_list) > _KEEP_STATS:
            del stats_list[: len(stats_list) - _KEEP_STATS]
        log.info("fit_stream: micro-batch %d: %d rows in %.1f s %s", record.batch_id, record.rows, record.seconds,
                 " ".join(f"{k}={v:.4g}" for k, v in record.logs.items()))

    def _attempt(self, df: Any, record: BatchRecord) -> tuple[dict[str, Any], Any]:
        """One attempt at the micro-batch's passes; with ``batch_timeout``, on a helper thread whose Spark jobs
        are cancelled when it runs longer (a stalled executor, a task that hangs): :class:`BatchTimeout`."""
        timeout = self.settings.batch_timeout
        if timeout is None:
            return self._pass(df, record)
        call = SparkCall(self.sc, lambda: self._pass(df, record), "sparkdl_train-stream",
                         f"sparkdl_train fit_stream: micro-batch {record.batch_id}")
        if call.wait(timeout):
            return call.result()
        log.warning("fit_stream: micro-batch %d still runs after batch_timeout=%g s; cancelling its Spark jobs", record.batch_id, timeout)
        call.cancel(wait=_CANCEL_WAIT)
        if not call.wait(0):
            raise _Stuck(f"micro-batch {record.batch_id} ran longer than batch_timeout={timeout:g} s and did not end within "
                         f"{_CANCEL_WAIT:g} s of its jobs' cancellation; the query stops")
        raise BatchTimeout(f"micro-batch {record.batch_id} ran longer than batch_timeout={timeout:g} s (a stalled executor or "
                           "task?); its Spark jobs were cancelled")

    def _pass(self, df: Any, record: BatchRecord) -> tuple[dict[str, Any], Any]:
        sm = self.sm
        if self._session is None:
            fit_cfg = FitConfig(epochs=1, batch_size=self.settings.batch_size, shuffle=self.settings.shuffle, verbose=0)
            cm = sm._session(df, fit_cfg, self.callbacks, None, None, self.mlflow)
            self._engine, self._loop = cm.__enter__()
            self._session = cm
        else:
            loop = self._loop
            adapter = sm._adapter(df, labelled=True, what="data", config=loop.config)[0]
            loop.train = adapter.with_partitions(loop.launch.workers, shuffle=loop.launch.barrier)
        loop = self._loop
        if self.settings.prequential:
            record.prequential = evaluate_logs(sm.model, loop.train, loop.refs, loop.settings.for_evaluation(),
                                               f"sparkdl_train fit_stream: micro-batch {record.batch_id} scored before training")
        logs: dict[str, Any] = {}
        for p in range(self.settings.passes):
            # the pass's seed is the batch id's: a micro-batch trained again after a restart shuffles the same way
            epoch = record.batch_id * self.settings.passes + p
            logs, stopped = sm._one_epoch(self._engine, loop, epoch, label=f"micro-batch {record.batch_id}")
            if stopped:
                break
        loop.logs = logs
        return logs, sm.stats.epochs[-1]

    def _save_ids(self) -> str:
        fs, folder = FileSystem(self.sc), join(self.location, "model")
        name = f"ids-{self.trained:06d}.bin"
        fs.write_bytes(join(folder, name), self.ids.encode())
        gone = self.trained - self.checkpointer.keep - 1  # the ids of the states the checkpointer keeps, and one more
        old = join(folder, f"ids-{gone:06d}.bin")
        if gone > 0 and fs.exists(old):
            fs.delete(old)
        return name

    def _publish(self, version: int, record: BatchRecord) -> None:
        fs = FileSystem(self.sc)
        where = self.settings.publish_dir
        name = f"v{version:06d}"
        tmp = join(where, f".{name}.tmp")
        if fs.exists(tmp):
            fs.delete(tmp)
        self.sm.save(tmp)
        if self.ids is not None:  # the rows' ids: a reader maps its raw ids with them (stream_ids.map_ids)
            fs.write_bytes(join(tmp, IDS_FILE), self.ids.encode())
        final = join(where, name)
        if fs.exists(final):  # written before a restart that then trained its micro-batch again
            fs.delete(final)
        fs.rename(tmp, final)
        latest = {"version": version, "path": fs.qualified(final), "batch_id": record.batch_id, "trained": self.trained,
                  "offsets": _offsets(fs, self.location, record.batch_id)}
        latest["published_at"] = time.time()  # the moment a reader can load it (once LATEST names it, just below)
        fs.replace_bytes(join(where, LATEST), json.dumps(latest, indent=1).encode())
        self.version = version
        record.version, record.published_at = version, latest["published_at"]
        log.info("fit_stream: model version %d (after micro-batch %d) at %s", version, record.batch_id, latest["path"])
        run = getattr(self._loop, "run", None)
        if run is not None:  # a tracked query: the version in MLflow too (a failure there is logged, not raised)
            run.log_version(self.sm.model, version, latest, self.settings.registered_model)


def _report(record: BatchRecord, progress: Any) -> None:
    """A micro-batch's progress report (Spark's JSON as a dict) onto its record."""
    lags = [(source.get("metrics") or {}).get("maxOffsetsBehindLatest") for source in progress.get("sources") or []]
    lags = [int(float(v)) for v in lags if v is not None]
    record.lag = max(lags) if lags else None
    record.input_rows_per_second = _rate(progress.get("inputRowsPerSecond"))
    record.processed_rows_per_second = _rate(progress.get("processedRowsPerSecond"))
    record.reported = True


def _rate(value: Any) -> float | None:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return None
    return rate if rate == rate else None  # Spark reports NaN for a batch without a previous one


def _offsets(fs: FileSystem, location: str, batch_id: int) -> list[Any] | None:
    """The stream's end offsets for ``batch_id``, from Spark's offset log (``<query checkpoint>/offsets/<id>``:
    a version line, the batch's metadata, then a line per source)."""
    path = join(join(join(location, "query"), "offsets"), str(batch_id))
    try:
        lines = fs.read_bytes(path).decode().splitlines()
    except (FileNotFoundError, OSError):
        return None
    out: list[Any] = []
    for line in lines[2:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


def latest_version(publish_dir: str, sc: Any = None) -> dict[str, Any] | None:
    """``<publish_dir>/LATEST``: the newest complete model version (``None`` before the first)."""
    raw = FileSystem(sc).read_replaced(join(publish_dir, LATEST))
    return None if raw is None else json.loads(raw)
