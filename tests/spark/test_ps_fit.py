"""Parameter-server engine end to end on local[2]: every mode x frequency learns, stats, cleanup, failures."""

import threading
import time

import numpy as np
import pytest
from helpers import epoch_rendezvous, failing_rdd, make_mlp

from sparkdl_train import ConfigError, SparkModel, WorkerError, to_simple_rdd

EPOCHS = 12


def ps_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-ps")]


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous", "hogwild"])
@pytest.mark.parametrize("frequency", ["epoch", "batch", 4])
def test_every_mode_and_frequency_within_three_points(sc, digits, reference_accuracy, mode, frequency):
    x, y, xt, yt = digits
    model = make_mlp()
    sm = SparkModel(model, mode=mode, frequency=frequency, num_workers=2)
    hist = sm.fit(to_simple_rdd(sc, x, y), epochs=EPOCHS, batch_size=32, verbose=0)
    acc = model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    assert acc >= reference_accuracy - 0.03, (mode, frequency, acc, reference_accuracy)
    assert len(hist.history["loss"]) == EPOCHS and hist.history["loss"][-1] < hist.history["loss"][0]
    stats = sm.stats.as_dict()
    assert stats["mode"] == mode and stats["frequency"] == frequency
    # batches per call of the compiled step: 16 (the default), a divisor of the push interval
    group = {"epoch": 16, "batch": 1, 4: 4}[frequency]
    assert stats["steps_per_call"] == group
    for part in (p for e in sm.stats.epochs for p in e.partitions.values()):
        full, short = divmod(part["samples"], 32)  # the first batch alone, calls ending on multiples of the group
        assert part["step_calls"] == 1 + -(-(full - 1) // group) + (short > 0), part
    if mode == "synchronous" and frequency == "epoch":
        assert stats["server"] is None  # merged by Spark's treeReduce, no server
        return
    server = stats["server"]
    steps_per_worker = [-(-n // 32) for n in (len(x) // 2, len(x) - len(x) // 2)]
    pushes = {"epoch": [1, 1], "batch": steps_per_worker, 4: [-(-s // 4) for s in steps_per_worker]}[frequency]
    assert server["updates"] == EPOCHS * sum(pushes)
    assert server["worker_steps"] == {0: EPOCHS * pushes[0], 1: EPOCHS * pushes[1]}
    assert server["worker_samples"] == {0: EPOCHS * (len(x) // 2), 1: EPOCHS * (len(x) - len(x) // 2)}
    n_params = model.count_params()
    # every push carries a full float32 delta and gets the weights back
    assert server["bytes_in"] >= server["updates"] * n_params * 4
    assert server["bytes_out"] >= server["updates"] * n_params * 4
    # each task splits its pushes' time: its own work (delta, applying the pull) and the round trip
    for part in (p for e in sm.stats.epochs for p in e.partitions.values()):
        assert part["pushes"] in pushes and 0 < part["push_sync_seconds"] < part["seconds"], part
        assert 0 < part["push_round_trip_seconds"] < part["seconds"], part
    if mode == "synchronous":
        assert server["rounds"] == EPOCHS * max(pushes) and server["mean_staleness"] == 0
        assert server["delta_scale"] == 1.0
    else:
        assert server["delta_scale"] == pytest.approx(0.5)  # 1 / num_workers
    assert ps_threads() == []  # server threads gone after fit


def test_staleness_bound_is_recorded(sc, digits, tmp_path):
    x, y, _, _ = digits
    # a skewed split: worker 0 has 4x the data, so without waiting it would run far ahead
    rows = list(zip(x, y))
    cut = len(rows) * 4 // 5
    meet = epoch_rendezvous(str(tmp_path), 2)

    def part(i):
        meet()  # runs when the task first reads its data: after its model is built
        return rows[:cut] if i == 0 else rows[cut:]

    rdd = sc.parallelize(range(2), 2).flatMap(part)
    sm = SparkModel(make_mlp(), mode="asynchronous", frequency="batch", num_workers=2, staleness_bound=2)
    sm.fit(rdd, epochs=1, batch_size=16, verbose=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0-0", "1-0"]  # both epoch tasks met
    st = sm.stats.server
    assert st["updates"] == -(-cut // 16) + -(-(len(rows) - cut) // 16)
    # both sessions are open at once, so the faster worker's pushes land between the other's pull and push
    assert st["max_staleness"] >= 1


def test_a_worker_runs_a_divisor_of_its_push_interval_per_call():
    from sparkdl_train.config import EngineConfig
    from sparkdl_train.driver.engines.allreduce import AllreduceEngine
    from sparkdl_train.driver.engines.averaging import AveragingEngine
    from sparkdl_train.driver.engines.parameter_server import ParameterServerEngine, group_within

    assert [group_within(16, every) for every in (None, 1, 4, 12, 20, 32, 7)] == [16, 1, 4, 12, 10, 16, 7]
    assert group_within(5, 12) == 4 and group_within(1, None) == 1

    def per_call(engine, **kw):
        return engine.steps_per_call(EngineConfig(**kw))

    assert per_call(AveragingEngine) == 16 and per_call(AveragingEngine, steps_per_execution=3) == 3
    assert per_call(ParameterServerEngine, mode="asynchronous", frequency="epoch") == 16
    assert per_call(ParameterServerEngine, mode="hogwild", frequency="batch") == 1
    assert per_call(ParameterServerEngine, mode="asynchronous", frequency=24, steps_per_execution=16) == 12
    assert per_call(AllreduceEngine, mode="allreduce") == 1


def test_ps_config_errors_name_the_argument():
    with pytest.raises(ConfigError, match="staleness_bound applies to mode='asynchronous'"):
        SparkModel(make_mlp(), mode="hogwild", staleness_bound=2)
    with pytest.raises(ConfigError, match="delta_scale applies to modes"):
        SparkModel(make_mlp(), mode="synchronous", frequency="batch", delta_scale=0.5)
    with pytest.raises(ConfigError, match="delta_scale must be a positive number"):
        SparkModel(make_mlp(), mode="asynchronous", delta_scale=0)
    with pytest.raises(ConfigError, match="unknown frequency"):
        SparkModel(make_mlp(), mode="asynchronous", frequency=0)


def test_dying_worker_fails_the_fit_fast_with_its_traceback_and_frees_the_server(sc, digits):
    x, y, _, _ = digits
    rdd = failing_rdd(sc, x, y, 300, "simulated executor failure in partition 1")
    start = time.monotonic()
    with pytest.raises(WorkerError, match="simulated executor failure"):
        SparkModel(make_mlp(), mode="synchronous", frequency="batch", num_workers=2).fit(rdd, epochs=2, batch_size=32, verbose=0)
    assert time.monotonic() - start < 60  # the surviving worker was not left waiting for a round
    assert ps_threads() == []
    # and the next fit works (a fresh server, new port, new secret)
    model = make_mlp()
    SparkModel(model, mode="asynchronous", frequency="batch", num_workers=2).fit(to_simple_rdd(sc, x, y), epochs=1, batch_size=32, verbose=0)
    assert ps_threads() == []


def test_delta_scale_multiplies_what_the_server_applies(sc, digits):
    """With one worker and no shuffling, each async push is the local step scaled by delta_scale."""
    x, y, _, _ = digits
    rdd = to_simple_rdd(sc, x[:64], y[:64], 1)
    start = make_mlp()
    w0 = [w.copy() for w in start.get_weights()]
    ref = make_mlp()  # one local step from the same weights, unscaled
    ref.fit(x[:64], y[:64], epochs=1, batch_size=64, shuffle=False, verbose=0)
    SparkModel(start, mode="asynchronous", frequency="batch", num_workers=1, delta_scale=0.25).fit(
        rdd, epochs=1, batch_size=64, shuffle=False, verbose=0)
    for a, b, c in zip(start.get_weights(), w0, ref.get_weights()):
        np.testing.assert_allclose(a - b, 0.25 * (c - b), atol=1e-6)


def test_a_half_width_wire_learns_as_well_with_half_the_bytes(sc, digits, reference_accuracy):
    """ps_compression: deltas and replies as bfloat16 (float16's path is tests/unit/test_ps_wire.py's); the
    same pushes, half the bytes, and the model learns as with float32."""
    x, y, xt, yt = digits
    rdd = to_simple_rdd(sc, x, y)
    out = {}
    for wire in (None, "bf16"):
        model = make_mlp()
        sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2, ps_compression=wire)
        sm.fit(rdd, epochs=EPOCHS // 2, batch_size=32, verbose=0)
        server = sm.stats.as_dict()["server"]
        out[wire] = (model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"], server["updates"],
                     server["bytes_in"] + server["bytes_out"])
        assert sm.config.ps_compression == wire and server["wire"] == (wire or "float32")
    acc, updates, moved = out["bf16"]
    assert acc >= out[None][0] - 0.03 and acc >= reference_accuracy - 0.06, out
    assert updates == out[None][1]
    assert 0.49 < moved / out[None][2] < 0.52, out  # values halved; frame headers stay
    with pytest.raises(ConfigError, match="ps_compression applies to"):
        SparkModel(make_mlp(), mode="allreduce", ps_compression="fp16")
    with pytest.raises(ConfigError, match="ps_compression applies to the parameter server's pushes"):
        SparkModel(make_mlp(), mode="synchronous", frequency="epoch", ps_compression="bf16")
    with pytest.raises(ConfigError, match="unknown ps_compression 'fp8'"):
        SparkModel(make_mlp(), mode="asynchronous", ps_compression="fp8")
