"""Parquet files read by the tasks themselves (sparkdl_train.data.parquet): which DataFrames qualify,
the split of their rows among tasks (pure), the reader, and fits and evaluations that see every row
exactly once, with the results Spark's own reader gives."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_mlp
from pyspark.sql import functions as F

from sparkdl_train import SparkModel
from sparkdl_train.data.parquet import ParquetFiles, Piece, direct_source, read_pieces, split_rows
from sparkdl_train.driver.inputs import make_adapter
from sparkdl_train.merge import Partial

# -- the split (pure) ------------------------------------------------------------------------


@pytest.mark.parametrize("sizes,n", [([[100]], 2), ([[30, 30, 40], [0, 7], [55]], 3), ([[5], [5]], 4),
                                     ([[3]], 5), ([[1000, 24], [999]], 7), ([[], [10]], 2)])
def test_split_gives_balanced_contiguous_ranges_covering_every_row_once(sizes, n):
    files = [(f"f{i}", groups) for i, groups in enumerate(sizes)]
    parts = split_rows(files, n)
    assert len(parts) == n
    total = sum(sum(g) for g in sizes)
    counts = [sum(p.rows for p in part) for part in parts]
    assert sum(counts) == total and max(counts) - min(counts) <= 1, counts
    # concatenated in part order, the pieces are the files' rows in order, each once
    seen = [(p.path, p.row_group, r) for part in parts for p in part for r in range(p.start, p.stop)]
    expected = [(f"f{i}", g, r) for i, groups in enumerate(sizes) for g, rows in enumerate(groups) for r in range(rows)]
    assert seen == expected
    assert all(p.rows > 0 for part in parts for p in part)


def test_split_refuses_zero_parts():
    with pytest.raises(ValueError, match="0 parts"):
        split_rows([("f", [3])], 0)


def test_reader_slices_row_groups_and_casts_to_sparks_arrow_types(tmp_path):
    path = str(tmp_path / "t.parquet")
    n = 250
    table = pa.table({"x": pa.array([[float(i), float(-i)] for i in range(n)], pa.list_(pa.float32())),
                      "s": pa.array([f"r{i}" for i in range(n)], pa.string()),
                      "id": pa.array(range(n), pa.int64())})
    pq.write_table(table, path, row_group_size=100)  # row groups of 100, 100, 50
    target = pa.schema([("x", pa.list_(pa.field("element", pa.float32()))), ("s", pa.large_string()), ("id", pa.int64())])
    pieces = [Piece(path, 0, 90, 100), Piece(path, 1, 0, 100), Piece(path, 2, 0, 5)]
    batches = list(read_pieces(pieces, ["x", "s", "id"], target.serialize().to_pybytes(), batch_rows=30))
    assert all(b.schema.equals(target) for b in batches) and max(b.num_rows for b in batches) <= 30
    got = pa.Table.from_batches(batches)
    assert got.column("id").to_pylist() == list(range(90, 205))
    assert got.column("s").to_pylist() == [f"r{i}" for i in range(90, 205)]
    assert got.column("x").to_pylist()[0] == [90.0, -90.0]


def test_a_seeded_row_split_puts_every_row_on_exactly_one_side_whatever_the_pieces(tmp_path):
    paths = [str(tmp_path / f"{i}.parquet") for i in range(2)]
    for i, (path, n) in enumerate(zip(paths, (700, 300))):
        pq.write_table(pa.table({"id": pa.array(range(i * 1000, i * 1000 + n), pa.int64())}), path, row_group_size=256)
    schema = pa.schema([("id", pa.int64())]).serialize().to_pybytes()
    files = ParquetFiles(tuple((p, tuple(pq.read_metadata(p).row_group(g).num_rows for g in range(pq.read_metadata(p).num_row_groups)))
                               for p in paths), ("id",), schema)

    def ids(side, parts):
        return [i for part in side.split(parts) for rb in side.read(part, batch_rows=50) for i in rb.column(0).to_pylist()]

    train, val = files.random_split(0.25, seed=7)
    t, v = ids(train, 1), ids(val, 1)
    everything = ids(files, 1)
    assert sorted(t + v) == everything and not set(t) & set(v)
    assert abs(len(v) - 250) < 60, len(v)  # each row held out with probability 0.25 (sd 14)
    # the same rows on each side however the rows are cut into tasks (pieces inside row groups), in order
    assert ids(train, 7) == t and ids(val, 3) == v
    # seeded: the same split again, another with another seed
    assert ids(files.random_split(0.25, seed=7)[1], 2) == v
    assert ids(files.random_split(0.25, seed=8)[1], 1) != v


# -- which DataFrames qualify (Spark) -----------------------------------------------------------


@pytest.fixture(scope="module")
def digits_parquet(spark, digits, tmp_path_factory):
    """The digits as Parquet: 3 files of unequal size (Spark's reader gives 3 unbalanced partitions)."""
    x, y = digits[0], digits[1]
    n = 1200
    rows = [(int(i), x[i].astype(np.float32).tolist(), int(y[i])) for i in range(n)]
    df = spark.createDataFrame(rows, "id long, pixels array<float>, label int")
    path = str(tmp_path_factory.mktemp("digits") / "parquet")
    parts = [df.where(f"id < {k}").where(f"id >= {j}") for j, k in [(0, 200), (200, 500), (500, n)]]
    for i, part in enumerate(parts):
        part.coalesce(1).write.mode("append" if i else "overwrite").parquet(path)
    return path, x[:n].astype(np.float32), y[:n]


def test_a_bare_scan_qualifies_and_anything_computed_does_not(spark, digits_parquet, tmp_path):
    path, _, _ = digits_parquet
    df = spark.read.parquet(path)
    files = direct_source(df, ["pixels", "label"])
    assert files is not None and files.num_rows == 1200 and len(files.files) == 3
    assert [p for p, _ in files.files] == sorted(p for p, _ in files.files)
    assert direct_source(df.select("label", "pixels"), ["pixels", "label"]) is not None
    assert direct_source(df.where("label > 0"), ["pixels", "label"]) is None  # a filter
    assert direct_source(df.withColumn("label", df.label + 1), ["pixels", "label"]) is None  # computed
    assert direct_source(df.limit(10), ["pixels", "label"]) is None
    assert direct_source(df.cache(), ["pixels", "label"]) is None  # cached: Spark holds it
    df.unpersist()
    # partition columns come from directory names, a timestamp's conversion is Spark's own
    parted = str(tmp_path / "parted")
    df.write.partitionBy("label").parquet(parted)
    assert direct_source(spark.read.parquet(parted), ["pixels", "label"]) is None
    stamped = str(tmp_path / "stamped")
    spark.read.parquet(path).selectExpr("pixels", "label", "current_timestamp() as t").write.parquet(stamped)
    assert direct_source(spark.read.parquet(stamped), ["pixels", "t"]) is None
    assert direct_source(spark.read.parquet(stamped), ["pixels", "label"]) is not None  # unused columns do not matter


def _rows_seen(adapter):
    """Each partition's labels and first pixel, as the tasks see them (a map_reduce over the adapter)."""

    def task(pid, chunks):
        ids = [float(v) for x, y, _ in chunks for v in (x[:, 0] * 1000 + y)]
        return Partial(samples=len(ids), partitions={pid: {"samples": len(ids), "keys": ids}})

    out = adapter.map_reduce(task, "rows seen")
    return {p: info["keys"] for p, info in out.partitions.items()}


def test_tasks_read_every_row_once_in_balanced_parts(spark, digits_parquet):
    path, x, y = digits_parquet
    model = make_mlp()
    spark_read = make_adapter(spark.read.parquet(path), model, labelled=True, feature_cols="pixels", label_col="label")
    direct = spark_read.reading_files()
    assert spark_read.source == "spark" and direct.source == "parquet"
    assert direct.num_partitions() == 3
    through_spark = sorted(k for keys in _rows_seen(spark_read).values() for k in keys)
    assert len(through_spark) == 1200
    for n in (2, 3, 5):
        seen = _rows_seen(direct.with_partitions(n, shuffle=True))
        assert sorted(seen) == list(range(n))
        sizes = [len(v) for v in seen.values()]
        assert sum(sizes) == 1200 and max(sizes) - min(sizes) <= 1, sizes
        assert sorted(k for keys in seen.values() for k in keys) == through_spark
    assert np.allclose(through_spark, sorted((x[:, 0].astype(np.float64) * 1000 + y).tolist()))
    first = direct.sample(8)
    assert first[0].shape == (8, 64) and first[0].dtype == np.float32


def test_fit_and_evaluate_on_the_files_match_sparks_reader(spark, digits_parquet):
    """Synchronous averaging on 2 workers: reading the files directly gives each worker the rows,
    in order, that Spark's reader gives one of them when the parts coincide (two files of 600
    rows), so the weights are equal; evaluation is the same either way."""
    path, _, _ = digits_parquet
    even = path + "_even"
    df = spark.read.parquet(path)
    for i, (lo, hi) in enumerate([(0, 600), (600, 1200)]):
        df.where(f"id >= {lo} and id < {hi}").orderBy("id").coalesce(1).write.mode("append" if i else "overwrite").parquet(even)
    data = spark.read.parquet(even)
    # Spark's reader gives one partition per file (which one comes first does not matter: with two
    # workers the average and the summed metric state are the same either way)
    ranges = sorted((r.lo, r.hi) for r in data.selectExpr("spark_partition_id() as p", "id").groupBy("p")
                    .agg(F.min("id").alias("lo"), F.max("id").alias("hi")).collect())
    assert ranges == [(0, 599), (600, 1199)], ranges
    results = {}
    for direct in (True, False):
        sm = SparkModel(make_mlp(), mode="synchronous", frequency="epoch", num_workers=2, seed=3, direct_parquet=direct)
        history = sm.fit(data, epochs=2, batch_size=64, verbose=0, feature_cols="pixels", label_col="label", shuffle=False)
        assert sm.stats.data_source == ("parquet" if direct else "spark")
        assert sm.stats.sample_source == ("files" if direct else "query")  # the first row group, or a limit query
        assert [e.samples for e in sm.stats.epochs] == [1200, 1200]
        results[direct] = (sm.model.get_weights(), history.history, sm.evaluate(data, feature_cols="pixels", label_col="label"))
    (w1, h1, e1), (w2, h2, e2) = results[True], results[False]
    assert all(np.array_equal(a, b) for a, b in zip(w1, w2))
    assert h1 == h2
    assert np.allclose(e1, e2, rtol=1e-6)
    assert e1[1] > 0.7  # accuracy on the training rows after 2 epochs (0.77)


def test_validation_split_reads_both_sides_from_the_files_and_validates_on_the_held_out_rows(spark, digits_parquet):
    """``validation_split`` on files read directly keeps the tasks reading them (no fallback to
    Spark's reader); the validation loss is single-process Keras' on exactly the held-out rows."""
    path, _, _ = digits_parquet
    data = spark.read.parquet(path)
    model = make_mlp()
    sm = SparkModel(model, mode="synchronous", frequency="epoch", num_workers=2, seed=5)
    history = sm.fit(data, epochs=1, batch_size=64, verbose=0, feature_cols="pixels", label_col="label", validation_split=0.2)
    assert sm.stats.data_source == "parquet"
    _, held_out = direct_source(data, ["pixels", "label"]).random_split(0.2, seed=5)
    table = pa.Table.from_batches(list(held_out.read(held_out.split(1)[0])))
    xv = np.stack(table.column("pixels").to_numpy(zero_copy_only=False)).astype(np.float32)
    yv = table.column("label").to_numpy()
    assert 150 < len(yv) < 330 and sm.stats.epochs[0].samples == 1200 - len(yv)
    loss, acc = model.evaluate(xv, yv, verbose=0)
    assert history.history["val_loss"][0] == pytest.approx(loss, rel=1e-5)
    assert history.history["val_accuracy"][0] == pytest.approx(acc, rel=1e-6)
