"""Fits with Keras on JAX on ``local[2]``: run by tests/spark/test_jax_backend.py in a process of its own
(a process's Keras backend is fixed at its first ``import keras``; the test suite's is TensorFlow).

    KERAS_BACKEND=jax python tests/scripts/jax_check.py OUT_DIR

Writes ``OUT_DIR/jax.json`` (per case: history, evaluation, where tasks ran) and
``OUT_DIR/jax_weights.npz`` (the initial weights every case starts from, and each case's final
weights), so that the test can run the same fits on TensorFlow from the same weights and compare.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

if __name__ == "__main__":  # (imported by the test for its data and model, on the suite's TensorFlow)
    os.environ["KERAS_BACKEND"] = "jax"
    import keras  # noqa: F401 - on JAX, fixed from here on

    # the JVM and its Python workers do not inherit it: they run JAX only because sparkdl_train gives
    # its stages KERAS_BACKEND (sparkdl_train.driver.backend_env)
    del os.environ["KERAS_BACKEND"]

ROWS, FEATURES = 1024, 8
CASES = {  # name -> (SparkModel arguments, fit arguments)
    "averaging": ({}, {}),
    "sync-batch": ({"mode": "synchronous", "frequency": "batch"}, {}),
    "async-4": ({"mode": "asynchronous", "frequency": 4}, {}),
    "hogwild-batch": ({"mode": "hogwild", "frequency": "batch"}, {}),
    "allreduce": ({"mode": "allreduce"}, {}),
    "allreduce-fp16": ({"mode": "allreduce", "compression": "fp16"}, {}),
    # model averaging through the ring, both epochs in one barrier stage
    "ring-averaging-stage": ({"mode": "allreduce", "frequency": "epoch", "epochs_per_stage": 2}, {}),
}
EPOCHS, BATCH = 2, 32


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")
    return x, y


def make_model():
    import keras

    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
    m.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
    return m


def sparse_model():
    import keras

    keras.utils.set_random_seed(2)
    ids = keras.Input((3,), dtype="int32", name="ids")
    emb = keras.layers.Embedding(50, 4, name="table")(ids)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(emb))
    m = keras.Model(ids, out)
    m.compile(keras.optimizers.Adam(0.02), "binary_crossentropy", metrics=["accuracy"])
    return m


def normalized_model(x):
    """An adapted Normalization (float mean and variance, an int64 count) and a BatchNormalization."""
    import keras

    keras.utils.set_random_seed(3)
    norm = keras.layers.Normalization()
    norm.adapt(x)
    inp = keras.Input((FEATURES,))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(16, activation="relu")(norm(inp)))
    m = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(h))
    m.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
    return m, norm


def collective_step_alone(w0) -> dict:
    """sparkdl_train.backend.jax_collectives.CollectiveStep in this process (a job of one, no
    jax.distributed) against Keras' train_on_batch: a full batch, a short one (padded with weight 0),
    then zeros of weight 0 (a rank out of data: nothing moves)."""
    from sparkdl_train import _compat
    from sparkdl_train.backend.jax_collectives import CollectiveStep

    x, y = data()
    ours, keras_model = make_model(), make_model()
    ours.set_weights(w0)
    keras_model.set_weights(w0)
    template = (x[:0], y[:0], None)
    _compat.symbolic_build(ours, (x[:BATCH], y[:BATCH], None))
    step = CollectiveStep(ours, BATCH)
    step.load()
    totals = [float(np.asarray(step((x[:BATCH], y[:BATCH], None), template).addressable_data(0))[0]),
              float(np.asarray(step((x[BATCH:BATCH + 26], y[BATCH:BATCH + 26], None), template).addressable_data(0))[0])]
    step.store()
    # train_on_batch's logs are each batch's own: their row-weighted mean is the two batches' metrics
    logs = [keras_model.train_on_batch(x[:BATCH], y[:BATCH], return_dict=True),
            keras_model.train_on_batch(x[BATCH:BATCH + 26], y[BATCH:BATCH + 26], return_dict=True)]
    before = [np.array(w) for w in ours.get_weights()]
    totals.append(float(np.asarray(step(None, template).addressable_data(0))[0]))
    step.store()
    return {
        "totals": totals,
        "max_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(before, keras_model.get_weights())),
        "metrics": {k: float(v) for k, v in ours.get_metrics_result().items()},
        "keras_metrics": {k: (float(logs[0][k]) * BATCH + float(logs[1][k]) * 26) / (BATCH + 26) for k in logs[0]},
        "zeros_moved": max(float(np.max(np.abs(a - b))) for a, b in zip(before, ours.get_weights())),
    }


def xla_against_ring(sc, w0, per_stage: int, where=None, cases=("uneven", "empty", "bf16")) -> dict:
    """allreduce through XLA's collectives (each rank a process of one JAX job, jax.distributed with
    Gloo) against the project's ring, from the same weights, ``per_stage`` epochs per barrier stage
    (one rank process each): partitions of 250 and 774 rows (short last batches, one rank out of
    data for most steps), then 1024 and none (a rank with no data), then (``per_stage`` > 1) the
    first again with bfloat16 sums; then a rank that fails. ``where(stats)``, when given, records each
    fit's placement (``where`` for the XLA fit, ``ring_where`` for the ring's); ``cases``: which of them
    to run (the failing rank always)."""
    from sparkdl_train import SparkModel

    x, y = data()
    pairs = list(zip(x, y))
    out: dict = {}
    ring: dict = {}
    fits_of = [c for c in [("uneven", [pairs[:250], pairs[250:]], {}), ("empty", [pairs, []], {})] if c[0] in cases]
    if per_stage > 1 and "bf16" in cases:  # the gradients summed in bfloat16 (allreduce.compression), against the ring's float32
        fits_of.append(("bf16", [pairs[:250], pairs[250:]], {"compression": "bf16"}))
    for name, parts, extra in fits_of:
        rdd = sc.parallelize(parts, 2).flatMap(lambda part: part)
        fits = {}
        for how in ("ring", "xla") if name != "bf16" else ("xla",):
            m = make_model()
            m.set_weights(w0)
            sm = SparkModel(m, mode="allreduce", num_workers=2, collectives=how,
                            **({"epochs_per_stage": per_stage, **extra} if how == "xla" else {}))
            hist = sm.fit(rdd, epochs=EPOCHS, batch_size=BATCH, shuffle=False, verbose=0)
            fits[how] = (m, sm.stats, hist.history)
        if name != "bf16":
            ring[name] = fits["ring"]
        m, stats, history = fits["xla"]
        reference = ring["uneven" if name == "bf16" else name]
        ranks = [i for e in stats.epochs for i in e.partitions.values()]
        out[name] = {
            "max_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(m.get_weights(), reference[0].get_weights())),
            "history": history, "ring_history": reference[2], "per_stage": per_stage,
            "collectives": stats.server.get("collectives"), "stages": stats.server.get("stages"),
            "compression": stats.server.get("compression"),
            "ranks": [{k: i.get(k) for k in ("rank", "pid", "daemon_pid", "executor_id", "samples", "global_steps",
                                              "collectives", "xla_processes", "stage_epochs", "collectives_host",
                                              "coordinator")} for i in ranks],
            "accuracy": m.evaluate(x, y, verbose=0, return_dict=True)["accuracy"],
        }
        if where is not None:
            out[name]["where"] = where(stats)
            if name != "bf16":
                out[name]["ring_where"] = where(reference[1])
    # a rank whose data fails (a NaN row, nan_policy 'fail'): the fit fails at once naming it, without
    # retrying the epoch, and the other rank's process (waiting on the sums) is gone soon after
    import time

    bad = x.copy()
    bad[900, 0] = np.nan
    rdd = sc.parallelize([pairs[:512], list(zip(bad[512:], y[512:]))], 2).flatMap(lambda part: part)
    import logging

    retries: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: retries.append(record.getMessage()) if "re-running" in record.getMessage() else None
    logging.getLogger("sparkdl_train.driver.engines.allreduce").addHandler(handler)
    t0 = time.perf_counter()
    try:
        SparkModel(make_model(), mode="allreduce", num_workers=2, collectives="xla").fit(rdd, epochs=1, batch_size=BATCH,
                                                                                        verbose=0)
        out["failure"] = {"raised": None}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        failed = time.perf_counter() - t0
        left = []
        for _ in range(60):
            left = _rank_processes()
            if not left:
                break
            time.sleep(0.5)
        out["failure"] = {"raised": type(exc).__name__, "message": str(exc)[:2000], "seconds": failed,
                          "left_after": time.perf_counter() - t0 - failed, "left": left, "retries": retries}
    return out


def _rank_processes() -> list[int]:
    """The pids of XLA rank processes on this machine (/proc)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if b"sparkdl_train.worker.xla_rank" in f.read():
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def main(out_dir: str, master: str = "local[2]", cases: list[str] | None = None) -> None:
    import keras
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel, load_spark_model

    builder = (SparkSession.builder.master(master).appName("sparkdl_train-jax")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.default.parallelism", "2")
               .config("spark.python.daemon.module", "sparkdl_train.worker.daemon"))
    if master.startswith("local-cluster"):
        # GPUs as Spark task resources, as tests/scripts/gpu_check.py gives them (tests/ is first on the path):
        # each worker owns one fake GPU (physical ids 3 and 5), the executors see CUDA_VISIBLE_DEVICES=3,5
        import stat
        import tempfile

        from gpu_check import SCRIPT

        tmp = tempfile.mkdtemp()
        script = os.path.join(tmp, "discover_gpus.sh")
        with open(script, "w") as f:
            f.write(SCRIPT.format(lock=os.path.join(tmp, "first.lock")))
        os.chmod(script, os.stat(script).st_mode | stat.S_IEXEC)
        builder = (builder.config("spark.executor.memory", "1g").config("spark.worker.resource.gpu.amount", "1")
                   .config("spark.worker.resource.gpu.discoveryScript", script)
                   .config("spark.executor.resource.gpu.amount", "1").config("spark.task.resource.gpu.amount", "1")
                   .config("spark.executorEnv.CUDA_VISIBLE_DEVICES", "3,5"))
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    x, y = data()
    rdd = sc.parallelize(list(zip(x, y)), 2)
    w0 = make_model().get_weights()
    weights = {f"init_{i}": w for i, w in enumerate(w0)}
    result: dict = {"backend": keras.backend.backend(), "cases": {}}
    for name, (kwargs, fit_kwargs) in CASES.items():
        if cases is not None and name not in cases:
            continue
        m = make_model()
        m.set_weights(w0)
        sm = SparkModel(m, num_workers=2, **kwargs)
        hist = sm.fit(rdd, epochs=EPOCHS, batch_size=BATCH, shuffle=False, verbose=0, **fit_kwargs)
        result["cases"][name] = {
            "history": hist.history,
            "evaluate": m.evaluate(x, y, verbose=0, return_dict=True),
            "pids": sorted({i.get("pid") for e in sm.stats.epochs for i in e.partitions.values()}),
            "executor_ids": sorted({str(i.get("executor_id")) for e in sm.stats.epochs for i in e.partitions.values()}),
            # what the first epoch's tasks found: the model the prepare job rebuilt, its steps compiled
            "first_epoch": [{k: i.get("startup", {}).get(k) for k in ("model_cached", "traced")}
                            for i in sm.stats.epochs[0].partitions.values()],
            "first_epoch_detail": [{"pid": i.get("pid"), "attempt": i.get("attempt"), **i.get("startup", {})}
                                   for i in sm.stats.epochs[0].partitions.values()],
            "prepare": sm.stats.prepare,
            "placements": sorted({(tuple(i.get("gpus", [])), tuple(i.get("cuda_ordinals", [])), i.get("device"))
                                  for e in sm.stats.epochs for i in e.partitions.values()}),
        }
        for i, w in enumerate(m.get_weights()):
            weights[f"{name}_{i}"] = w

    if cases is None:
        result["collective_step"] = collective_step_alone(w0)
    if cases is None or "xla" in cases:
        # the default run: both epochs in one stage; a cluster run: a stage (and a rank process) per epoch
        result["xla"] = xla_against_ring(sc, w0, 2 if cases is None else 1)

    if cases is not None:  # a cluster run: the engines only
        result["executor_env"] = dict(sc.environment)
        np.savez(os.path.join(out_dir, "jax_weights.npz"), **weights)
        with open(os.path.join(out_dir, "jax.json"), "w") as f:
            json.dump(result, f, default=float)
        spark.stop()
        return

    # grouped steps compiled ahead (a prepare task's instantiate), then a pass of 23 full batches and a
    # short one in groups of 16: calls of 1, 15, then the 7 left one by one, then the short batch; only
    # the short batch's shape compiles during the pass, and the weights equal a pass of single steps
    from sparkdl_train.worker.steps import instantiate, run_steps, traces

    batches = [(x[i:i + BATCH], y[i:i + BATCH], None) for i in range(0, 23 * BATCH, BATCH)]
    batches.append((x[23 * BATCH:23 * BATCH + 10], y[23 * BATCH:23 * BATCH + 10], None))
    grouped, single = make_model(), make_model()
    single.set_weights(grouped.get_weights())
    instantiate(grouped, "train", (x[:0], y[:0], None), BATCH, 16)
    ahead = traces(grouped, "train", grouped=True)
    samples, steps = run_steps(grouped, iter(batches), True, group=16)
    run_steps(single, iter(batches), True, group=1)
    result["tail"] = {"compiled_ahead": ahead, "compiled_after": traces(grouped, "train", grouped=True),
                      "samples": samples, "steps": steps,
                      "max_diff_from_single_steps": max(float(np.max(np.abs(a - b)))
                                                         for a, b in zip(grouped.get_weights(), single.get_weights()))}

    # one worker, no shuffling: the same steps as Keras' own fit on JAX
    m = make_model()
    m.set_weights(w0)
    SparkModel(m, num_workers=1).fit(sc.parallelize(list(zip(x, y)), 1), epochs=EPOCHS, batch_size=BATCH, shuffle=False, verbose=0)
    ref = make_model()
    ref.set_weights(w0)
    ref.fit(x, y, epochs=EPOCHS, batch_size=BATCH, shuffle=False, verbose=0)
    result["one_worker_vs_keras_fit"] = max(float(np.max(np.abs(a - b))) for a, b in zip(m.get_weights(), ref.get_weights()))

    # distributed evaluate and predict of that model against Keras' own on JAX
    sm = SparkModel(m)
    result["evaluate"] = {"spark": sm.evaluate(rdd, batch_size=64), "keras": m.evaluate(x, y, verbose=0, return_dict=True)}
    df = spark.createDataFrame([(r.tolist(), float(v)) for r, v in zip(x, y[:, 0])], "features array<float>, label double")
    pred = sm.predict(df, feature_cols="features", batch_size=64)
    got = np.array([r[0] for r in pred.select(pred.columns[-1]).collect()], dtype=np.float32).reshape(-1)
    result["predict_max_diff"] = float(np.max(np.abs(got - m.predict(x, verbose=0).reshape(-1))))

    # save and load_spark_model
    path = os.path.join(out_dir, "saved")
    sm.save(path)
    loaded = load_spark_model(path)
    result["load_max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(loaded.model.get_weights(), m.get_weights()))

    # checkpoint resume: one epoch, then a fit of two that resumes, against two uninterrupted epochs
    ck = os.path.join(out_dir, "ck")
    a = make_model()
    a.set_weights(w0)
    SparkModel(a, num_workers=2).fit(rdd, epochs=1, batch_size=BATCH, shuffle=False, verbose=0, checkpoint_dir=ck)
    b = make_model()
    b.set_weights(w0)
    resumed = SparkModel(b, num_workers=2).fit(rdd, epochs=2, batch_size=BATCH, shuffle=False, verbose=0, checkpoint_dir=ck)
    result["resume"] = {"epochs_run": list(resumed.epoch),
                        "max_diff": max(float(np.max(np.abs(p - q))) for p, q in
                                        zip(b.get_weights(), [weights[f"averaging_{i}"] for i in range(len(w0))]))}

    # sparse embedding rows through the parameter server
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 50, size=(ROWS, 3)).astype("int32")
    table_w = rng.normal(size=50)
    ys = (table_w[ids].sum(axis=1) > 0).astype("float32")[:, None]
    m = sparse_model()
    # ... with bfloat16 deltas and replies (ps.compression): the rows widened into JAX's compiled write
    sm = SparkModel(m, mode="synchronous", frequency="batch", num_workers=2, sparse_embeddings=True, ps_compression="bf16")
    sm.fit(sc.parallelize(list(zip(ids, ys)), 2), epochs=3, batch_size=BATCH, verbose=0)
    result["sparse"] = {"evaluate": m.evaluate(ids, ys, verbose=0, return_dict=True),
                        "sparse_tables": (sm.stats.server or {}).get("sparse_tables"),
                        "wire": (sm.stats.server or {}).get("wire")}

    # a worker's pushes alone (tests/scripts/push_rounds.py): JAX's compiled path (bases beside the tables, ids padded
    # to a few sizes) against the eager one, with a different count of rows every push
    import push_rounds

    rounds = {c: push_rounds.run(compiled=c) for c in (True, False)}
    io = rounds[True]["sync"]._io
    result["push_rounds"] = {"max_diff": push_rounds.compare(rounds[True], rounds[False]),
                             "reused": [rounds[c]["reused"] for c in (True, False)],
                             "row_counts": [len(p[rounds[True]["tables"][0]]) for p in rounds[True]["pulled"]],
                             "executables": [io._read._cache_size(), io._write._cache_size()]}

    # the table's gradients through the allreduce as the rows each step touched, against whole tables:
    # partitions of 256 and 768 rows (one rank out of data for most steps); with 2 ranks the same weights
    pairs = list(zip(ids, ys))
    uneven = sc.parallelize([pairs[:256], pairs[256:]], 2).flatMap(lambda part: part)
    fits = {}
    for how in (False, True):
        m = sparse_model()
        sm = SparkModel(m, mode="allreduce", num_workers=2, sparse_gradients=how)
        sm.fit(uneven, epochs=2, batch_size=BATCH, shuffle=False, verbose=0)
        fits[how] = (m, sm.stats)
    result["sparse_allreduce"] = {
        "max_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(fits[False][0].get_weights(), fits[True][0].get_weights())),
        "tables": [fits[h][1].server["sparse_gradients"] for h in (False, True)],
        "digests": [len({i["weights_sha256"] for i in e.partitions.values()}) for e in fits[True][1].epochs],
        "bytes_sent": [sum(i["bytes_sent"] for e in fits[h][1].epochs for i in e.partitions.values()) for h in (False, True)],
        "rows_sent": [i.get("sparse_rows_sent") for e in fits[True][1].epochs for i in e.partitions.values()],
        "accuracy": fits[True][0].evaluate(ids, ys, verbose=0, return_dict=True)["accuracy"],
    }

    # the Spark ML estimator on a DataFrame: fitted, transformed on the executors, saved and loaded
    from sparkdl_train.ml import KerasEstimator, KerasModel

    m = make_model()
    m.set_weights(w0)
    fitted = KerasEstimator(model=m, mode="synchronous", epochs=EPOCHS, batchSize=BATCH, numWorkers=2,
                            featuresCol="features", labelCol="label").fit(df)
    keras_pred = fitted.getKerasModel().predict(x, verbose=0).reshape(-1)
    ml_path = os.path.join(out_dir, "ml_model")
    fitted.save(ml_path)
    out = KerasModel.load(ml_path).transform(df)
    got = np.array([r[0] for r in out.select("prediction").collect()], dtype=np.float32).reshape(-1)
    result["ml"] = {"accuracy": fitted.getKerasModel().evaluate(x, y, verbose=0, return_dict=True)["accuracy"],
                    "transform_max_diff": float(np.max(np.abs(got - keras_pred))),
                    "mode": fitted.fitStats["mode"], "epochs": len(fitted.history["loss"])}

    # the Elephas layer, as Elephas code calls it: synchronous per epoch is averaging, so it trains the
    # averaging case's weights
    from sparkdl_train.elephas.spark_model import SparkModel as ElephasSparkModel

    m = make_model()
    m.set_weights(w0)
    el = ElephasSparkModel(m, frequency="epoch", mode="synchronous", num_workers=2)
    el.fit(rdd, epochs=EPOCHS, batch_size=BATCH, verbose=0, validation_split=0.0, shuffle=False)
    predictions = el.predict(x[:8])
    result["elephas"] = {
        "max_diff_from_averaging": max(float(np.max(np.abs(a - weights[f"averaging_{i}"]))) for i, a in enumerate(m.get_weights())),
        "predict_type": type(predictions).__name__, "predict_rows": len(predictions),
        "predict_max_diff": float(np.max(np.abs(np.asarray(predictions) - m.predict(x[:8], verbose=0)))),
        "evaluate": el.evaluate(x, y), "histories": len(el.training_histories),
    }

    # gradient buckets during the backward pass are TensorFlow's: refused on JAX before any job
    from sparkdl_train import ConfigError

    try:
        SparkModel(make_model(), mode="allreduce", num_workers=2, bucket_bytes=1 << 20).fit(rdd, epochs=1, batch_size=BATCH, verbose=0)
        result["buckets_refused"] = None
    except ConfigError as e:
        result["buckets_refused"] = {"message": str(e)}

    # integer state (an adapted Normalization's count) and statistics (BatchNorm's) through every parameter-server
    # mode and the averaging engine (sparkdl_train.roles): the server holds the floats only
    result["roles"] = {}
    for label, kwargs in {"asynchronous": {"mode": "asynchronous", "frequency": "batch"}, "hogwild": {"mode": "hogwild", "frequency": "batch"},
                          "synchronous-4": {"mode": "synchronous", "frequency": 4}, "averaging": {}}.items():
        m, norm = normalized_model(x)
        var = {w.path.rsplit("/", 1)[1]: w for w in norm.weights}  # the adapted mean, variance and count variables
        count, mean = np.array(var["count"].numpy()), np.array(var["mean"].numpy())
        SparkModel(m, num_workers=2, **kwargs).fit(rdd, epochs=EPOCHS, batch_size=BATCH, verbose=0)
        result["roles"][label] = {"accuracy": m.evaluate(x, y, verbose=0, return_dict=True)["accuracy"],
                                  "count_kept": bool(np.array_equal(var["count"].numpy(), count)),
                                  "count_dtype": str(np.asarray(var["count"].numpy()).dtype),
                                  "mean_kept": bool(np.array_equal(var["mean"].numpy(), mean))}

    result["executor_env"] = dict(sc.environment)
    np.savez(os.path.join(out_dir, "jax_weights.npz"), **weights)
    with open(os.path.join(out_dir, "jax.json"), "w") as f:
        json.dump(result, f, default=float)
    spark.stop()


if __name__ == "__main__":
    # jax_check.py OUT_DIR [MASTER CASE,CASE]
    main(sys.argv[1], *(sys.argv[2:3]), *([sys.argv[3].split(",")] if len(sys.argv) > 3 else []))
