"""sparkdl_train.worker.replay: a partition kept in a local file for a stage's later epochs."""

import numpy as np
import pytest

from sparkdl_train.worker.replay import Replay


def test_the_later_passes_read_back_what_the_first_streamed_without_pickle(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [({"dense": rng.normal(size=(5, 3)).astype("float32"), "cat": rng.integers(0, 9, (5, 2)),
                "name": np.array(["a", "bb", "c", "d", "e"], dtype=object)}, rng.random(5), None) for _ in range(4)]
    replay = Replay(str(tmp_path))
    seen = []
    for chunk in replay.first(iter(chunks)):
        seen.append(chunk)
        assert replay.chunks == len(seen)  # written as it streams past, one chunk at a time
    assert seen == chunks and replay.bytes > 4 * 5 * (3 * 4 + 2 * 8 + 8)
    for _ in range(2):
        back = list(replay.again())
        assert len(back) == 4
        for (x0, y0, w0), (x1, y1, w1) in zip(chunks, back):
            assert w1 is None and set(x1) == {"dense", "cat", "name"}
            np.testing.assert_array_equal(x1["dense"], x0["dense"])
            assert x1["dense"].dtype == np.float32 and x1["cat"].dtype == x0["cat"].dtype
            assert x1["name"].tolist() == x0["name"].tolist()
            np.testing.assert_array_equal(y1, y0)
    replay.close()
    assert list(tmp_path.iterdir()) == []  # an unnamed file: nothing left behind


def test_mixed_python_objects_are_refused_and_again_needs_a_first_pass(tmp_path):
    replay = Replay(str(tmp_path))
    with pytest.raises(RuntimeError, match="before the first pass"):
        list(replay.again())
    bad = [(np.array([{"a": 1}, 2], dtype=object), np.zeros(2), None)]
    with pytest.raises(TypeError, match="mixed Python objects"):
        list(replay.first(iter(bad)))
    replay.close()
