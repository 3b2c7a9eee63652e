"""Reading a Parquet DataFrame's files straight into the executors' Python workers.

A DataFrame that is nothing but a scan of Parquet files (``spark.read.parquet(path)``, perhaps a
column selection) reaches a fit's tasks through Spark's reader and its Arrow writer: the JVM
decodes every value into a row and writes it out again as Arrow, which on a small machine costs
the JVM as much CPU as the training (and, in a fresh JVM, its JIT compiling that path). For such
a DataFrame the tasks read the files' row groups with pyarrow instead, in columns, and the stage
that runs them is ``spark.range(n)``: Spark still schedules the tasks (barrier stages included),
only the bytes no longer pass through the JVM.

The driver decides (:func:`direct_source`): the optimized plan must be a bare Parquet relation
without partition columns under plain column references, every file on a local filesystem path
(``file:``, as Spark's own reader then needs it on every host), and every used column of a type
whose Arrow form is the one Spark's conversion gives (numbers, booleans, strings, binary, arrays
of those). Anything else keeps Spark's reader. The split of the rows among tasks
(:func:`split_rows`) is pure: contiguous, balanced ranges over the files' row groups in order,
whatever the files' sizes.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

log = logging.getLogger(__name__)

# rows per record batch handed to a task's chunker (Spark's own default for Arrow batches)
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of row group ``row_group`` of file ``path``."""

    path: str
    row_group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class RowSplit:
    """One side of a seeded random split of the rows (``validation_split``): each row is on the
    validation side with probability ``fraction``, decided by a generator seeded with ``seed``, the
    file's path and the row group, so every task and every epoch sees the same rows on each side,
    whatever the pieces a split into tasks cuts."""

    seed: int
    fraction: float
    validation: bool

    def mask(self, path: str, row_group: int, rows: int) -> Any:
        """Which of the row group's ``rows`` rows are on this side (a boolean array)."""
        import zlib

        import numpy as np

        # crc32, not hash(): the same number in every process
        held_out = np.random.default_rng([self.seed, zlib.crc32(path.encode()), row_group]).random(rows) < self.fraction
        return held_out if self.validation else ~held_out


@dataclass(frozen=True)
class ParquetFiles:
    """What tasks need to read a DataFrame's Parquet files: plain data, shipped in the stage's closure."""

    files: tuple[tuple[str, tuple[int, ...]], ...]  # (local path, rows of each row group), in the scan's order
    columns: tuple[str, ...]
    schema: bytes  # the Arrow schema Spark's conversion gives the columns (serialized)
    rows: RowSplit | None = None  # only one side of a seeded split of the rows; None: every row

    @property
    def num_rows(self) -> int:
        return sum(sum(groups) for _, groups in self.files)

    def natural_split(self) -> list[list[Piece]]:
        """One part per file."""
        return [[Piece(path, i, 0, rows) for i, rows in enumerate(groups) if rows] for path, groups in self.files]

    def split(self, n: int) -> list[list[Piece]]:
        return split_rows(self.files, n)

    def random_split(self, fraction: float, seed: int) -> tuple["ParquetFiles", "ParquetFiles"]:
        """The (training, validation) sides of a seeded split; together they hold every row once."""
        return (dataclasses.replace(self, rows=RowSplit(seed, fraction, False)),
                dataclasses.replace(self, rows=RowSplit(seed, fraction, True)))

    def read(self, pieces: Sequence[Piece], batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
        """The rows of ``pieces`` this side holds, as :func:`read_pieces` gives them."""
        return read_pieces(pieces, self.columns, self.schema, batch_rows, rows=self.rows)


def split_rows(files: Sequence[tuple[str, Sequence[int]]], n: int) -> list[list[Piece]]:
    """``n`` parts of contiguous rows, in file and row-group order, whose sizes differ by at most one
    row; every row in exactly one part."""
    if n < 1:
        raise ValueError(f"cannot split rows into {n} parts")
    groups = [(path, i, rows) for path, sizes in files for i, rows in enumerate(sizes) if rows > 0]
    total = sum(rows for _, _, rows in groups)
    bounds = [total * k // n for k in range(n + 1)]  # part k holds global rows [bounds[k], bounds[k+1])
    parts: list[list[Piece]] = [[] for _ in range(n)]
    offset = 0
    k = 0
    for path, group, rows in groups:
        lo, hi = offset, offset + rows
        while k < n and bounds[k + 1] <= lo:
            k += 1
        j = k
        while j < n and bounds[j] < hi:
            start, stop = max(lo, bounds[j]), min(hi, bounds[j + 1])
            if stop > start:
                parts[j].append(Piece(path, group, start - lo, stop - lo))
            j += 1
        offset = hi
    return parts


def read_pieces(pieces: Sequence[Piece], columns: Sequence[str], schema: bytes, batch_rows: int = BATCH_ROWS,
                rows: RowSplit | None = None) -> Iterator[Any]:
    """The pieces' rows (those on ``rows``' side of a split, if given) as record batches of at most
    ``batch_rows`` rows with ``schema`` (executor side). One row group's batches are decoded at a
    time, never a whole part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = pa.ipc.read_schema(pa.py_buffer(schema))
    opened: dict[str, Any] = {}
    for piece in pieces:
        pf = opened.get(piece.path)
        if pf is None:
            opened.clear()  # one file open at a time
            pf = opened[piece.path] = pq.ParquetFile(piece.path)
        keep = None if rows is None else rows.mask(piece.path, piece.row_group, pf.metadata.row_group(piece.row_group).num_rows)
        end = 0  # the row group's rows decoded so far
        for rb in pf.iter_batches(batch_size=batch_rows, row_groups=[piece.row_group], columns=list(columns), use_threads=False):
            first, end = end, end + rb.num_rows  # this batch: rows [first, end) of the row group
            if end <= piece.start:
                continue
            if first >= piece.stop:
                break
            lo, hi = max(first, piece.start), min(end, piece.stop)  # the piece's share of it
            if (lo, hi) != (first, end):
                rb = rb.slice(lo - first, hi - lo)
            if keep is not None:
                rb = rb.filter(pa.array(keep[lo:hi]))
                if rb.num_rows == 0:
                    continue
            yield _conform(rb, target)


def _conform(rb: Any, target: Any) -> Any:
    import pyarrow as pa

    if rb.schema.equals(target):
        return rb
    return pa.RecordBatch.from_arrays([rb.column(i).cast(f.type) for i, f in enumerate(target)], schema=target)


# -- the driver's decision -------------------------------------------------------------------

def direct_source(df: Any, columns: Sequence[str]) -> ParquetFiles | None:
    """The files ``df.select(columns)`` reads, if tasks can read them themselves; ``None`` (and a
    debug log saying why) when the DataFrame needs Spark's reader."""
    try:
        reason = _why_not(df, columns)
        if isinstance(reason, ParquetFiles):
            return reason
    except Exception as exc:  # noqa: BLE001 - any surprise in the plan or the files: Spark's reader
        reason = f"{type(exc).__name__}: {exc}"
    log.debug("DataFrame read through Spark, not directly: %s", reason)
    return None


def _why_not(df: Any, columns: Sequence[str]) -> "str | ParquetFiles":
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return "not a classic DataFrame"
    selected = df.select(*[f"`{c}`" for c in columns])  # a new plan: a cache() since df's own was made applies
    plan = selected._jdf.queryExecution().optimizedPlan()
    while _simple_name(plan) == "Project":
        projections = plan.projectList()
        if any(_simple_name(projections.apply(i)) != "AttributeReference" for i in range(projections.size())):
            return "the plan computes columns"
        plan = plan.child()
    if _simple_name(plan) != "LogicalRelation":
        return f"the plan is a {_simple_name(plan)}, not a bare file scan"
    relation = plan.relation()
    if _simple_name(relation) != "HadoopFsRelation" or _simple_name(relation.fileFormat()) != "ParquetFileFormat":
        return "not a Parquet relation"
    if relation.partitionSchema().length() > 0:
        return "partition columns come from directory names"
    if selected.schema.names != list(columns):  # Spark resolved a name another way (case): its reader knows how
        return f"columns {list(columns)} resolve to {selected.schema.names}"
    expected = to_arrow_schema(selected.schema)
    uris = sorted(df.inputFiles())  # a fixed order: part k of a split is the same rows every time
    if not uris:
        return "no files"
    files = []
    for uri in uris:
        path = _local_path(uri)
        if path is None:
            return f"{uri} is not on a local filesystem"
        meta = pq.read_metadata(path)
        file_schema = meta.schema.to_arrow_schema()
        for field in expected:
            if field.name not in file_schema.names:
                return f"{path} has no column {field.name!r}"
            if not _readable_as(file_schema.field(field.name).type, field.type):
                return f"column {field.name!r} is {file_schema.field(field.name).type} in {path}, Spark gives {field.type}"
        files.append((path, tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))))
    return ParquetFiles(tuple(files), tuple(columns), expected.serialize().to_pybytes())


def _simple_name(obj: Any) -> str:
    return obj.getClass().getSimpleName()


def _local_path(uri: str) -> str | None:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "" and uri.startswith("/"):
        return uri
    return None


def _readable_as(found: Any, wanted: Any) -> bool:
    """Whether a file's Arrow type holds exactly the values Spark's conversion gives as ``wanted``
    (a list's field name and a string's offset width aside)."""
    import pyarrow as pa

    t = pa.types
    if t.is_list(wanted) or t.is_large_list(wanted):
        return (t.is_list(found) or t.is_large_list(found)) and _readable_as(found.value_type, wanted.value_type)
    if t.is_string(wanted) or t.is_large_string(wanted):
        return t.is_string(found) or t.is_large_string(found)
    if t.is_binary(wanted) or t.is_large_binary(wanted):
        return t.is_binary(found) or t.is_large_binary(found)
    if t.is_integer(wanted) or t.is_floating(wanted) or t.is_boolean(wanted):
        return found.equals(wanted)
    return False
