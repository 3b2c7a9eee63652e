"""The XLA rank's plumbing without Spark or JAX: batch signatures as JSON, a partition spilled to a
named file and read back by another reader (sparkdl_train.worker.xla_task, replay)."""

from __future__ import annotations

import json

import numpy as np

from sparkdl_train.worker.replay import Replay
from sparkdl_train.worker.xla_task import decode_signature, encode_signature


def test_a_batch_signature_round_trips_through_json_with_its_structure_and_dtypes():
    batch = ({"dense": np.zeros((5, 13), np.float32), "ids": np.zeros((5, 26), np.int32)}, np.zeros((5, 1), np.float64), None)
    sig = json.loads(json.dumps(encode_signature(batch)))
    empty = decode_signature(sig)
    assert isinstance(empty, tuple) and len(empty) == 3 and empty[2] is None
    assert set(empty[0]) == {"dense", "ids"}
    assert empty[0]["dense"].shape == (0, 13) and empty[0]["dense"].dtype == np.float32
    assert empty[0]["ids"].shape == (0, 26) and empty[0]["ids"].dtype == np.int32
    assert empty[1].shape == (0, 1) and empty[1].dtype == np.float64
    lists = decode_signature(encode_signature([np.zeros((2, 3), np.float16), (np.zeros((2,), np.int64),)]))
    assert isinstance(lists, list) and isinstance(lists[1], tuple) and lists[0].dtype == np.float16


def test_a_partition_spilled_to_a_named_file_reads_back_in_another_reader(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [({"a": rng.normal(size=(n, 3)).astype(np.float32)}, rng.integers(0, 2, (n, 1)), None) for n in (4, 7, 1)]
    path = str(tmp_path / "partition.npy")
    writer = Replay(path=path)
    seen = list(writer.first(iter(chunks)))
    assert len(seen) == 3 and writer.template[0]["a"].shape == (0, 3)
    writer.close()
    reader = Replay.saved(path, writer.chunks, decode_signature(encode_signature(writer.template)))
    for _ in range(2):  # as often as a stage has epochs
        back = list(reader.again())
        assert len(back) == 3
        for got, want in zip(back, chunks):
            np.testing.assert_array_equal(got[0]["a"], want[0]["a"])
            np.testing.assert_array_equal(got[1], want[1])
            assert got[2] is None
    reader.close()
