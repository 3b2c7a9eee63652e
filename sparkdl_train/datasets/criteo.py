"""Criteo's own click-log format: read it, count what is malformed, and write it from the planted generator.

The format (Kaggle's ``train.txt`` and the 1TB ``day_N`` files): one example per line, tab
separated, no header: the label (0/1), 13 integer fields (``I1..I13``, may be negative) and
26 categorical fields (``C1..C26``, 32-bit hashes written as 8 hexadecimal digits); an empty
field is a missing value. Files may be gzip-compressed (Hadoop picks the codec by suffix).

:func:`read_tsv` parses it with Spark SQL on the executors into the columns the Parquet path
has (``label`` int, ``I*`` float, ``C*`` bigint with nulls for missing), and classifies each
line that does not fit the format (wrong field count, label not 0/1, a non-integer ``I``, a
non-hexadecimal ``C``). Malformed lines are counted per reason and reported, or fail the
read with ``on_malformed="fail"``; they are never dropped silently.

:func:`write_tsv` writes the planted-model data (:mod:`.ctr`) in exactly that format, so the
tests and the job cover it without downloads: categorical ids become 8-hex-digit values by a
per-field bijection (the vocabulary sees the same structure), and a fraction of fields can be
left empty.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DataError
from . import ctr

log = logging.getLogger(__name__)

N_FIELDS = 1 + ctr.N_DENSE + ctr.N_CAT  # 40
ON_MALFORMED = ("count", "fail")
_MULT = 2654435761  # odd: multiplication modulo 2**32 is a bijection


def hex_ids(ids: np.ndarray, field_index: int) -> np.ndarray:
    """Planted category ids -> 32-bit values, a bijection per field (Criteo's hashed values)."""
    return ((ids.astype(np.uint64) * np.uint64(_MULT) + np.uint64(40503 * (field_index + 1))) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def tsv_lines(cols: dict[str, np.ndarray], missing_rate: float, rng: np.random.Generator) -> list[str]:
    """Criteo lines for one generated block (:func:`sparkdl_train.datasets.ctr.generate_block`)."""
    n = len(cols["label"])
    fields = [cols["label"].astype(np.int64).astype(str)]
    for c in ctr.DENSE_COLS:
        fields.append(cols[c].astype(np.int64).astype(str))
    for f, c in enumerate(ctr.CAT_COLS):
        fields.append(np.char.mod("%08x", hex_ids(cols[c], f)))
    table = np.stack(fields, axis=1).astype(object)
    if missing_rate > 0:
        holes = rng.random((n, N_FIELDS - 1)) < missing_rate
        table[:, 1:][holes] = ""
    return ["\t".join(row) for row in table]


def write_tsv(spark: Any, spec: ctr.CTRSpec, path: str, missing_rate: float = 0.02, compression: str | None = "gzip",
              partitions: int | None = None) -> None:
    """The planted data of ``spec`` as Criteo TSV files under ``path`` (gzip by default)."""
    import pyarrow as pa

    def lines(batches):
        for rb in batches:
            cols = {name: rb.column(name).to_numpy(zero_copy_only=False) for name in rb.schema.names}
            rng = np.random.default_rng([spec.seed, 2, int(cols["id"][0]) if len(cols["id"]) else 0])
            yield pa.RecordBatch.from_pydict({"value": tsv_lines(cols, missing_rate, rng)})

    out = ctr.generate(spark, spec, partitions).mapInArrow(lines, "value string")
    writer = out.write.mode("overwrite")
    if compression:
        writer = writer.option("compression", compression)
    writer.text(path)


@dataclass
class MalformedReport:
    """What :func:`read_tsv` found: lines read, malformed lines per reason, and a few examples."""

    lines: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def malformed_lines(self) -> int:
        return sum(self.malformed.values())

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "malformed_lines": self.malformed_lines, "malformed": dict(self.malformed), "examples": list(self.examples)}


def _parsed(raw: Any) -> Any:
    """Typed columns plus ``_malformed`` (the first reason a line does not fit, null when it does)."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("value"), "\t", -1)
    size = F.size(parts)

    def part(i: int):
        return F.get(parts, i)  # null past the end (no ANSI error)

    label = part(0)
    reasons = [(size != N_FIELDS, F.concat(F.lit(f"expected {N_FIELDS} tab-separated fields, got "), size.cast("string"))),
               (~label.isin("0", "1"), F.lit("label is not 0 or 1"))]
    cols = [F.when(label.isin("0", "1"), label.cast("int")).alias("label")]
    for k, name in enumerate(ctr.DENSE_COLS, start=1):
        p = part(k)
        value = p.try_cast("bigint")
        reasons.append(((p != "") & value.isNull(), F.lit(f"{name} is not an integer")))
        cols.append(F.when(p != "", value.cast("float")).alias(name))
    for k, name in enumerate(ctr.CAT_COLS, start=1 + ctr.N_DENSE):
        p = part(k)
        ok = p.rlike("^[0-9a-fA-F]{1,15}$")
        reasons.append(((p != "") & ~ok, F.lit(f"{name} is not hexadecimal")))
        cols.append(F.when((p != "") & ok, F.conv(p, 16, 10).cast("bigint")).alias(name))
    reason = F.lit(None).cast("string")
    for cond, text in reversed(reasons):
        reason = F.when(F.coalesce(cond, F.lit(False)), text).otherwise(reason)
    return raw.select(*cols, reason.alias("_malformed"), F.col("value").alias("_line"))


def read_tsv(spark: Any, path: str, on_malformed: str = "count", examples: int = 3) -> tuple[Any, MalformedReport]:
    """Criteo TSV (plain or gzip) at ``path`` -> (DataFrame of the well-formed lines, report).

    The report takes one pass over the files (an aggregation on the executors). With
    ``on_malformed="fail"`` any malformed line raises a :class:`~sparkdl_train.errors.DataError`
    naming how many, why, and an example line."""
    from pyspark.sql import functions as F

    if on_malformed not in ON_MALFORMED:
        raise DataError(f"on_malformed must be one of {ON_MALFORMED}, got {on_malformed!r}")
    parsed = _parsed(spark.read.text(path))
    counts = parsed.groupBy("_malformed").count().collect()
    report = MalformedReport(lines=sum(r["count"] for r in counts),
                             malformed={r["_malformed"]: r["count"] for r in counts if r["_malformed"] is not None})
    if report.lines == 0:
        raise DataError(f"{path}: no lines to read (is it a Criteo TSV file or folder?)")
    if report.malformed:
        bad = parsed.where(F.col("_malformed").isNotNull()).select("_malformed", "_line", F.input_file_name().alias("file"))
        report.examples = [f"{r['file']}: {r['_malformed']}: {r['_line'][:200]!r}" for r in bad.limit(examples).collect()]
        summary = ", ".join(f"{n} {why}" for why, n in sorted(report.malformed.items(), key=lambda kv: -kv[1]))
        if on_malformed == "fail":
            raise DataError(
                f"{path}: {report.malformed_lines} of {report.lines} lines are not Criteo TSV ({summary}); for example "
                f"{report.examples[0]}. Pass on_malformed='count' (--malformed count) to train on the rest"
            )
        log.warning("%s: %d of %d lines are malformed and left out (%s)", path, report.malformed_lines, report.lines, summary)
    good = parsed.where(F.col("_malformed").isNull()).drop("_malformed", "_line")
    return good, report


def detect_format(spark: Any, path: str) -> str:
    """``"parquet"`` or ``"criteo-tsv"``: Parquet files (or a Parquet folder) by their magic bytes,
    else a first line of 40 tab-separated fields."""
    from ..fs import FileSystem

    fs = FileSystem(spark.sparkContext)
    first = fs.first_file(path, skip_prefixes=("_", "."))
    if first is None:
        raise DataError(f"{path}: no data files found")
    head = fs.read_head(first, 4)
    if head == b"PAR1":
        return "parquet"
    line = spark.read.text(first).first()
    if line is not None and len(line[0].split("\t")) == N_FIELDS:
        return "criteo-tsv"
    raise DataError(f"{path}: neither Parquet nor Criteo TSV (its first file {first} starts {head!r}); pass --format")
