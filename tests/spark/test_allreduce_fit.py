"""mode='allreduce' end to end on local[2]: barrier stages, identical ranks, accuracy, failures."""

import time

import numpy as np
import pandas as pd
import pytest
from helpers import failing_rdd, make_mlp, spark_jobs

from sparkdl_train import ConfigError, SparkModel, WorkerError, to_simple_rdd

EPOCHS = 12


def digests(sm):
    return [{i["weights_sha256"] for i in e.partitions.values()} for e in sm.stats.epochs]


def test_dataframe_allreduce_matches_single_process(spark, digits, reference_accuracy):
    x, y, xt, yt = digits
    # 5 input partitions: repartitioned to one per rank (barrier stages cannot coalesce)
    df = spark.createDataFrame(pd.DataFrame({"features": list(x.astype("float64")), "label": y.astype("float64")})).repartition(5)
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce")  # frequency defaults to 'batch'; ranks = 2 slots
    hist = sm.fit(df, epochs=EPOCHS, batch_size=16, verbose=0)
    acc = model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    assert acc >= reference_accuracy - 0.02, (acc, reference_accuracy)
    assert len(hist.history["loss"]) == EPOCHS and hist.history["loss"][-1] < hist.history["loss"][0] / 3
    assert all(len(d) == 1 for d in digests(sm))  # every epoch: both ranks hold identical weights
    first = sm.stats.epochs[0].partitions
    assert sorted(first) == [0, 1] and sorted(i["rank"] for i in first.values()) == [0, 1]
    assert sum(i["samples"] for i in first.values()) == len(x)
    # the driver adopted the ranks' weights: its digest equals theirs
    import hashlib

    mine = hashlib.sha256(b"".join(np.ascontiguousarray(w.numpy()).tobytes() for w in model.weights)).hexdigest()
    assert digests(sm)[-1] == {mine}
    # every step all-reduces one fused float32 buffer: 2 (N-1)/N of it per rank, N = 2
    server = sm.stats.server
    n_params = model.count_params()
    steps = max(i["global_steps"] for i in first.values())
    assert steps == max(-(-i["samples"] // 16) for i in first.values())
    per_rank_step_bytes = (n_params + 1) * 4 // 2
    assert server["steps"] == EPOCHS * steps
    assert all(i["bytes_sent"] >= (steps + 1) * per_rank_step_bytes for i in first.values())


def test_rdd_uneven_partitions_and_worker_reuse(sc, digits, reference_accuracy):
    x, y, xt, yt = digits
    # partition 0 holds 40 rows, partition 1 the rest: rank 0 runs out after 3 steps and keeps
    # contributing zero-weight gradients until rank 1 is done; nobody waits at the end
    rows = list(zip(x, y))
    rdd = sc.parallelize([rows[:40], rows[40:]], 2).flatMap(lambda part: part)
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2)
    sm.fit(rdd, epochs=EPOCHS, batch_size=16, verbose=0)
    acc = model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    assert acc >= reference_accuracy - 0.02
    first = sm.stats.epochs[0].partitions
    assert first[0]["samples"] == 40 and first[0]["batches"] == 3
    assert first[1]["batches"] == -(-(len(x) - 40) // 16)
    assert first[0]["global_steps"] == first[1]["global_steps"] == first[1]["batches"]
    assert all(len(d) == 1 for d in digests(sm))
    # a second fit in the same session (Spark reuses the Python workers, TF state included)
    pids = {i["pid"] for e in sm.stats.epochs for i in e.partitions.values()}
    again = SparkModel(make_mlp(seed=1), mode="allreduce", num_workers=2)
    again.fit(to_simple_rdd(sc, x, y), epochs=2, batch_size=32, verbose=0)
    pids2 = {i["pid"] for e in again.stats.epochs for i in e.partitions.values()}
    assert pids & pids2, "expected reused Python workers"
    assert all(len(d) == 1 for d in digests(again))


def test_fp16_and_bf16_compression_and_linear_lr_scaling(sc, digits, reference_accuracy):
    x, y, xt, yt = digits
    results = {}
    for compression in (None, "fp16", "bf16"):
        model = make_mlp(lr=0.0015)
        sm = SparkModel(model, mode="allreduce", num_workers=2, compression=compression, lr_scaling="linear")
        sm.fit(to_simple_rdd(sc, x, y), epochs=EPOCHS, batch_size=16, verbose=0)
        results[compression] = (model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"], sm.stats.server)
        assert all(len(d) == 1 for d in digests(sm))
        # the scaled rate lived on the executors only: the driver keeps the user's value
        assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.0015)
    (acc32, s32), (acc16, s16), (accb, sb) = results[None], results["fp16"], results["bf16"]
    assert min(acc32, acc16, accb) >= reference_accuracy - 0.02, results
    assert s16["compression"] == "fp16" and sb["compression"] == "bf16" and s32["lr_scaling"] == "linear"
    for half in (s16, sb):  # gradients at half width (+ fp32 broadcasts)
        assert 0.45 < half["bytes_sent"] / s32["bytes_sent"] < 0.6


def test_gradient_buckets_reduced_during_the_backward_pass_give_the_same_weights(sc, digits):
    """allreduce.bucketBytes: three buckets per step, each reduced on the rank's bucket thread as
    the backward pass hands it over; with 2 ranks every sum is the same pair of floats, so the
    weights equal the one-vector fit's bit for bit, also across the steps where one rank is out of
    data (it hands over zeros)."""
    x, y, _, _ = digits
    rows = list(zip(x[:400], y[:400]))
    rdd = sc.parallelize([rows[:100], rows[100:]], 2).flatMap(lambda part: part).cache()
    fits = {}
    for bucket_bytes in (0, 200):
        model = make_mlp()
        sm = SparkModel(model, mode="allreduce", num_workers=2, bucket_bytes=bucket_bytes, shuffle_buffer_size=1)
        sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
        fits[bucket_bytes] = (model.get_weights(), sm.stats)
    for a, b in zip(fits[0][0], fits[200][0]):
        np.testing.assert_array_equal(a, b)
    stats = fits[200][1]
    assert stats.server["bucket_bytes"] == 200 and fits[0][1].server["bucket_bytes"] == 0
    for info in stats.epochs[0].partitions.values():
        assert info["buckets"] == 3 and info["global_steps"] == 10
        assert 0 < info["bucket_wait_seconds"] and 0 < info["bucket_exchange_seconds"]
    assert "buckets" not in next(iter(fits[0][1].epochs[0].partitions.values()))
    assert stats.server["bucket_exchange_seconds"] > 0
    # bfloat16 on the wire, bucket by bucket: a segment's owner differs with the cut, so not bit for bit
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2, bucket_bytes=200, compression="bf16", shuffle_buffer_size=1)
    sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
    assert all(len(d) == 1 for d in digests(sm))  # the ranks still agree bit for bit
    for a, b in zip(fits[0][0], model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.01)
    rdd.unpersist()


def test_more_ranks_than_slots_fails_before_launch(sc, digits):
    x, y, _, _ = digits
    before = len(spark_jobs(sc))
    with pytest.raises(ConfigError, match="needs 3 task slots at once.*offers 2"):
        SparkModel(make_mlp(), mode="allreduce", num_workers=3).fit(to_simple_rdd(sc, x, y), epochs=1, verbose=0)
    ran = [d for d, _ in spark_jobs(sc)[before:]]
    assert not [d for d in ran if d and "epoch" in d.lower()], ran  # refused before any epoch's barrier stage
    assert sc.statusTracker().getActiveJobsIds() == []


def test_allreduce_config_errors():
    with pytest.raises(ConfigError, match="frequency='epoch'\\); not 4"):
        SparkModel(make_mlp(), mode="allreduce", frequency=4)
    for arg in ({"compression": "fp16"}, {"lr_scaling": "linear"}, {"bucket_bytes": 1 << 20}):  # gradients only
        with pytest.raises(ConfigError, match=f"{next(iter(arg))}=.* applies to gradients"):
            SparkModel(make_mlp(), mode="allreduce", frequency="epoch", **arg)
    with pytest.raises(ConfigError, match="state_sums applies to frequency='epoch'"):
        SparkModel(make_mlp(), mode="allreduce", state_sums="float32")
    with pytest.raises(ConfigError, match="compression"):
        SparkModel(make_mlp(), mode="allreduce", compression="int8")
    with pytest.raises(ConfigError, match="mode='allreduce' only"):
        SparkModel(make_mlp(), mode="synchronous", compression="fp16")
    with pytest.raises(ConfigError, match="lr_scaling"):
        SparkModel(make_mlp(), mode="allreduce", lr_scaling="cubic")


def test_schedule_with_lr_scaling_is_refused(sc, digits):
    import keras

    x, y, _, _ = digits
    model = make_mlp()
    model.compile(keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.9)),
                  "sparse_categorical_crossentropy")
    with pytest.raises(ConfigError, match="constant learning rate"):
        SparkModel(model, mode="allreduce", lr_scaling="linear").fit(to_simple_rdd(sc, x, y), epochs=1, verbose=0)


def test_failing_rank_fails_the_fit_with_its_rank_and_traceback(sc, digits):
    x, y, _, _ = digits
    rdd = failing_rdd(sc, x, y, 100, "corrupt record 100 in partition 1")
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        SparkModel(make_mlp(), mode="allreduce", num_workers=2).fit(rdd, epochs=1, batch_size=16, verbose=0)
    assert time.monotonic() - start < 60
    text = str(info.value) + "".join(info.value.failures.values())
    assert "rank 1" in text and "corrupt record 100 in partition 1" in text
    # the session still trains afterwards
    ok = SparkModel(make_mlp(), mode="allreduce", num_workers=2)
    ok.fit(to_simple_rdd(sc, x, y), epochs=1, batch_size=32, verbose=0)
    assert all(len(d) == 1 for d in digests(ok))


def test_slow_rank_fails_the_others_within_the_timeout(sc, digits):
    x, y, _, _ = digits
    rows = list(zip(x, y))

    def part(i):
        if i == 1:
            time.sleep(25)
        yield from rows[i::2]

    rdd = sc.parallelize(range(2), 2).flatMap(part)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        SparkModel(make_mlp(), mode="allreduce", num_workers=2, allreduce_timeout=4).fit(rdd, epochs=1, batch_size=16, verbose=0)
    elapsed = time.monotonic() - start
    text = str(info.value) + "".join(info.value.failures.values())
    assert "timed out after 4 s" in text and "rank 1" in text, text[-2000:]
    assert elapsed < 24, elapsed  # well before the slow rank would have answered


def test_ranks_meet_through_the_driver_in_milliseconds_with_the_same_result(spark, sc, digits):
    """The default rendezvous (the driver's server) against Spark's allGather, whose executor polls
    its answer once a second: the same weights bit for bit, every epoch's round served by the
    driver, and each rank's rendezvous far under Spark's second (bench/allreduce/rendezvous.py: 1.0 s -> 9 ms)."""
    from helpers import spark_conf

    x, y, _, _ = digits
    df = spark.createDataFrame(pd.DataFrame({"features": list(x[:600].astype("float64")), "label": y[:600].astype("float64")}))
    df = df.repartition(2).cache()
    fits = {}
    for how in ("driver", "spark"):
        with spark_conf(sc, "spark.sparkdl_train.allreduce.rendezvous", how):
            model = make_mlp()
            sm = SparkModel(model, mode="allreduce", num_workers=2, seed=3)
            sm.fit(df, epochs=3, batch_size=32, verbose=0)
        meets = [p["startup"]["rendezvous"] for e in sm.stats.epochs for p in e.partitions.values()]
        fits[how] = (model.get_weights(), sm.stats.server, meets)
    weights, server, meets = fits["driver"]
    assert server["driver_rendezvous_rounds"] == 3, server  # one round per epoch, all through the driver
    assert "driver_rendezvous_rounds" not in fits["spark"][1]
    for a, b in zip(weights, fits["spark"][0]):
        np.testing.assert_array_equal(a, b)
    # Spark's allGather: about a second for a rank that waits for its peer; the driver's: milliseconds (a ratio
    # of medians in one run: a rank whose peer's task starts late on a loaded machine waits either way)
    assert np.median(meets) < 0.3 * np.median(fits["spark"][2]), (meets, fits["spark"][2])
    df.unpersist()


def test_an_empty_partition_joins_with_zero_weight(sc, digits):
    """Join semantics: a rank without a single row still takes part in every allreduce (zero
    gradients, zero weight), applies the others' mean, and ends with their weights: no hang, and
    the result equals one rank training alone on all the rows with the same seed."""
    x, y, _, _ = digits
    rows = list(zip(x[:320], y[:320]))
    rdd = sc.parallelize([[], rows], 2).flatMap(lambda part: part)
    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2, shuffle_buffer_size=1)
    t0 = time.monotonic()
    sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
    assert time.monotonic() - t0 < 120
    first = sm.stats.epochs[0].partitions
    assert first[0]["samples"] == 0 and first[0]["batches"] == 0
    assert first[0]["global_steps"] == first[1]["global_steps"] == 10
    assert all(len(d) == 1 for d in digests(sm))
    alone = make_mlp()
    SparkModel(alone, mode="allreduce", num_workers=1, shuffle_buffer_size=1).fit(
        sc.parallelize(rows, 1), epochs=2, batch_size=32, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def small_frame(spark, digits):
    x, y, _, _ = digits
    df = spark.createDataFrame(pd.DataFrame({"features": list(x[:600].astype("float64")), "label": y[:600].astype("float64")}))
    df = df.repartition(2).cache()
    df.count()
    yield df
    df.unpersist()


def test_several_epochs_in_one_stage_equal_one_stage_per_epoch(sc, small_frame):
    """allreduce.epochsPerStage=4: one barrier stage (one task per rank, one ring) runs the four
    epochs, the partition read from Spark once and kept by each rank; each epoch's partials and
    state reach the driver between epochs. The weights and history equal a stage per epoch's bit
    for bit (the same shuffles, the same sums)."""
    fits = {}
    for per_stage in (1, 4):
        model = make_mlp()
        sm = SparkModel(model, mode="allreduce", num_workers=2, seed=3, epochs_per_stage=per_stage)
        hist = sm.fit(small_frame, epochs=4, batch_size=32, verbose=0)
        fits[per_stage] = (model.get_weights(), hist.history, sm.stats)
    for a, b in zip(fits[1][0], fits[4][0]):
        np.testing.assert_array_equal(a, b)
    assert fits[1][1] == fits[4][1]
    one, four = fits[1][2], fits[4][2]
    assert one.server["stages"] == 4 and four.server["stages"] == 1, (one.server, four.server)
    assert four.server["epoch_ends_in_stage"] == 3 and four.server["driver_rendezvous_rounds"] == 1
    # rank 0's state is broadcast round the ring once per stage, not once per epoch: the same bytes as a stage
    # per epoch in the first epoch, one state's broadcast fewer in each later one
    sent = [[sum(i["bytes_sent"] for i in e.partitions.values()) for e in s.epochs] for s in (one, four)]
    saved = [a - b for a, b in zip(*sent)]
    assert saved[0] == 0 and saved[1] == saved[2] == saved[3] > 0, sent
    epochs = four.epochs
    assert [sorted(e.partitions) for e in epochs] == [[0, 1]] * 4
    for p in (0, 1):  # one task per rank ran all four epochs: same task id, same Python worker
        infos = [e.partitions[p] for e in epochs]
        assert len({(i["task"], i["pid"]) for i in infos}) == 1, infos
        assert [i["stage_epochs"]["index"] for i in infos] == [0, 1, 2, 3]
        assert infos[0]["stage_epochs"]["kept_bytes"] > 300 * 64 * 4 and infos[0]["executor_id"] == "driver"
        assert all(i["samples"] == infos[0]["samples"] for i in infos)
    assert all(len(d) == 1 for d in digests(sm))


def test_a_callback_that_changes_the_state_ends_the_stage_and_the_next_starts_from_it(sc, small_frame):
    import keras

    fits = {}
    for per_stage in (1, 4):
        model = make_mlp()
        sched = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.003 if epoch < 2 else 0.001)
        sm = SparkModel(model, mode="allreduce", num_workers=2, seed=3, epochs_per_stage=per_stage)
        sm.fit(small_frame, epochs=4, batch_size=32, verbose=0, callbacks=[sched])
        fits[per_stage] = (model.get_weights(), sm.stats.server)
        assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.001)
    for a, b in zip(fits[1][0], fits[4][0]):
        np.testing.assert_array_equal(a, b)
    # the schedule set the same rate at epoch 2's start (state unchanged: the stage went on), a new one at 3
    assert fits[4][1]["stages"] == 2 and fits[4][1]["epoch_ends_in_stage"] == 3, fits[4][1]


def test_a_fit_stopped_between_two_epochs_of_a_stage_ends_it(sc, small_frame):
    import keras

    class StopAfterTwo(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.model.stop_training = True

    model = make_mlp()
    sm = SparkModel(model, mode="allreduce", num_workers=2, seed=3, epochs_per_stage=5)
    t0 = time.monotonic()
    hist = sm.fit(small_frame, epochs=5, batch_size=32, verbose=0, callbacks=[StopAfterTwo()])
    assert time.monotonic() - t0 < 120
    assert len(hist.history["loss"]) == 2 and len(sm.stats.epochs) == 2
    assert sm.stats.server["stages"] == 1 and sm.stats.server["epoch_ends_in_stage"] == 2
    assert sc.statusTracker().getActiveJobsIds() == []  # the ranks were told to stop: their stage has ended
    assert digests(sm)[-1] == {sm.stats.epochs[-1].partitions[0]["weights_sha256"]}


def test_a_stage_ends_where_a_validation_job_runs(small_frame, digits):
    """Validation is a Spark job of its own, which a barrier stage holding every slot would block:
    stages end after the epochs Keras' validation_freq validates (here 2 and 4 of 4), and the
    history and weights equal a stage per epoch's."""
    _, _, xt, yt = digits
    fits = {}
    for per_stage in (1, 4):
        model = make_mlp()
        sm = SparkModel(model, mode="allreduce", num_workers=2, seed=3, epochs_per_stage=per_stage)
        hist = sm.fit(small_frame, epochs=4, batch_size=32, verbose=0, validation_data=(xt, yt), validation_freq=2)
        fits[per_stage] = (model.get_weights(), hist.history, sm.stats.server)
    assert len(fits[4][1]["val_loss"]) == 2 and len(fits[4][1]["loss"]) == 4
    assert fits[4][1] == fits[1][1]
    for a, b in zip(fits[1][0], fits[4][0]):
        np.testing.assert_array_equal(a, b)
    assert fits[4][2]["stages"] == 2 and fits[4][2]["epoch_ends_in_stage"] == 2, fits[4][2]
    with pytest.raises(ConfigError, match="validation_freq"):
        SparkModel(make_mlp(), mode="allreduce").fit(small_frame, epochs=2, validation_freq=0)


def test_ring_averaging_equals_spark_averaging_and_runs_many_epochs_per_stage(spark, sc, digits):
    """mode='allreduce', frequency='epoch': each rank trains its partition with Keras' step and the
    ranks average the state through the ring; the same weights as mode='synchronous',
    frequency='epoch' (Spark merges the partials on the driver), with one stage for every epoch."""
    x, y, _, _ = digits
    rows = list(zip(x[:700], y[:700]))
    rdd = sc.parallelize([rows[:500], rows[500:]], 2).flatMap(lambda part: part)  # uneven: 500 and 200 rows
    fits = {}
    for mode, frequency, per_stage in (("synchronous", "epoch", 1), ("allreduce", "epoch", 3)):
        model = make_mlp()
        sm = SparkModel(model, mode=mode, frequency=frequency, num_workers=2, seed=5, epochs_per_stage=per_stage)
        hist = sm.fit(rdd, epochs=3, batch_size=32, verbose=0)
        fits[mode] = (model, hist.history, sm.stats)
    (spark_model, spark_hist, _), (ring_model, ring_hist, stats) = fits["synchronous"], fits["allreduce"]
    for a, b in zip(spark_model.optimizer.variables, ring_model.optimizer.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)  # slots and the step counter
    for a, b in zip(spark_model.get_weights(), ring_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for k in spark_hist:
        np.testing.assert_allclose(ring_hist[k], spark_hist[k], rtol=1e-6)
    assert int(np.asarray(ring_model.optimizer.iterations)) == 3 * -(-500 // 32)  # the longest partition's steps
    assert stats.server["engine"] == "allreduce" and stats.server["stages"] == 1 and stats.server["epoch_ends_in_stage"] == 2
    for e in stats.epochs:
        assert sorted(i["samples"] for i in e.partitions.values()) == [200, 500]
        # one exchange of the state per epoch: about 2 (N-1)/N of it in float64, plus the counters
        assert all(i["bytes_sent"] < 4 * 8 * sum(np.asarray(v).size for v in ring_model.optimizer.variables + ring_model.weights)
                   for i in e.partitions.values())
    assert all(len(d) == 1 for d in digests(type("S", (), {"stats": stats})))
    # float32 sums: half the bytes on the ring, the same mean to float32's precision
    model32 = make_mlp()
    sm32 = SparkModel(model32, mode="allreduce", frequency="epoch", num_workers=2, seed=5, epochs_per_stage=3,
                      state_sums="float32")
    sm32.fit(rdd, epochs=3, batch_size=32, verbose=0)
    for a, b in zip(ring_model.get_weights(), model32.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    sent = [sum(i["bytes_sent"] for i in e.partitions.values()) for s_ in (stats, sm32.stats) for e in s_.epochs[1:2]]
    assert 0.45 < sent[1] / sent[0] < 0.6, sent  # epoch 2: no broadcast, the state's ring (and the counters) only


def _embedding_model(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32", name="ids")
    h = keras.layers.Flatten()(keras.layers.Embedding(20, 4, name="table")(ids))
    model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy")
    return model


def test_touch_weighted_ring_averaging_keeps_rows_one_rank_trained(sc):
    """table_average='touches': each rank trains its partition, then every row of the embedding table
    (and its Adam slots) is the ranks' mean weighted by how often each looked it up; the dense weights
    by samples. Equal to two single-process Keras fits averaged that way in numpy. With 'samples' a
    row only one rank trained is pulled halfway back to the copy that never saw it."""
    rng = np.random.default_rng(4)
    parts = [rng.integers(0, 12, (96, 3)), rng.integers(8, 20, (64, 3))]  # ids 8-11 on both ranks
    labels = [(p.sum(axis=1) % 2).astype(np.float32) for p in parts]
    rows = [(x.astype(np.int32), y) for p, ys in zip(parts, labels) for x, y in zip(p, ys)]
    rdd = sc.parallelize([rows[:96], rows[96:]], 2).flatMap(lambda part: part)
    init = _embedding_model().get_weights()
    ranks = []
    for p, ys in zip(parts, labels):
        ref = _embedding_model()
        ref.set_weights(init)
        ref.fit(p.astype(np.int32), ys, batch_size=16, shuffle=False, verbose=0)
        ranks.append(ref)
    counts = np.zeros((2, 20))
    for r, p in enumerate(parts):
        np.add.at(counts[r], p.ravel(), 1)
    fits = {}
    for how in ("touches", "samples"):
        model = _embedding_model()
        model.set_weights(init)
        sm = SparkModel(model, mode="allreduce", frequency="epoch", num_workers=2, table_average=how)
        sm.fit(rdd, epochs=1, batch_size=16, shuffle=False, verbose=0)
        fits[how] = (model, sm.stats)
    model, stats = fits["touches"]
    assert stats.server["table_average"] == "touches" and stats.server["row_weighted_tables"] == ["table"]
    n = np.array([96.0, 64.0])

    def by_rows(arrays):
        a = np.stack([np.asarray(x, np.float64) for x in arrays])
        return (a * counts[:, :, None]).sum(axis=0) / counts.sum(axis=0)[:, None]

    np.testing.assert_allclose(model.get_layer("table").embeddings.numpy(),
                               by_rows([m.get_layer("table").embeddings.numpy() for m in ranks]), rtol=1e-5, atol=1e-6)
    slots = {v.name: v for v in model.optimizer.variables}
    for name in ("table_embeddings_momentum", "table_embeddings_velocity"):
        ref_slots = [next(v for v in m.optimizer.variables if v.name.endswith(name)) for m in ranks]
        got = next(v for k, v in slots.items() if k.endswith(name))
        np.testing.assert_allclose(np.asarray(got), by_rows(ref_slots), rtol=1e-5, atol=1e-7)
    dense = model.get_layer("dense") if "dense" in [layer.name for layer in model.layers] else model.layers[-1]
    for got, *refs in zip(dense.get_weights(), *(m.layers[-1].get_weights() for m in ranks)):
        np.testing.assert_allclose(got, (n[0] * refs[0] + n[1] * refs[1]) / n.sum(), rtol=1e-5, atol=1e-6)
    assert int(np.asarray(model.optimizer.iterations)) == 96 // 16  # the longer partition's steps
    # rows 0-7 only rank 0 looked up: its rows exactly with 'touches', diluted by samples with 'samples'
    only0 = ranks[0].get_layer("table").embeddings.numpy()[:8]
    np.testing.assert_allclose(model.get_layer("table").embeddings.numpy()[:8], only0, rtol=1e-5, atol=1e-6)
    diluted = fits["samples"][0].get_layer("table").embeddings.numpy()[:8]
    assert np.abs(diluted - only0).max() > 10 * np.abs(model.get_layer("table").embeddings.numpy()[:8] - only0).max() + 1e-3
    assert fits["samples"][1].server["row_weighted_tables"] == []
    with pytest.raises(ConfigError, match="table_average applies to frequency='epoch'"):
        SparkModel(make_mlp(), mode="allreduce", table_average="touches")


def _table_model(rows, seed=0, regularizer=None):
    import keras

    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int32", name="ids")
    emb = keras.layers.Embedding(rows, 4, name="table", embeddings_regularizer=regularizer)(ids)
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(emb))
    model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
    return model


def test_sparse_gradients_give_the_dense_exchange_weights_for_the_bytes_of_the_rows_touched(sc):
    """allreduce.sparseGradients: the table's gradient travels as the rows each step looked up (ids and
    rows gathered from both ranks) and every rank adds them in rank order; with 2 ranks every element is
    the same pair of floats as in the dense ring, so the weights and Adam's slots are equal bit for bit,
    also over the steps where the shorter partition's rank is out of data. The bytes moved shrink from
    the whole table to the rows touched."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 3000, (400, 3)).astype(np.int32)
    labels = ((ids % 7).sum(axis=1) % 2).astype(np.float32)
    rows = list(zip(ids, labels))
    rdd = sc.parallelize([rows[:100], rows[100:]], 2).flatMap(lambda part: part).cache()
    fits = {}
    for how in (False, True, None):
        model = _table_model(3000)
        sm = SparkModel(model, mode="allreduce", num_workers=2, sparse_gradients=how, shuffle_buffer_size=1)
        sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
        fits[how] = (model, sm.stats)
    dense, sparse = fits[False][0], fits[True][0]
    for a, b in zip(dense.get_weights() + [np.asarray(v) for v in dense.optimizer.variables],
                    sparse.get_weights() + [np.asarray(v) for v in sparse.optimizer.variables]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(sparse.get_weights(), fits[None][0].get_weights()):  # auto picks rows for this table
        np.testing.assert_array_equal(a, b)
    d_stats, s_stats = fits[False][1], fits[True][1]
    assert d_stats.server["sparse_gradients"] == [] and s_stats.server["sparse_gradients"] == ["table/embeddings"]
    assert fits[None][1].server["sparse_gradients"] == ["table/embeddings"]
    assert all(len({i["weights_sha256"] for i in e.partitions.values()}) == 1 for e in s_stats.epochs)
    for e_dense, e_sparse in zip(d_stats.epochs, s_stats.epochs):
        info = {i["rank"]: i for i in e_sparse.partitions.values()}
        assert info[0]["sparse_tables"] == 1 and info[0]["global_steps"] == 10
        assert 0 < info[0]["sparse_rows_sent"] <= 4 * 32 * 3 and 0 < info[1]["sparse_rows_sent"] <= 10 * 32 * 3
        assert "sparse_tables" not in next(iter(e_dense.partitions.values()))
        sent_dense = sum(i["bytes_sent"] for i in e_dense.partitions.values())
        sent_sparse = sum(i["bytes_sent"] for i in e_sparse.partitions.values())
        # dense: 10 steps x the 48 KB table (plus the rest); sparse: the rows touched, at most 96 per batch
        assert sent_sparse < sent_dense / 4, (sent_sparse, sent_dense)
    # float16 on the wire: the ranks still agree bit for bit, close to the float32 exchange
    model = _table_model(3000)
    sm = SparkModel(model, mode="allreduce", num_workers=2, sparse_gradients=True, compression="fp16", shuffle_buffer_size=1)
    sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
    assert all(len(d) == 1 for d in digests(sm))
    for a, b in zip(dense.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0.05, atol=0.01)
    rdd.unpersist()


def test_sparse_gradients_refused_where_they_cannot_apply(sc):
    import keras

    with pytest.raises(ConfigError, match="sparse_gradients=True applies to gradients"):
        SparkModel(make_mlp(), mode="allreduce", frequency="epoch", sparse_gradients=True)
    with pytest.raises(ConfigError, match="sparse_gradients applies to mode='allreduce' only"):
        SparkModel(make_mlp(), mode="asynchronous", sparse_gradients=True)
    ids = np.random.default_rng(0).integers(0, 50, (64, 3)).astype(np.int32)
    rdd = sc.parallelize(list(zip(ids, np.zeros(64, np.float32))), 2)
    sm = SparkModel(_table_model(50, regularizer=keras.regularizers.L2(1e-4)), mode="allreduce", num_workers=2,
                    sparse_gradients=True)
    with pytest.raises(ConfigError, match="embedding 'table' has a regularizer"):
        sm.fit(rdd, epochs=1, batch_size=16, verbose=0)
    # auto leaves that table dense, and the fit runs
    sm = SparkModel(_table_model(50, regularizer=keras.regularizers.L2(1e-4)), mode="allreduce", num_workers=2)
    sm.fit(rdd, epochs=1, batch_size=16, verbose=0)
    assert sm.stats.server["sparse_gradients"] == []


def test_auto_picks_the_tables_whose_rows_move_fewer_bytes():
    """gradient_tables: sparse_gradients=None takes a table when N ranks' rows of a batch (at most
    batch_size x the ids an example looks up) cost fewer bytes than the dense ring's share of it; the
    bound is what each rank's block may hold."""
    import keras

    from sparkdl_train.driver.sparse_tables import gradient_tables

    big, small = _table_model(3000), _table_model(50)
    index = next(i for i, w in enumerate(big.weights) if w.path == "table/embeddings")
    assert gradient_tables(big, None, 2, 32) == ((index, 96),)  # 2 x 96 x 5 < 2 x 3000 x 4
    assert gradient_tables(big, None, 64, 32) == ()  # 64 x 96 x 5 > 24,000
    assert gradient_tables(big, True, 64, 32) == ((index, 96),)
    assert gradient_tables(big, False, 2, 32) == () and gradient_tables(big, None, 1, 32) == ()
    assert gradient_tables(small, None, 2, 32) == ()  # 50 rows: a batch touches them all
    assert gradient_tables(small, True, 2, 32) == ((index, 50),)  # the bound: the table's rows
    ids = keras.Input((None,), dtype="int32")  # ids per example unknown: auto stays dense, True bounds by rows
    ragged = keras.Model(ids, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(3000, 4, name="bag")(ids))))
    assert gradient_tables(ragged, None, 2, 32) == ()
    assert gradient_tables(ragged, True, 2, 32) == ((0, 3000),)
