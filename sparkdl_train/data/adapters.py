"""Data adapters: one interface over Spark RDDs, Spark DataFrames and arrays.

An adapter knows how to run a *task* over each partition of its data, feeding
the task a stream of chunks ``(x, y, sample_weight)`` and merging what the
tasks return. Executors receive plain data only (the task and, for DataFrames,
the column mapping).

* :class:`RDDAdapter` - Elephas-style RDD of ``(x, y)`` / ``(x, y, w)`` rows.
* :class:`DataFrameAdapter` - named columns, read through ``mapInArrow``: record
  batches become numpy arrays column by column, never Python rows.
* :class:`ArrayAdapter` - numpy arrays split into in-process partitions; used for
  small validation sets held by the driver and as the fake backend in tests.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import weakref
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import DataError, FitCancelled, WorkerError
from ..failures import Cause, classify
from ..merge import Partial, merge_partials
from .batching import Batch, num_rows, rows_to_chunks, take_rows, tree_concat
from .parquet import ParquetFiles, Piece, direct_source
from .prefetch import ordered_map
from .sampling import read_first_rows
from .sessions import LocalRef, is_connect_session, session_context
from .spec import STRING, ColumnMapping

log = logging.getLogger(__name__)

PartitionTask = Callable[[int, Iterable[Batch]], Partial]
BarrierTask = Callable[[int, Iterable[Batch], Any], Partial]


# a DataFrame stage with at most this many partitions sends its partials to the driver to merge
# (one state per partition held there at once); a wider one merges them with treeReduce
DRIVER_MERGE_PARTITIONS = 16

# the sample of a persisted RDD or DataFrame, by its object: it holds the same rows at every read
# (a lost block is recomputed from its lineage, deterministic by Spark's contract), so the fits on
# it sample it once (an RDD's sample job could read a whole small partition, 0.1-0.2 s for 90k
# rows; a DataFrame's limit query took 0.05-0.15 s beside a later fit's prepare job); data that is
# not persisted (or no longer) is sampled again by every fit. Keyed by what was sampled: (rows,
# labelled) for an RDD, (rows, columns) for a DataFrame; the DataFrame's is the Arrow batch.
_persisted_samples: "weakref.WeakKeyDictionary[Any, tuple[tuple, Any]]" = weakref.WeakKeyDictionary()


def _persisted_sample(data: Any, key: tuple, take: Callable[[], Any]) -> tuple[Any, bool]:
    """``(take(), False)``, or ``(what it gave for key, True)`` when ``data`` was persisted then
    and still is."""
    persisted = bool(getattr(data, "is_cached", False))  # cache() / persist(), until unpersist()
    known = _persisted_samples.get(data) if persisted else None
    if known is not None and known[0] == key:
        return known[1], True
    value = take()
    if persisted:
        _persisted_samples[data] = (key, value)
    return value, False


def _merge_all(partials: Iterable[Partial]) -> Partial:
    total = Partial()
    for p in partials:
        total = total.merge(p)
    return total


class DataAdapter(ABC):
    """The single interface the driver's engines use to reach data."""

    @abstractmethod
    def num_partitions(self) -> int: ...

    @abstractmethod
    def with_partitions(self, n: int, shuffle: bool = False) -> "DataAdapter":
        """The same data in ``n`` partitions (coalesced, or repartitioned if it had fewer;
        ``shuffle=True`` always repartitions: barrier stages refuse coalesced inputs)."""

    @abstractmethod
    def random_split(self, fraction: float, seed: int) -> tuple["DataAdapter", "DataAdapter"]:
        """(1 - fraction, fraction) split, seeded."""

    @abstractmethod
    def sample(self, n: int) -> Batch:
        """Up to ``n`` rows on the driver, converted exactly as tasks see them."""

    @abstractmethod
    def share(self, value: Any, beside: Sequence[Any] = ()) -> Any:
        """Make ``value`` available to tasks as ``ref.value`` (a broadcast on Spark). ``beside``:
        refs shared before it that the same stages carry too (what a Spark Connect stage's plan
        must hold at once)."""

    @abstractmethod
    def map_reduce(self, task: PartitionTask, description: str) -> Partial:
        """Run ``task`` on every partition and merge the partials."""

    @abstractmethod
    def barrier_map(self, task: BarrierTask, description: str) -> Partial:
        """Run ``task(partition, chunks, barrier)`` on every partition at once, as one barrier
        stage, and merge the partials. ``barrier`` is the task's ``BarrierTaskContext`` (``None``
        for in-process data): what the task builds on it (a ring) is the task's business."""

    @abstractmethod
    def predict(self, make_model: Callable[[], Any], predict: Callable[[Any, Any], Any], columns: list) -> Any:
        """Predictions as the natural distributed type (DataFrame column(s), RDD of arrays)."""

    def spark_context(self) -> Any:
        """The SparkContext the data lives in (``None`` for in-process arrays)."""
        return None

    def spark_session(self) -> Any:
        """The SparkSession whose DataFrame (Arrow) stages read the data; ``None`` when the data's
        stages are RDD stages or run in process. Spark runs the two kinds of stage in separate
        Python worker pools: the preflight warms the one this returns."""
        return None

    def parallel_tasks(self) -> int:
        """How many tasks a stage over the data runs (what a task's thread count is sized by)."""
        return self.num_partitions()

    def known_partitions(self) -> int | None:
        """The partition count if asking costs no job (``None`` otherwise: a Spark Connect DataFrame's)."""
        return self.num_partitions()

    # how tasks read the rows (FitStats.data_source)
    source = "arrays"

    # how the last sample() read its rows (FitStats.sample_source): "jvm" (an RDD's pickled frames
    # taken by the JVM, no Python task), "python" (Python tasks read an RDD's first partitions),
    # "query" (a DataFrame's limit query), "files" (a DataFrame's first Parquet row group, read
    # by the driver), "kept" (a persisted dataset's earlier sample), "arrays"; None before any
    sampled_by: str | None = None

    # whether sample() is a query the driver runs with no code of ours on the executors (a
    # DataFrame's limit), cheap to cancel: a fit then starts it before serializing the model (an
    # RDD's sample job, which could read a whole small partition in Python, gained nothing there:
    # it took the driver's cores from the serialization)
    sample_first = False

    def empty_batch(self) -> Batch | None:
        """A batch of zero rows with the structure, row shapes and dtypes of every batch this data
        gives, known without reading it (a DataFrame's column types); ``None`` when only the data
        can tell. Executors trace a model's steps from it while the driver still prepares a fit
        (:mod:`sparkdl_train.driver.prepare`)."""
        return None

    def read_once(self, description: str) -> tuple["DataAdapter", Any]:
        """This data as a fit of several epochs reads it (``data.cacheRdd``) and what to release when the fit
        ends (``None``: nothing); only an RDD of rows is read once (:class:`CachedChunksAdapter`)."""
        return self, None

    def unshare(self, ref: Any) -> None:
        """Releases what :meth:`share` shared; best effort: after the application was killed under a fit, the
        release fails on a stopped context (a NullPointerException from Spark's BlockManagerMaster), and that
        must not replace the error that ended the fit."""
        unpersist = getattr(ref, "unpersist", None)
        if unpersist is None:
            return
        try:
            unpersist()
        except Exception as exc:  # noqa: BLE001 - logged; the fit's own outcome stands
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith(":")), str(exc)[:200])
            log.warning("could not release a broadcast of the fit (is the SparkContext stopped?): %s", first[:300])


# -- Spark helpers -----------------------------------------------------------------

@contextlib.contextmanager
def _spark_job(sc: Any, description: str) -> Iterator[None]:
    """Label the job in the Spark UI and turn a failed job into FitCancelled or a WorkerError
    carrying its typed cause (:mod:`sparkdl_train.failures`)."""
    old = sc.getLocalProperty("spark.job.description")
    sc.setLocalProperty("spark.job.description", description)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - classified below
        failure = classify(exc)
        if failure is None:
            raise
        if failure.cause is Cause.CANCELLED:
            raise FitCancelled(f"{description} was cancelled: {failure.summary}") from None
        summary = f"{description} failed on an executor"
        if failure.summary:
            summary += f": {failure.summary}"
        raise WorkerError(summary, {failure.partition: failure.text}, cause=failure.cause.value) from exc
    finally:
        sc.setLocalProperty("spark.job.description", old)


def _arrow_partials(out: Any) -> Iterator[Partial]:
    """The partials of a one-column ``partial binary`` DataFrame, collected as Arrow: its
    ``collect()`` turns every value into a Python row through the JVM's pickler, which took
    0.35 s longer for two 4 MB partials (every epoch of a synchronous fit)."""
    column = out.toArrow().column(0)
    for chunk in column.chunks:
        for i in range(len(chunk)):
            yield Partial.from_bytes(chunk[i].as_buffer())


def _tree_reduce(rdd: Any) -> Partial:
    return rdd.treeReduce(merge_partials, depth=2)


# -- RDD ---------------------------------------------------------------------------

class RDDAdapter(DataAdapter):
    source = "rdd"

    def __init__(self, rdd: Any, labelled: bool = True, chunk_rows: int = 256):
        self.rdd = rdd
        self.labelled = labelled
        self.chunk_rows = chunk_rows
        self._partitions: int | None = None

    def _like(self, rdd: Any) -> "RDDAdapter":
        return RDDAdapter(rdd, self.labelled, self.chunk_rows)

    def spark_context(self) -> Any:
        return self.rdd.context

    def num_partitions(self) -> int:
        if self._partitions is None:  # adapters are immutable: ask Spark once
            self._partitions = self.rdd.getNumPartitions()
        return self._partitions

    def with_partitions(self, n: int, shuffle: bool = False) -> "RDDAdapter":
        current = self.num_partitions()
        if current == n:
            return self
        return self._like(self.rdd.coalesce(n) if current > n and not shuffle else self.rdd.repartition(n))

    def random_split(self, fraction: float, seed: int):
        a, b = self.rdd.randomSplit([1.0 - fraction, fraction], seed=seed)
        return self._like(a), self._like(b)

    def sample(self, n: int) -> Batch:
        batch, kept = _persisted_sample(self.rdd, (n, self.labelled), lambda: self._sample(n))
        if kept:
            self.sampled_by = "kept"
        return batch

    def _sample(self, n: int) -> Batch:
        rows, self.sampled_by = read_first_rows(self.rdd, n)
        if not rows:
            raise DataError("the RDD is empty")
        try:
            return next(rows_to_chunks(rows, n, self.labelled))
        except ValueError as exc:
            raise DataError(str(exc)) from None

    def share(self, value: Any, beside: Sequence[Any] = ()) -> Any:
        return self.rdd.context.broadcast(value)

    def _reader(self) -> Callable[[Iterator], Iterator[Batch]]:
        """What turns a partition's items into the chunks a task trains on (plain data: it travels to the executors)."""
        chunk_rows, labelled = self.chunk_rows, self.labelled
        return lambda rows: rows_to_chunks(rows, chunk_rows, labelled)

    def map_reduce(self, task: PartitionTask, description: str) -> Partial:
        read = self._reader()

        def run(index: int, rows: Iterator) -> Iterator[Partial]:
            yield task(index, read(rows))

        with _spark_job(self.rdd.context, description):
            return _tree_reduce(self.rdd.mapPartitionsWithIndex(run))

    def barrier_map(self, task: BarrierTask, description: str) -> Partial:
        read = self._reader()

        def run(rows: Iterator) -> Iterator[bytes]:
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            yield task(ctx.partitionId(), read(rows), ctx).to_bytes()

        with _spark_job(self.rdd.context, description):
            blobs = self.rdd.barrier().mapPartitions(run).collect()
        return _merge_all(Partial.from_bytes(b) for b in blobs)

    def read_once(self, description: str) -> tuple["RDDAdapter", Any]:
        """The RDD's chunks encoded (:mod:`sparkdl_train.data.chunk_cache`), persisted and read in one job now:
        the adapter the epochs read, and the persisted RDD (unpersisted by :meth:`unshare`)."""
        from pyspark import StorageLevel

        from . import chunk_cache

        read = self._reader()

        def encoded(rows: Iterator) -> Iterator[bytes]:
            try:
                for chunk in read(rows):
                    yield chunk_cache.encode(chunk)
            except chunk_cache.ChunkEncodingError as exc:
                raise DataError(f"{exc}: the RDD cannot be kept for the fit's epochs (set spark.sparkdl_train.data.cacheRdd=false "
                                "to read it again every epoch)") from None

        chunks = self.rdd.mapPartitions(encoded, preservesPartitioning=True)
        chunks.setName(f"sparkdl_train: {description}")
        chunks.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with _spark_job(self.rdd.context, description):
                # materialized by the JVM's count (of Python's pickled frames): a Python stage after the persisted one would
                # take Python workers of its own, and the epochs' tasks, given the longest idle ones first, would then land
                # in workers with no model rebuilt
                chunks._jrdd.count()
        except BaseException:
            self.unshare(chunks)
            raise
        adapter = CachedChunksAdapter(chunks, self.labelled, self.chunk_rows)
        adapter._partitions = self._partitions
        return adapter, chunks

    def predict(self, make_model, predict, columns):
        chunk_rows = self.chunk_rows
        keys = [c.key for c in columns]

        def run(rows: Iterator) -> Iterator:
            model = None
            for x, _, _ in rows_to_chunks(rows, chunk_rows, labelled=False):
                model = model or make_model()
                out = predict(model, x)
                if keys == [None]:
                    yield from out
                else:
                    parts = [out[k] for k in keys]
                    yield from zip(*parts)

        return self.rdd.mapPartitions(run)


class CachedChunksAdapter(RDDAdapter):
    """An RDD of rows read once (:meth:`RDDAdapter.read_once`): ``rdd`` holds its chunks, encoded
    (:mod:`sparkdl_train.data.chunk_cache`) and persisted; the tasks get the chunks the rows made."""

    source = "rdd"

    def _like(self, rdd: Any) -> "CachedChunksAdapter":
        return CachedChunksAdapter(rdd, self.labelled, self.chunk_rows)

    def read_once(self, description: str) -> tuple["CachedChunksAdapter", Any]:
        return self, None

    def random_split(self, fraction: float, seed: int):
        raise NotImplementedError("a read-once RDD is split before it is read")

    def sample(self, n: int) -> Batch:
        raise NotImplementedError("a read-once RDD is sampled before it is read")

    def _reader(self) -> Callable[[Iterator], Iterator[Batch]]:
        from .chunk_cache import decode

        return lambda blobs: map(decode, blobs)

    def predict(self, make_model, predict, columns):
        raise NotImplementedError("predict() reads the RDD it is given")


# -- DataFrame -----------------------------------------------------------------------

def check_schema(schema: Any, mapping: ColumnMapping) -> None:
    """Fail on the driver when a column is missing or not numeric (string and binary columns may
    feed a Keras string input; with a transform, its output is checked on the sample instead)."""
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in schema.fields}
    if mapping.transform is not None:
        return

    def text(dt: Any) -> bool:
        if isinstance(dt, (T.StringType, T.BinaryType)):
            return True
        return isinstance(dt, T.ArrayType) and text(dt.elementType)

    def numeric(dt: Any) -> bool:
        if isinstance(dt, (T.NumericType, T.BooleanType)):
            return True
        if isinstance(dt, T.ArrayType):
            return numeric(dt.elementType)
        return getattr(dt, "typeName", lambda: "")() == "vector" or type(dt).__name__ == "VectorUDT"

    labels = getattr(mapping.label, "specs", (mapping.label,))  # a label per output (LabelsPerOutput), or one
    for spec in (*mapping.inputs, *labels, mapping.sample_weight):
        if spec is None:
            continue
        for col in spec.columns:
            if col not in fields:
                raise DataError(
                    f"column {col!r} (for {spec.name!r}) is not in the DataFrame; columns are {sorted(fields)}"
                )
            if spec.dtype == STRING and text(fields[col]):
                continue
            if not numeric(fields[col]):
                if text(fields[col]):
                    raise DataError(
                        f"column {col!r} (for {spec.name!r}) has type {fields[col].simpleString()}, but the model's "
                        f"input {spec.name!r} is numeric ({spec.dtype}): decode the column with a transform "
                        "(fit(..., transform=fn)), or give the model a string input (keras.Input(dtype='string'))"
                    )
                raise DataError(
                    f"column {col!r} (for {spec.name!r}) has type {fields[col].simpleString()}; "
                    "only numeric, boolean, array-of-numeric and ML vector columns can be fed to a model"
                )


def row_shape(dt: Any) -> tuple[int, ...] | None:
    """The row shape a Spark column type fixes without data: ``()`` for scalars (numbers,
    booleans, decimals, strings, bytes), ``None`` for arrays and vectors (their length is the data's)."""
    from pyspark.sql import types as T

    if isinstance(dt, (T.NumericType, T.BooleanType, T.StringType, T.BinaryType)):
        return ()
    return None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DataFrameAdapter(DataAdapter):
    sample_first = True

    def __init__(self, df: Any, mapping: ColumnMapping, partitions: int | None = None,
                 files: ParquetFiles | None = None, parts: list[list[Piece]] | None = None, read_files: bool = False):
        self.df = df
        self.mapping = mapping
        # a DataFrame's partition count costs a query plan (df.rdd: 0.1 s warm, ~0.9 s in a fresh
        # JVM); with_partitions knows it, so the epochs' jobs never plan the query for it
        self._partitions: int | None = partitions
        # read straight from its Parquet files (sparkdl_train.data.parquet): the files, each task's
        # pieces; with read_files, whether it can is decided when first needed (a fit's sample
        # job asks first, on its helper thread, beside the model's serialization)
        self._files: Any = files if files is not None else (_UNDECIDED if read_files else None)
        self._parts = parts
        self._deciding = threading.Lock()
        check_schema(df.schema, mapping)

    def _like(self, df: Any, partitions: int | None = None) -> "DataFrameAdapter":
        return DataFrameAdapter(df, self.mapping, partitions)

    def reading_files(self) -> "DataFrameAdapter":
        """The same data, read by the tasks from its Parquet files with pyarrow if the DataFrame is
        a bare scan of local Parquet files (:func:`sparkdl_train.data.parquet.direct_source`),
        decided when first needed."""
        if self._files is not None:
            return self
        clone = copy.copy(self)  # the schema is checked already
        clone._files, clone._deciding = _UNDECIDED, threading.Lock()
        return clone

    @property
    def files(self) -> ParquetFiles | None:
        """The Parquet files tasks read themselves; ``None``: Spark's reader."""
        if self._files is _UNDECIDED:
            with self._deciding:
                if self._files is _UNDECIDED:
                    self._files = direct_source(self.df, self.mapping.columns())
        return self._files

    def _task_parts(self) -> list[list[Piece]] | None:
        files = self.files
        if files is None:
            return None
        return self._parts if self._parts is not None else files.natural_split()

    @property
    def source(self) -> str:
        """How tasks read the rows: ``"parquet"`` (the files, directly) or ``"spark"`` (Spark's reader)."""
        return "parquet" if self.files is not None else "spark"

    @property
    def _sc(self) -> Any:
        """The SparkContext, or on a Spark Connect session its stand-in (:mod:`sparkdl_train.driver.connect`)."""
        return session_context(self.df.sparkSession)

    @property
    def _connect(self) -> bool:
        return is_connect_session(self.df.sparkSession)

    def spark_context(self) -> Any:
        return self._sc

    def spark_session(self) -> Any:
        return self.df.sparkSession

    def num_partitions(self) -> int:
        parts = self._task_parts()
        if parts is not None:
            return len(parts)
        if self._partitions is None:  # adapters are immutable; df.rdd is not free, ask once
            if self._connect:  # no plan to ask on Connect: count the partitions' ids (a query, no Python)
                from pyspark.sql import functions as F

                row = self.df.select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("p")).collect()[0]
                self._partitions = 1 if row["p"] is None else int(row["p"]) + 1
            else:
                self._partitions = self.df.rdd.getNumPartitions()
        return self._partitions

    def parallel_tasks(self) -> int:
        return self.known_partitions() or int(self._sc.defaultParallelism)  # not worth a query of its own

    def known_partitions(self) -> int | None:
        if self._partitions is None and self.files is None and self._connect:
            return None  # a query over the data on Connect
        return self.num_partitions()

    def with_partitions(self, n: int, shuffle: bool = False) -> "DataFrameAdapter":
        if self.files is not None:  # balanced ranges of rows, no shuffle needed
            return DataFrameAdapter(self.df, self.mapping, files=self.files, parts=self.files.split(n))
        if self._partitions is None and self._connect:
            # on Connect the count is a query over the data; a fit's repartition makes it known
            return self._like(self.df.repartition(n), partitions=n)
        current = self.num_partitions()
        if current == n:
            return self
        if current > n and not shuffle:  # Spark's coalesce drops groups it could not fill: ask
            return self._like(self.df.coalesce(n))
        return self._like(self.df.repartition(n), partitions=n)  # an explicit count: AQE keeps it

    def random_split(self, fraction: float, seed: int):
        if self.files is not None:  # each side read from the files too: a seeded choice of rows per row group
            a, b = self.files.random_split(fraction, seed)
            return DataFrameAdapter(self.df, self.mapping, files=a), DataFrameAdapter(self.df, self.mapping, files=b)
        a, b = self.df.randomSplit([1.0 - fraction, fraction], seed=seed)  # partition by partition
        return self._like(a, self._partitions), self._like(b, self._partitions)

    def _selected(self) -> Any:
        return self.df.select(*[_quoted(c) for c in self.mapping.columns()])

    def empty_batch(self) -> Batch | None:
        return self.mapping.empty_batch({f.name: row_shape(f.dataType) for f in self.df.schema.fields})

    def sample(self, n: int) -> Batch:
        if self.files is not None:  # the first rows as tasks read them, no job
            self.sampled_by = "files"
            f = self.files
            rb = next(f.read(f.split(1)[0], batch_rows=n), None)
            if rb is None or rb.num_rows == 0:
                raise DataError("the DataFrame is empty")
        else:
            rb, kept = _persisted_sample(self.df, (n, tuple(self.mapping.columns())), lambda: self._first_batch(n))
            self.sampled_by = "kept" if kept else "query"
        return self.mapping.batch_from_arrow(rb, f"the driver's sample of the first {rb.num_rows} rows")

    def _first_batch(self, n: int) -> Any:
        table = self._selected().limit(n).toArrow()
        if table.num_rows == 0:
            raise DataError("the DataFrame is empty")
        return table.combine_chunks().to_batches()[0]

    def share(self, value: Any, beside: Sequence[Any] = ()) -> Any:
        sc = self._sc
        if self._connect:  # in the stage's plan: within Connect's message limit
            sc.check_size(_shared_what(value), _shared_bytes(value), sum(_shared_bytes(getattr(b, "value", b)) for b in beside))
        return sc.broadcast(value)

    def map_reduce(self, task: PartitionTask, description: str) -> Partial:
        import pyarrow as pa

        mapping = self.mapping
        stage, read = self._stage()

        def run(batches: Iterator) -> Iterator:
            from pyspark import TaskContext

            pid = TaskContext.get().partitionId()
            partial = task(pid, mapping.chunks(read(batches, pid), pid))
            yield pa.RecordBatch.from_arrays([pa.array([partial.to_bytes()], pa.binary())], ["partial"])

        out = stage.mapInArrow(run, "partial binary")
        with _spark_job(self._sc, description):
            if self._connect or self.num_partitions() <= DRIVER_MERGE_PARTITIONS:  # Connect: no RDD to tree-reduce
                # straight through the JVM to the driver: the stage runs no RDD Python worker
                # beside the Arrow one, so a task always lands in a worker that ran this fit's
                # tasks before (its model cached), also when RDD and Arrow tasks share a daemon
                return _merge_all(_arrow_partials(out))
            return _tree_reduce(out.rdd.map(lambda row: Partial.from_bytes(row[0])))

    def barrier_map(self, task: BarrierTask, description: str) -> Partial:
        import pyarrow as pa

        mapping = self.mapping
        stage, read = self._stage()

        def run(batches: Iterator) -> Iterator:
            from pyspark import BarrierTaskContext

            ctx = BarrierTaskContext.get()
            pid = ctx.partitionId()
            partial = task(pid, mapping.chunks(read(batches, pid), pid), ctx)
            yield pa.RecordBatch.from_arrays([pa.array([partial.to_bytes()], pa.binary())], ["partial"])

        out = stage.mapInArrow(run, "partial binary", barrier=True)
        with _spark_job(self._sc, description):
            return _merge_all(_arrow_partials(out))

    def _stage(self) -> tuple[Any, Callable[[Iterator, int], Iterator]]:
        """The DataFrame a stage maps over and how a task turns its input into the data's record
        batches: the selected columns themselves, or (reading the files) one id per task, whose
        task reads its pieces."""
        parts = self._task_parts()
        if parts is None:
            return self._selected(), _as_given
        files = self.files  # plain data for the tasks
        n = len(parts)

        def read(ids: Iterator, pid: int) -> Iterator:
            for _ in ids:  # read the input to its end: a worker that leaves it unread is not reused
                pass
            return files.read(parts[pid])

        return self.df.sparkSession.range(0, n, 1, n), read

    def predict(self, make_model, predict, columns):  # appends to the rows: always Spark's reader
        from pyspark.sql import types as T

        existing = set(self.df.columns)
        clash = [c.name for c in columns if c.name in existing]
        if clash:
            raise DataError(f"prediction column(s) {clash} already exist in the DataFrame; pass another prediction_col")
        schema = T.StructType(
            list(self.df.schema.fields) + [T.StructField(c.name, c.spark_type(), nullable=False) for c in columns]
        )
        mapping = self.mapping.without_labels()
        transform = mapping.transform

        def run(batches: Iterator) -> Iterator:
            from pyspark import TaskContext

            pid = TaskContext.get().partitionId()
            model = None

            def numbered() -> Iterator[tuple[int, Any]]:
                offset = 0
                for rb in batches:
                    if rb.num_rows:
                        yield offset, rb
                    offset += rb.num_rows

            def inputs(item: tuple[int, Any]) -> tuple[Any, Any]:  # runs ahead on the transform's thread(s)
                start, rb = item
                where = f"partition {pid}, rows {start}-{start + rb.num_rows - 1}"
                x = mapping.x_from_arrow(rb, where)
                rows = num_rows((x,))
                if rows != rb.num_rows:
                    raise DataError(f"transform {transform.name} returned {rows} rows for {rb.num_rows} on {where}; "
                                    "predict appends one prediction per input row, so its transform must keep every row")
                return rb, x

            # with a transform, the next batches are transformed while this one is predicted
            prepared = ordered_map(inputs, numbered(), transform.threads + 1) if transform is not None else map(inputs, numbered())
            for rb, x in prepared:
                model = model or make_model()
                out = predict(model, x)
                for c in columns:
                    rb = rb.append_column(c.name, c.to_arrow(out))
                yield rb

        return self.df.mapInArrow(run, schema)


_UNDECIDED = object()


def _shared_bytes(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return sum(len(v) for v in vars(value).values() if isinstance(v, (bytes, bytearray))) if hasattr(value, "__dict__") else 0


def _shared_what(value: Any) -> str:
    return "the model's archive" if hasattr(value, "archive") else "the model's state (weights and optimizer)"


def _as_given(batches: Iterator, pid: int) -> Iterator:
    return batches


# -- in-process arrays (driver-held validation data; fake backend for tests) --------------

class ArrayAdapter(DataAdapter):
    """Arrays split into ``partitions`` contiguous slices, run in this process."""

    def __init__(self, x: Any, y: Any = None, sample_weight: Any = None, partitions: int = 1, chunk_rows: int = 1024):
        self.data: Batch = (x, y, sample_weight)
        self.n = num_rows(self.data)
        self.partitions = partitions
        self.chunk_rows = chunk_rows

    def _like(self, data: Batch, partitions: int | None = None) -> "ArrayAdapter":
        return ArrayAdapter(*data, partitions=partitions or self.partitions, chunk_rows=self.chunk_rows)

    def num_partitions(self) -> int:
        return self.partitions

    def with_partitions(self, n: int, shuffle: bool = False) -> "ArrayAdapter":
        return self._like(self.data, n)

    def random_split(self, fraction: float, seed: int):
        perm = np.random.default_rng(seed).permutation(self.n)
        cut = self.n - int(round(self.n * fraction))
        return self._like(take_rows(self.data, perm[:cut])), self._like(take_rows(self.data, perm[cut:]))

    def sample(self, n: int) -> Batch:
        self.sampled_by = "arrays"
        if self.n == 0:
            raise DataError("the arrays are empty")
        return take_rows(self.data, slice(0, n))

    def share(self, value: Any, beside: Sequence[Any] = ()) -> LocalRef:
        return LocalRef(value)

    def _bounds(self) -> list[tuple[int, int]]:
        edges = np.linspace(0, self.n, self.partitions + 1).astype(int)
        return list(zip(edges[:-1], edges[1:]))

    def _chunks(self, lo: int, hi: int) -> Iterator[Batch]:
        for s in range(lo, hi, self.chunk_rows):
            yield take_rows(self.data, slice(s, min(hi, s + self.chunk_rows)))

    def map_reduce(self, task: PartitionTask, description: str) -> Partial:
        return _merge_all(task(pid, self._chunks(lo, hi)) for pid, (lo, hi) in enumerate(self._bounds()))

    def barrier_map(self, task: BarrierTask, description: str) -> Partial:
        if self.partitions != 1:
            raise DataError(
                f"{description}: in-process arrays run as one rank; a ring of {self.partitions} ranks "
                "needs a DataFrame or an RDD"
            )
        return task(0, self._chunks(0, self.n), None)

    def predict(self, make_model, predict, columns):
        model = make_model()
        outs = [predict(model, chunk[0]) for chunk in self._chunks(0, self.n)]
        return tree_concat(outs) if outs else None


def is_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema") and hasattr(data, "sparkSession")


def is_rdd(data: Any) -> bool:
    return hasattr(data, "mapPartitionsWithIndex") and hasattr(data, "context")
