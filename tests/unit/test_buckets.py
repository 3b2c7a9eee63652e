"""Overlap (allreduce.bucketBytes) without Spark: the buckets' layout, the bucket thread over an
in-memory ring, and TensorFlow's fused step handing its buckets over during the backward pass."""

import threading
import time

import numpy as np
import pytest

from sparkdl_train.allreduce import ring
from sparkdl_train.allreduce.buckets import BucketRing
from sparkdl_train.allreduce.local import MemoryRing
from sparkdl_train.backend.flat import FusedLayout


class _Layout(FusedLayout):
    def __init__(self, sizes):
        self.sizes = list(sizes)
        self.shapes = [(n,) for n in sizes]
        self.size = sum(sizes) + 1


def test_buckets_tile_the_vector_from_the_last_weight_backwards():
    layout = _Layout([4096, 64, 640, 10])  # bytes: 16384, 256, 2560, 40
    b = layout.buckets(200)
    # bucket 0: the last two weights (40 + 2560 bytes) and the rank's weight; then 64; then the first weight alone
    assert b == [(2, 4, 4160, 4811), (1, 2, 4096, 4160), (0, 1, 0, 4096)]
    assert layout.buckets(1 << 30) == [(0, 4, 0, 4811)]  # everything in one
    assert layout.buckets(1) == [(3, 4, 4800, 4811), (2, 3, 4160, 4800), (1, 2, 4096, 4160), (0, 1, 0, 4096)]
    for size in (1, 64, 300, 3000, 20000):
        cuts = sorted((lo, hi) for _, _, lo, hi in layout.buckets(size))
        assert cuts[0][0] == 0 and cuts[-1][1] == layout.size
        assert all(a[1] == c[0] for a, c in zip(cuts, cuts[1:]))
    with pytest.raises(ValueError, match="positive"):
        layout.buckets(0)


def _ranks(size, n, bounds, order):
    """``size`` ranks, each handing its buckets over in ``order`` from a thread of its own (as
    TensorFlow's executor would) and reducing them through an in-memory ring."""
    mem = MemoryRing(size)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(size)]
    bufs = [np.empty(n, np.float32) for _ in range(size)]
    waited = [None] * size
    rings = []

    def rank(r):
        link = mem.link(r)
        with BucketRing(bufs[r], bounds, lambda v: ring.allreduce_sum(v, link, r, size), timeout=30) as br:
            rings.append(br)
            for _ in range(2):  # two steps through the same thread
                br.start_step()

                def backward():
                    for k in order:
                        lo, hi = bounds[k]
                        bufs[r][lo:hi] = inputs[r][lo:hi]
                        br.ready(k)
                        time.sleep(0.001)

                t = threading.Thread(target=backward)
                t.start()
                t.join()
                waited[r] = br.wait()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return inputs, bufs, rings


def test_bucket_ring_reduces_in_bucket_order_whatever_order_buckets_arrive_in():
    bounds = [(900, 1001), (300, 900), (0, 300)]
    inputs, bufs, rings = _ranks(3, 1001, bounds, order=[2, 0, 1])  # each step hands the inputs over afresh
    expected = sum(inputs)
    for b in bufs:
        np.testing.assert_allclose(b, expected, rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(bufs[0], b) for b in bufs[1:])  # ranks bitwise identical
    for br in rings:
        assert br.steps == 2 and br.exchange_s > 0 and br.exposed_s >= 0


def test_bucket_ring_passes_the_thread_error_and_times_out_on_a_missing_bucket():
    buf = np.zeros(10, np.float32)

    def broken(view):
        raise ConnectionResetError("peer 1 went away")

    with BucketRing(buf, [(5, 10), (0, 5)], broken, timeout=5) as br:
        br.start_step()
        br.ready(0)
        with pytest.raises(ConnectionResetError, match="peer 1"):
            br.wait()
        with pytest.raises(ConnectionResetError):
            br.start_step()  # the ring is broken: no further step
    with BucketRing(buf, [(5, 10), (0, 5)], lambda v: None, timeout=0.3) as br:
        br.start_step()
        br.ready(0)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"bucket\(s\) \[1\] never handed over"):
            br.wait()
        assert time.monotonic() - t0 < 3
    with BucketRing(buf, [(0, 10)], lambda v: None, timeout=5) as br:
        with pytest.raises(RuntimeError, match="outside a step"):
            br.ready(0)
    # a step that fails while a bucket is on the ring: closing does not wait for the ring's timeout
    stuck = threading.Event()
    br = BucketRing(buf, [(5, 10), (0, 5)], lambda v: stuck.wait(60), timeout=600)
    br.start_step()
    br.ready(0)
    t0 = time.monotonic()
    br.close()
    assert time.monotonic() - t0 < 10
    stuck.set()


def test_tensorflow_fused_step_hands_buckets_over_during_its_backward_pass():
    """The bucketed step writes the same vector as the one-piece step, bit for bit, and hands
    over every bucket in order, the first one (the last layers) before the function returns."""
    import keras
    from helpers import make_mlp

    from sparkdl_train.backend.tensorflow import FusedStep

    model = make_mlp()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.float32)
    batch = (x, y, None)
    keras.utils.set_random_seed(0)
    whole = FusedStep(model, 32)
    bucketed = FusedStep(model, 32, bucket_bytes=200)
    assert [(f, e) for f, e, _, _ in bucketed.bucket_bounds] == [(2, 4), (1, 2), (0, 1)]
    a = np.empty(whole.size, np.float32)
    b = np.full(whole.size, np.nan, np.float32)
    whole.gradients(batch, a)
    handed = []
    bucketed.gradients(batch, b, handed.append)
    assert handed == [0, 1, 2]
    np.testing.assert_array_equal(a, b)
    assert b[-1] == 1.0  # a full batch: the rank's weight
    with pytest.raises(ValueError, match="ready"):
        bucketed.gradients(batch, b)
