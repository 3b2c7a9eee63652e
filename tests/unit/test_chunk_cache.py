"""The read-once RDD's chunk encoding (sparkdl_train.data.chunk_cache), without Spark: every batch structure
comes back equal, leaf for leaf (dtype, shape, values), writable and unshared; no pickle; bad blobs refused."""


import numpy as np
import pytest

from sparkdl_train.data import chunk_cache
from sparkdl_train.data.batching import rows_to_chunks
from sparkdl_train.trees import tree_leaves


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    elif a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


rng = np.random.default_rng(0)
CHUNKS = {
    "one input": (rng.normal(size=(7, 3)).astype("float32"), rng.integers(0, 2, 7).astype("int64"), None),
    "weights": (rng.normal(size=(5, 2, 2)), rng.normal(size=(5,)).astype("float16"), np.ones(5, "float32")),
    "list of inputs": ([rng.normal(size=(4, 3)).astype("float32"), rng.integers(0, 9, (4, 2)).astype("int32")],
                       rng.normal(size=(4, 1)).astype("float32"), None),
    "dict of inputs and outputs": ({"user": np.arange(3, dtype="int64"), "item": np.arange(3, dtype="int64")[::-1]},
                                   {"label": np.array([1, 0, 1], "float32"), "value": np.array([.5, 2., 3.], "float64")}, None),
    "strings": (np.array(["a good film", "", "bad, très"], dtype=object), np.array([1, 0, 0]), None),
    "bytes and booleans": ((np.array([b"x", b"yz"], dtype=object), np.array([True, False])), np.zeros((2, 0), "float32"), None),
    "no rows": (np.zeros((0, 4), "float32"), np.zeros((0,), "int64"), None),
    "unlabelled": (rng.normal(size=(3, 2)).astype("float32"), None, None),
}


@pytest.mark.parametrize("name", list(CHUNKS))
def test_a_chunk_comes_back_equal_writable_and_unshared(name):
    chunk = CHUNKS[name]
    blob = chunk_cache.encode(chunk)
    assert isinstance(blob, bytes)
    back = chunk_cache.decode(blob)
    _same(chunk, back)
    for leaf in tree_leaves(back):
        assert leaf.flags.writeable and leaf.base is None or leaf.dtype == object
    # two decodes share nothing (a consumer may write into a batch)
    again = chunk_cache.decode(blob)
    for a, b in zip(tree_leaves(back), tree_leaves(again)):
        assert not np.shares_memory(a, b)


def test_the_bytes_hold_no_pickle_and_the_numbers_raw():
    x = np.arange(12, dtype="float32").reshape(4, 3)
    blob = chunk_cache.encode((x, np.arange(4), None))
    assert x.tobytes() in blob and b"numpy" not in blob


def test_chunks_of_rows_as_an_rdd_gives_them_come_back_as_the_epochs_would_read_them():
    rows = [(rng.normal(size=3).astype("float32"), np.float32(i % 2)) for i in range(10)]
    for chunk in rows_to_chunks(rows, 4):
        _same(chunk, chunk_cache.decode(chunk_cache.encode(chunk)))


def test_mixed_objects_are_refused_by_name_and_damaged_blobs_are_refused():
    with pytest.raises(chunk_cache.ChunkEncodingError, match=r"Python objects \(int, str\)"):
        chunk_cache.encode((np.array([1, "a"], dtype=object), None, None))
    blob = chunk_cache.encode(CHUNKS["one input"])
    with pytest.raises(ValueError, match="wrong magic"):
        chunk_cache.decode(b"XXXX" + blob[4:])
    with pytest.raises(ValueError, match="shorter"):
        chunk_cache.decode(blob[:-1])
    with pytest.raises(ValueError, match="longer"):
        chunk_cache.decode(blob + b"\0")
