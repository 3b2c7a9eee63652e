"""Run by test_local_cluster.py in its own process: SparkModel on local-cluster
(separate executor JVMs and Python workers). Prints one JSON line of numbers."""

import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pandas as pd
from helpers import digits_split, make_mlp
from pyspark.sql import SparkSession

from sparkdl_train import SparkModel, jvm, to_simple_rdd
from sparkdl_train.worker.zygote import parent_of


def main(master: str) -> None:
    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "128")
        .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # the executor plugin: each executor JVM starts its Python daemon's imports as it starts
        .config(map=jvm.settings())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    x, y, xt, yt = digits_split()
    epochs = 12

    ref = make_mlp()
    ref.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    ref_acc = ref.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]

    df = spark.createDataFrame(pd.DataFrame({"id": np.arange(len(x)), "features": list(x.astype("float64")), "label": y.astype("float64")})).repartition(2)
    model = make_mlp()
    sm = SparkModel(model, num_workers=2)
    hist = sm.fit(df, epochs=epochs, batch_size=32, verbose=0)
    acc = model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    pids = sorted({(i["host"], i["pid"]) for e in sm.stats.epochs for i in e.partitions.values()})
    executors = sm.stats.executor_ids()
    # each training worker's ancestry, read from /proc while its worker lives: its daemon, the process that daemon
    # was forked from and that one's parent, with their command lines
    lineage = {}
    for _, pid in pids:
        chain, p = [], pid
        for _ in range(3):
            p = parent_of(p)
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    chain.append([p, f.read().replace(b"\0", b" ").decode()])
            except (OSError, TypeError):
                chain.append([p, None])
        lineage[str(pid)] = chain
    env_zygotes = sorted(((str(r.get("executor_id")), r.get("zygote")) for r in sm.stats.environment), key=repr)

    pred = sorted(sm.predict(df, batch_size=100).select("id", "prediction").collect())
    got = np.array([r.prediction for r in pred], dtype=np.float32)
    pred_diff = float(np.abs(got - model.predict(x, verbose=0)).max())

    dist_eval = sm.evaluate(df, return_dict=True)
    local_eval = model.evaluate(x, y, verbose=0, return_dict=True)

    rdd_model = make_mlp()
    SparkModel(rdd_model, num_workers=2).fit(to_simple_rdd(spark.sparkContext, x, y), epochs=3, batch_size=32, verbose=0)
    rdd_acc = rdd_model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]

    async_model = make_mlp()
    async_sm = SparkModel(async_model, mode="asynchronous", frequency="batch", num_workers=2)
    async_sm.fit(df, epochs=epochs, batch_size=32, verbose=0)
    async_acc = async_model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    async_server = async_sm.stats.server
    async_pids = sorted({i["pid"] for e in async_sm.stats.epochs for i in e.partitions.values()})

    # a task that dies on its first attempt: Spark retries it and the retry resumes from
    # the server's current weights (the failed attempt's pushes already count)
    rows = list(zip(x, y))

    def flaky(i):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for k, r in enumerate(rows[i::2]):
            if i == 1 and k == 600 and ctx.attemptNumber() == 0:
                raise RuntimeError("first attempt of partition 1 dies")
            yield r

    flaky_rdd = spark.sparkContext.parallelize(range(2), 2).flatMap(flaky)
    retry_model = make_mlp()
    retry_sm = SparkModel(retry_model, mode="asynchronous", frequency="batch", num_workers=2, shuffle_buffer_size=128)
    retry_hist = retry_sm.fit(flaky_rdd, epochs=epochs, batch_size=32, verbose=0)
    retry_acc = retry_model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    retry_server = retry_sm.stats.server

    # allreduce: one barrier stage per epoch, ranks in the two executors, ring over TCP
    ar_df = df.cache()  # cached: every epoch reads the rows in one order (a shuffle's blocks may arrive in any)
    ar_df.count()
    ar_model = make_mlp()
    ar_sm = SparkModel(ar_model, mode="allreduce", num_workers=2)
    ar_hist = ar_sm.fit(ar_df, epochs=epochs, batch_size=16, verbose=0)
    ar_acc = ar_model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
    ar_first = ar_sm.stats.epochs[0].partitions
    # the same fit with four epochs per barrier stage: three stages, each rank's partition kept on its executor
    st_model = make_mlp()
    st_sm = SparkModel(st_model, mode="allreduce", num_workers=2, epochs_per_stage=4)
    st_sm.fit(ar_df, epochs=epochs, batch_size=16, verbose=0)

    print("RESULT " + json.dumps({
        "ar_acc": ar_acc,
        "ar_epochs": len(ar_hist.history["loss"]),
        "ar_digests": [sorted({i["weights_sha256"] for i in e.partitions.values()}) for e in ar_sm.stats.epochs],
        "ar_pids": sorted({i["pid"] for i in ar_first.values()}),
        "ar_executor_ids": ar_sm.stats.executor_ids(),
        "ar_ranks": sorted(i["rank"] for i in ar_first.values()),
        "ar_bytes_sent": [i["bytes_sent"] for i in ar_first.values()],
        "ar_server": ar_sm.stats.server,
        "stage_same_weights": all(bool(np.array_equal(a, b)) for a, b in zip(ar_model.get_weights(), st_model.get_weights())),
        "stage_server": st_sm.stats.server,
        "stage_tasks": [sorted((p, i["executor_id"], i["pid"], i["task"]) for p, i in e.partitions.items())
                        for e in st_sm.stats.epochs],
        "stage_kept_in": sorted({str(i["stage_epochs"]["kept_in"]) for e in st_sm.stats.epochs for i in e.partitions.values()}),
        "retry_epochs": len(retry_hist.history["loss"]),
        "retry_acc": retry_acc,
        "retry_epoch_samples": [e.samples for e in retry_sm.stats.epochs],
        "retry_server_samples": retry_server["worker_samples"],
        "async_acc": async_acc,
        "async_updates": async_server["updates"],
        "async_worker_steps": async_server["worker_steps"],
        "async_pids": async_pids,
        "async_executor_ids": async_sm.stats.executor_ids(),
        "ref_acc": ref_acc,
        "acc": acc,
        "epochs": len(hist.history["loss"]),
        "worker_processes": [list(p) for p in pids],
        "executor_ids": executors,
        "master": spark.sparkContext.master,
        "driver_pid": os.getpid(),
        "driver_jvm": spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid(),
        "worker_lineage": lineage,
        "env_zygotes": env_zygotes,
        "preflight_s": sm.stats.phases.get("preflight", 0.0),
        "pred_max_abs_diff": pred_diff,
        "eval_loss": dist_eval["loss"],
        "local_loss": local_eval["loss"],
        "eval_acc": dist_eval["accuracy"],
        "local_acc": local_eval["accuracy"],
        "rdd_acc": rdd_acc,
    }))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,2048]")
