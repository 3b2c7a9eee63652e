"""Executor-side batch transforms and binary/string columns: the pure parts (no Spark)."""

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from sparkdl_train.data.prefetch import ordered_map
from sparkdl_train.data.spec import InputInfo, resolve_columns
from sparkdl_train.data.transform import ArrowColumns, BatchTransform
from sparkdl_train.errors import ConfigError, DataError, TransformError


def test_ordered_map_keeps_order_and_runs_items_concurrently():
    rng = np.random.default_rng(0)
    delays = rng.uniform(0, 0.01, 60)
    running = {"now": 0, "max": 0}
    lock = threading.Lock()

    def work(i):
        with lock:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        time.sleep(delays[i])
        with lock:
            running["now"] -= 1
        return i * i

    assert list(ordered_map(work, range(60), threads=4)) == [i * i for i in range(60)]
    assert running["max"] > 1  # several items were in flight at once
    assert list(ordered_map(work, range(5), threads=1)) == [0, 1, 4, 9, 16]


def test_ordered_map_reraises_the_first_error_in_order_and_stops_early():
    done = []

    def work(i):
        if i == 5:
            raise KeyError("five")
        time.sleep(0.002)
        done.append(i)
        return i

    out = []
    with pytest.raises(KeyError, match="five"):
        for v in ordered_map(work, range(1000), threads=3, depth=6):
            out.append(v)
    assert out == [0, 1, 2, 3, 4]
    assert len(done) < 30  # bounded look-ahead: the rest was never started
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("sparkdl_train-transform")]


def _record_batch(n=6):
    vec_type = pa.struct([("type", pa.int8()), ("size", pa.int32()), ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float64()))])
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(n, dtype=np.int64)),
            pa.array([bytes([i]) * (i + 1) for i in range(n)], pa.binary()),
            pa.array([f"row {i}" for i in range(n)], pa.string()),
            pa.array([[float(i), 2.0 * i] for i in range(n)], pa.list_(pa.float32())),
            pa.array([{"height": 2, "data": b"xy"} for _ in range(n)], pa.struct([("height", pa.int32()), ("data", pa.binary())])),
            pa.array([{"type": 1, "size": None, "indices": None, "values": [1.0, float(i)]} for i in range(n)], vec_type),
        ],
        ["id", "content", "text", "pair", "image", "vec"],
    )


def test_arrow_columns_convert_each_kind_on_first_access():
    cols = ArrowColumns(_record_batch())
    assert list(cols) == ["id", "content", "text", "pair", "image", "vec"] and cols.num_rows == 6
    assert cols._cache == {}  # nothing converted until read
    assert cols["id"].dtype == np.int64 and cols["id"].tolist() == list(range(6))
    assert cols["content"].dtype == object and cols["content"][2] == b"\x02\x02\x02"
    assert cols["text"].dtype == object and cols["text"][5] == "row 5"
    assert cols["pair"].shape == (6, 2) and cols["pair"][3].tolist() == [3.0, 6.0]
    assert set(cols["image"]) == {"height", "data"} and cols["image"]["data"][0] == b"xy"
    assert cols["vec"].shape == (6, 2) and cols["vec"][4].tolist() == [1.0, 4.0]  # ML vectors: dense
    assert set(cols._cache) == {"id", "content", "text", "pair", "image", "vec"}
    assert cols.arrow("text").type == pa.string()
    with pytest.raises(KeyError, match="no column 'nope'"):
        cols["nope"]


def test_null_strings_are_an_error_naming_the_column_and_row():
    rb = pa.RecordBatch.from_arrays([pa.array(["a", None, "c"])], ["city"])
    with pytest.raises(DataError, match=r"column 'city' contains 1 null value\(s\) \(first at row 1"):
        ArrowColumns(rb)["city"]


def _mapping(transform, inputs=(InputInfo("image", (2, 2, 1), "float32"),), **kw):
    m = resolve_columns(list(inputs), kw.pop("feature_cols", "image"), kw.pop("label_col", "label"))
    return m.with_transform(BatchTransform(transform, **kw), ["id", "content", "label"])


def _source(n=300, bad_at=None):
    ids = np.arange(n)
    content = [bytes([i % 256]) * 4 for i in ids]
    if bad_at is not None:
        content[bad_at] = b"bad"
    return pa.RecordBatch.from_arrays([pa.array(ids), pa.array(content, pa.binary()), pa.array(ids % 3)], ["id", "content", "label"])


def _decode(cols):
    imgs = np.stack([np.frombuffer(b, np.uint8) for b in cols["content"]]).astype("float32") / 255
    return {"image": imgs.reshape(-1, 2, 2)}  # (2, 2): the model's (2, 2, 1) is a reshape away


def test_transform_output_feeds_the_inputs_and_labels_pass_through():
    m = _mapping(_decode)
    assert m.columns() == ["id", "content", "label"]  # the transform is handed every column
    x, y, w = m.batch_from_arrow(_source(10))
    assert x.shape == (10, 2, 2, 1) and x.dtype == np.float32 and w is None
    assert np.allclose(x[3].ravel(), 3 / 255) and y.tolist() == [i % 3 for i in range(10)]


def test_threads_and_slices_give_the_same_chunks_in_order():
    batches = [_source(300).slice(0, 130), _source(300).slice(130, 170)]
    one = list(_mapping(_decode).chunks(batches, partition=0))
    pooled = list(_mapping(_decode, threads=3, rows=7).chunks(batches, partition=0))
    assert len(pooled) == 19 + 25 and len(one) == 2
    np.testing.assert_array_equal(np.concatenate([c[0] for c in pooled]), np.concatenate([c[0] for c in one]))
    np.testing.assert_array_equal(np.concatenate([c[1] for c in pooled]), np.arange(300) % 3)


def test_an_exception_in_the_transform_names_partition_rows_and_cause():
    batches = [_source(300, bad_at=237)]
    with pytest.raises(TransformError) as info:
        list(_mapping(_decode, threads=2, rows=50).chunks(batches, partition=3))
    text = str(info.value)
    assert "partition 3, rows 200-249" in text and "ValueError" in text and "_decode" in text, text
    assert isinstance(info.value.__cause__, ValueError)  # the original, with its traceback
    assert isinstance(info.value, DataError)


@pytest.mark.parametrize(
    "transform,error,words",
    [
        (lambda c: {"image": np.zeros((len(c["id"]), 3, 3))}, DataError, ["'image'", "(3, 3)", "(2, 2, 1)", "transform"]),
        (lambda c: {"image": c["content"]}, DataError, ["'image'", "numeric", "bytes", "transform=fn"]),
        (lambda c: {"img": np.zeros((len(c["id"]), 2, 2))}, TransformError, ["'image'", "['img']", "feature_cols"]),
        (lambda c: [np.zeros((len(c["id"]), 2, 2))], TransformError, ["returned list", "dict of columns"]),
        (lambda c: {"image": np.zeros((5, 2, 2)), "label": np.zeros(4)}, TransformError, ["different row counts"]),
        (lambda c: {"image": np.zeros((5, 2, 2))}, TransformError, ["row count", "'label' must be in its output"]),
        (lambda c: {"image": 1.0}, TransformError, ["scalar", "'image'"]),
    ],
    ids=["wrong shape", "wrong dtype", "missing key", "not a dict", "ragged rows", "dropped rows without label", "scalar"],
)
def test_transform_output_problems_are_named(transform, error, words):
    with pytest.raises(error) as info:
        _mapping(transform).batch_from_arrow(_source(10))
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_a_transform_must_be_a_function():
    with pytest.raises(ConfigError, match="transform must be a function"):
        BatchTransform("decode")


def test_string_inputs_take_string_columns_as_object_arrays():
    m = resolve_columns([InputInfo("text", (1,), "string"), InputInfo("n", (1,), "float32")], {"text": "text", "n": "n"}, "label")
    rb = pa.RecordBatch.from_arrays([pa.array(["a b", "c"]), pa.array([1.0, 2.0]), pa.array([0, 1])], ["text", "n", "label"])
    x, y, _ = m.batch_from_arrow(rb)
    assert x["text"].dtype == object and x["text"].shape == (2, 1) and x["text"][1, 0] == "c"
    assert x["n"].dtype == np.float32 and y.tolist() == [0, 1]
