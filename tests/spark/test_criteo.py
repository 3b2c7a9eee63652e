"""Criteo's TSV format: written by the planted generator, read back exactly, malformed lines counted."""

import gzip
import os

import numpy as np
import pytest

from sparkdl_train.datasets import criteo, ctr
from sparkdl_train.errors import DataError

SPEC = ctr.CTRSpec(rows=3000, seed=9)


@pytest.fixture(scope="module")
def tsv(spark, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("criteo") / "tsv")
    criteo.write_tsv(spark, SPEC, path, missing_rate=0.0)
    return path


def _lines(path):
    out = []
    for name in sorted(os.listdir(path)):
        if name.startswith("part-"):
            with gzip.open(os.path.join(path, name), "rt") as f:
                out += f.read().splitlines()
    return out


def test_the_generator_writes_criteo_lines_and_they_read_back_as_the_generated_rows(spark, tsv):
    lines = _lines(tsv)
    assert len(lines) == SPEC.rows
    fields = lines[0].split("\t")
    assert len(fields) == 40 and fields[0] in ("0", "1")
    assert all(f.lstrip("-").isdigit() for f in fields[1:14])
    assert all(len(f) == 8 and int(f, 16) >= 0 for f in fields[14:])  # 8 hex digits, as Criteo's hashes
    assert criteo.detect_format(spark, tsv) == "criteo-tsv"

    df, report = criteo.read_tsv(spark, tsv)
    assert report.lines == SPEC.rows and report.malformed_lines == 0
    got = df.toPandas()
    want = ctr.generate(spark, SPEC).toPandas()
    for f, c in enumerate(ctr.CAT_COLS):
        want[c] = criteo.hex_ids(want[c].to_numpy(), f)
    cols = ["label", *ctr.DENSE_COLS, *ctr.CAT_COLS]
    key = ctr.CAT_COLS[:6] + ctr.DENSE_COLS[:3]
    got = got[cols].sort_values(key + ["label"]).reset_index(drop=True)
    want = want[cols].sort_values(key + ["label"]).reset_index(drop=True)
    np.testing.assert_array_equal(got.to_numpy(dtype=np.float64), want.to_numpy(dtype=np.float64))


def test_missing_fields_are_null_and_malformed_lines_are_counted_not_dropped_silently(spark, tsv, tmp_path):
    holes = str(tmp_path / "holes")
    criteo.write_tsv(spark, SPEC, holes, missing_rate=0.05, compression=None)
    df, report = criteo.read_tsv(spark, holes)
    assert report.malformed_lines == 0
    nulls = df.selectExpr("count_if(I5 is null) / count(*) as i", "count_if(C9 is null) / count(*) as c").first()
    assert 0.035 < nulls.i < 0.065 and 0.035 < nulls.c < 0.065, nulls

    good = _lines(tsv)[:5]
    wrong_width = "1\t5\t3"
    bad_label = "2" + good[0][1:]
    not_int = good[1].split("\t")
    not_int[4] = "4.5"
    not_hex = good[2].split("\t")
    not_hex[30] = "xyz"
    mixed = str(tmp_path / "mixed")
    os.makedirs(mixed)
    with gzip.open(os.path.join(mixed, "day_0.gz"), "wt") as f:
        f.write("\n".join([*good, wrong_width, bad_label, "\t".join(not_int), "\t".join(not_hex), wrong_width]) + "\n")
    df, report = criteo.read_tsv(spark, mixed)
    assert df.count() == 5 and report.lines == 10 and report.malformed_lines == 5
    assert report.malformed == {
        "expected 40 tab-separated fields, got 3": 2,
        "label is not 0 or 1": 1,
        "I4 is not an integer": 1,
        "C17 is not hexadecimal": 1,
    }
    assert len(report.examples) == 3 and "day_0.gz" in report.examples[0]
    with pytest.raises(DataError, match=r"5 of 10 lines are not Criteo TSV \(2 expected 40 tab-separated fields"):
        criteo.read_tsv(spark, mixed, on_malformed="fail")


def test_the_format_is_detected_from_the_files(spark, tmp_path):
    parquet = str(tmp_path / "pq")
    ctr.write(spark, ctr.CTRSpec(rows=500, seed=1), parquet)
    assert criteo.detect_format(spark, parquet) == "parquet"
    other = tmp_path / "notes.txt"
    other.write_text("hello\tworld\n")
    with pytest.raises(DataError, match="neither Parquet nor Criteo TSV"):
        criteo.detect_format(spark, str(other))
    with pytest.raises(DataError, match="no data files"):
        criteo.detect_format(spark, str(tmp_path / "nothing-here"))
