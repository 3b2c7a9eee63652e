"""Submitted once by tests/cluster/test_standalone.py with spark-submit (no master here: the cluster's) and the
shipped archive: three jobs in one application, so that the Workers' executors unpack the archive and
import TensorFlow once for all three (each job's own assertions are the test's):

* the flagship job, ``jobs/train_ctr.py`` (``--ctr`` arguments: its default engine, features from Parquet files);
* the image job, ``jobs/train_images.py`` (``--images`` arguments: PNG bytes decoded on the executors);
* RDD fits of (x, y) rows, each as a user builds them, and where and how each ran (:func:`rdd_fits`),
  per-step allreduce fits with the embedding gradients whole and as rows (:func:`sparse_allreduce_fits`),
  parameter-server fits with float32 and bfloat16 on the wire (:func:`ps_wire_fits`), and, where the
  Workers are hosts of their own (``--hosts``, minicluster/hosts.py), fits whose hosts' links this
  driver measures, slows and cuts (:func:`host_fits`):

  * ``parallelized``: ``sc.parallelize(list(zip(x, y)))`` as Elephas' to_simple_rdd builds it: the
    JVM takes the fit's sample from its frames, no Python task;
  * ``mapped``: sparkdl_train's to_simple_rdd (a Python flatMap, not cached): Python tasks read the
    sample and stay in Spark's pool;
  * ``cached`` then ``cached_again``: the same, cached and counted (every partition cached: the JVM
    path), then fitted once more (the first fit's sample kept).

The jobs run with the application's session (their ``main(argv, spark)``), loaded from their files and
registered with cloudpickle to be pickled by value (the executors cannot import jobs/). Each writes its
summary into its own folder under ``--output``: ``ctr/summary.json``, ``images/images_summary.json``,
``rdd/summary.json``.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from helpers import digits_split, make_mlp
from jobfiles import load_job

from sparkdl_train import SparkModel, to_simple_rdd
from sparkdl_train.driver.submit import start_job, where_it_ran

EPOCHS = 6


def rdd_fits(spark, out_dir: str) -> None:
    sc = spark.sparkContext
    x, y, xt, yt = digits_split()
    ref = make_mlp()
    ref.fit(x, y, epochs=EPOCHS, batch_size=32, verbose=0)
    summary = {"reference_accuracy": ref.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"], "rows": len(x), "fits": {}}

    def fit(name, rdd):
        model = make_mlp()
        sm = SparkModel(model, num_workers=2)
        history = sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0)
        first = sm.stats.epochs[0].partitions.values()
        summary["fits"][name] = {
            **where_it_ran(spark, sm.stats),
            "sample_source": sm.stats.sample_source,
            "data_source": sm.stats.data_source,
            "prepared_workers": sm.stats.prepare["python_workers"] if sm.stats.prepare else None,
            "first_epoch_tasks": [{k: i[k] for k in ("host", "pid", "executor_id")}
                                  | {k: i["startup"].get(k) for k in ("model_cached", "traced")} for i in first],
            "samples": [e.samples for e in sm.stats.epochs],
            "epochs": len(history.history["loss"]),
            "accuracy": model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"],
        }

    fit("parallelized", sc.parallelize(list(zip(x, y)), 2))
    fit("mapped", to_simple_rdd(sc, x, y, 2))
    cached = to_simple_rdd(sc, x, y, 2).cache()
    cached.count()
    fit("cached", cached)
    fit("cached_again", cached)
    summary["sparse_allreduce"] = sparse_allreduce_fits(spark)
    summary["ps_wire"] = ps_wire_fits(spark, cached, xt, yt)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("rdd fits: " + ", ".join(f"{k} {v['accuracy']:.3f} ({v['sample_source']})" for k, v in summary["fits"].items()))


def sparse_allreduce_fits(spark) -> dict:
    """Per-step allreduce of a model with an embedding table read from its input, the table's gradients
    whole and as the rows each step touched (allreduce.sparseGradients), on partitions of 200 and 600
    rows: where they ran, the weights of both, the bytes each rank sent."""
    import keras
    import numpy as np

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 3000, (800, 3)).astype(np.int32)
    labels = ((ids % 5).sum(axis=1) % 2).astype(np.float32)
    rows = list(zip(ids, labels))
    rdd = spark.sparkContext.parallelize([rows[:200], rows[200:]], 2).flatMap(lambda part: part)
    out = {}
    for how in (False, True):
        keras.utils.set_random_seed(0)
        inp = keras.Input((3,), dtype="int32", name="ids")
        h = keras.layers.Flatten()(keras.layers.Embedding(3000, 4, name="table")(inp))
        model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, activation="relu")(h)))
        model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy")
        sm = SparkModel(model, mode="allreduce", num_workers=2, sparse_gradients=how)
        sm.fit(rdd, epochs=2, batch_size=32, verbose=0, shuffle=False)
        out[str(how)] = {**where_it_ran(spark, sm.stats), "tables": sm.stats.server["sparse_gradients"],
                         "weights_sha256": [sorted({i["weights_sha256"] for i in e.partitions.values()}) for e in sm.stats.epochs],
                         "bytes_sent": sum(i["bytes_sent"] for e in sm.stats.epochs for i in e.partitions.values()),
                         "rows_sent": [i.get("sparse_rows_sent") for e in sm.stats.epochs for i in e.partitions.values()]}
    return out


def ps_wire_fits(spark, rdd, xt, yt) -> dict:
    """Synchronous parameter-server fits pushing every 4 steps with float32 and bfloat16 deltas and
    replies (ps.compression): where they ran, the server's bytes and pushes, the test accuracy."""
    out = {}
    for wire in (None, "bf16"):
        model = make_mlp()
        sm = SparkModel(model, mode="synchronous", frequency=4, num_workers=2, ps_compression=wire)
        sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0)
        server = sm.stats.server
        out[str(wire)] = {**where_it_ran(spark, sm.stats), "wire": server["wire"], "updates": server["updates"],
                          "bytes": server["bytes_in"] + server["bytes_out"],
                          "accuracy": model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]}
    return out


def wide_mlp(seed=0):
    """The digits MLP with two 384-wide hidden layers (176k weights, 0.7 MB): its exchanges, not
    Spark's own messages, are most of what crosses the links."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,), name="pixels"), keras.layers.Dense(384, activation="relu"),
                              keras.layers.Dense(384, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.001), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def host_fits(spark, network, out_dir: str) -> None:
    """Fits on the Workers' hosts whose links this driver watches and changes (it runs as root beside
    the namespaces the test made; ``network`` names them): what each link carried against what the
    engine counted, a server address on loopback refused, a straggler host, a link cut and restored
    under each engine, a link cut past the ring's and the synchronous rounds' timeouts, predict/evaluate and
    the Spark ML estimator.
    Writes ``hosts/summary.json``."""
    import threading
    import time

    import numpy as np
    from fault_check import listening_sockets, sdt_threads
    from helpers import digits_frame as frame
    from helpers import settle

    from minicluster.hosts import Link
    from sparkdl_train.errors import SparkDLError
    from sparkdl_train.ml import KerasEstimator

    sc = spark.sparkContext
    x, y, xt, yt = digits_split()
    rdd = sc.parallelize(list(zip(x, y)), 2).cache()
    rdd.count()
    out: dict = {"addresses": network.addresses, "driver_address": network.driver_address}
    listening_before = listening_sockets()

    def accuracy(model):
        return float(model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])

    def measured(name, model, **kw):
        epochs = kw.pop("epochs", 2)
        before, t = network.counters(), time.perf_counter()
        sm = SparkModel(model, num_workers=2, **kw)
        sm.fit(rdd, epochs=epochs, batch_size=32, verbose=0)
        seconds, after = time.perf_counter() - t, network.counters()
        parts = [i for e in sm.stats.epochs for i in e.partitions.values()]
        out[name] = {**where_it_ran(spark, sm.stats), "server": sm.stats.server, "seconds": seconds, "accuracy": accuracy(model),
                     "epoch_s": [e.seconds for e in sm.stats.epochs],
                     "links": {a: {k: after[a][k] - before[a][k] for k in ("rx", "tx")} for a in after},
                     "tasks": [{k: i.get(k) for k in ("executor_id", "seconds", "pushes", "bytes_sent", "batches", "push_round_trip_seconds")}
                               for i in parts]}
        return sm

    # what the links carried: the parameter server (TLS on) and the ring, on a model whose exchanges dominate
    measured("ps_bytes", wide_mlp(), mode="asynchronous", frequency="batch", tls="on")
    measured("ring_bytes", wide_mlp(), mode="allreduce", tls="on")
    # the driver's servers on loopback while the executors are elsewhere: refused before any training stage
    t = time.perf_counter()
    try:
        SparkModel(make_mlp(), mode="asynchronous", num_workers=2, ps_host="127.0.0.1").fit(rdd, epochs=1, verbose=0)
        out["loopback"] = {"error": None}
    except SparkDLError as exc:
        out["loopback"] = {"error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t}
    # a straggler host: its link at 10 Mb/s; the synchronous rounds wait for it and say so, hogwild's do not
    network.shape(1, Link(rate="10mbit", burst="16kb"))
    try:
        measured("straggler_sync", make_mlp(), mode="synchronous", frequency="batch", epochs=3)
        measured("straggler_hogwild", make_mlp(), mode="hogwild", frequency="batch", epochs=3)
    finally:
        network.restore_shape(1)

    def executors_idle() -> bool:
        return all(i.numRunningTasks() == 0 for i in sc._jsc.sc().statusTracker().getExecutorInfos())

    # a link cut for a few seconds mid-fit, then restored: the fit goes on (TCP resends what was lost)
    def cut_during(epoch, seconds, log):
        import keras

        class Cut(keras.callbacks.Callback):
            def on_epoch_end(self, e, logs=None):
                log.setdefault("ends", {})[e] = time.perf_counter()

            def on_epoch_begin(self, e, logs=None):
                log["epoch"] = e
                log.setdefault("begins", {})[e] = time.perf_counter()
                if e == epoch:
                    # halfway into the epoch, by the one before it (the same work): both workers joined and
                    # exchanging, the epoch's end still ahead
                    delay = 0.5 * (log["ends"][e - 1] - log["begins"][e - 1])

                    def cut():
                        time.sleep(delay)
                        network.cut(1)
                        log["cut_at"], log["cut_in_epoch"] = time.perf_counter(), log["epoch"]
                        time.sleep(seconds)
                        network.restore(1)
                        log["restored_at"] = time.perf_counter()
                    log["thread"] = threading.Thread(target=cut, daemon=True)
                    log["thread"].start()
        return Cut()

    out["cuts"] = {}
    for name, settings in (("averaging", {"mode": "synchronous"}), ("synchronous", {"mode": "synchronous", "frequency": "batch"}),
                           ("asynchronous", {"mode": "asynchronous", "frequency": "batch"}),
                           ("hogwild", {"mode": "hogwild", "frequency": "batch"}), ("allreduce", {"mode": "allreduce"})):
        log: dict = {}
        model = make_mlp()
        sm = SparkModel(model, num_workers=2, **settings)
        t = time.perf_counter()
        sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[cut_during(2, 4.0, log)])
        log["thread"].join()
        out["cuts"][name] = {**where_it_ran(spark, sm.stats), "seconds": time.perf_counter() - t, "cut_s": log["restored_at"] - log["cut_at"],
                             "cut_in_epoch": log["cut_in_epoch"], "epoch_s": [e.seconds for e in sm.stats.epochs],
                             # each epoch's begin and end (the callbacks'), in seconds from the cut
                             "windows": [[log["begins"][e] - log["cut_at"], log["ends"][e] - log["cut_at"]] for e in sorted(log["ends"])],
                             "epoch_samples": [e.samples for e in sm.stats.epochs], "accuracy": accuracy(model)}

    # a link cut for longer than the ring's timeout, and than the synchronous rounds': the fit fails within a
    # bounded time, naming the host, long before the link comes back
    for name, settings in (("cut_ring", {"mode": "allreduce", "allreduce_timeout": 8.0}),
                           ("cut_ps", {"mode": "synchronous", "frequency": "batch", "round_timeout": 8.0})):
        log = {}
        sm = SparkModel(make_mlp(), num_workers=2, **settings)
        t = time.perf_counter()
        try:
            sm.fit(rdd, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=[cut_during(2, 18.0, log)])
            out[name] = {"error": None}
        except SparkDLError as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}", "failed_after_cut_s": time.perf_counter() - log["cut_at"]}
        log["thread"].join()
        out[name].update(seconds=time.perf_counter() - t, cut_s=log["restored_at"] - log["cut_at"])
        # the failed fit's tasks on host 1 end once its link is back (their peers are gone): the next fit
        # starts on idle executors
        t = time.perf_counter()
        out[name]["executors_idle"] = bool(settle(executors_idle, 60))
        out[name]["idle_after_s"] = time.perf_counter() - t
    # after every cut, the failed fits' included: no server, ring listener or helper thread of a fit left
    settle(lambda: not sdt_threads(), 10)
    out["left_after_cuts"] = {"threads": sdt_threads(), "listening": len(listening_sockets() - listening_before)}

    # predict and evaluate on the hosts, and the Spark ML estimator (model averaging), against Keras in this process
    model = make_mlp()
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    test = frame(spark, xt, yt)
    sm = SparkModel(model, num_workers=2)
    dist = sm.evaluate(test, return_dict=True)
    local = model.evaluate(xt, yt, verbose=0, return_dict=True)
    rows = sm.predict(test, batch_size=100).select("id", "prediction").toPandas().sort_values("id")
    got = np.stack(rows["prediction"].to_numpy())
    out["predict_evaluate"] = {"loss_diff": abs(dist["loss"] - local["loss"]), "rows": len(rows),
                               "max_diff": float(np.abs(got - model.predict(xt, verbose=0)).max())}
    fitted = KerasEstimator(model=make_mlp(), mode="synchronous", frequency="epoch", epochs=EPOCHS, batchSize=32,
                            numWorkers=2).fit(frame(spark, x, y))
    scored = fitted.transform(test).select("id", "prediction").toPandas().sort_values("id")
    out["estimator"] = {"accuracy": float((np.argmax(np.stack(scored["prediction"].to_numpy()), axis=1) == yt).mean()),
                        "executor_ids": fitted.fitStats["executor_ids"]}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    print("host fits: " + ", ".join(f"{k} {v.get('accuracy', '')}" for k, v in out.items() if isinstance(v, dict)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    p.add_argument("--ctr", required=True, help="train_ctr.py's arguments, as a JSON list")
    p.add_argument("--images", required=True, help="train_images.py's arguments, as a JSON list")
    p.add_argument("--hosts", help="the Workers' host network (minicluster.hosts.HostNetwork.describe()), as JSON")
    args = p.parse_args()
    spark, _, out_dir = start_job("sparkdl_train-standalone-jobs", args.output)
    load_job("train_ctr").main([*json.loads(args.ctr), "--output", os.path.join(out_dir, "ctr")], spark=spark)
    load_job("train_images").main([*json.loads(args.images), "--output", os.path.join(out_dir, "images")], spark=spark)
    rdd_fits(spark, os.path.join(out_dir, "rdd"))
    if args.hosts:
        from minicluster.hosts import HostNetwork

        host_fits(spark, HostNetwork.attach(json.loads(args.hosts)), os.path.join(out_dir, "hosts"))
    spark.stop()


if __name__ == "__main__":
    main()
