"""local-cluster[2,1,2048] with a fake GPU discovery script: each worker owns one "GPU"
(physical ids 3 and 5), executors see CUDA_VISIBLE_DEVICES=3,5, tasks ask for one GPU each.
Prints one RESULT line of JSON. Run by tests/spark/test_gpu.py."""

import json
import os
import stat
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SCRIPT = """#!/bin/sh
# a fake discovery script: the first worker to ask gets GPU 3, the next GPU 5
if mkdir "{lock}" 2>/dev/null; then
  echo '{{"name": "gpu", "addresses": ["3"]}}'
else
  echo '{{"name": "gpu", "addresses": ["5"]}}'
fi
"""


def main(master: str) -> None:
    from helpers import make_mlp
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from sparkdl_train import SparkModel

    tmp = tempfile.mkdtemp()
    script = os.path.join(tmp, "discover_gpus.sh")
    with open(script, "w") as f:
        f.write(SCRIPT.format(lock=os.path.join(tmp, "first.lock")))
    os.chmod(script, os.stat(script).st_mode | stat.S_IEXEC)
    spark = (
        SparkSession.builder.master(master).appName("sparkdl_train-gpu")
        .config("spark.ui.enabled", "false")
        .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "1g")
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", script)
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .config("spark.executorEnv.CUDA_VISIBLE_DEVICES", "3,5")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    rdd = spark.sparkContext.parallelize(list(zip(x, y.astype("int64"))), 2)
    out = {}
    for mode in ("synchronous", "allreduce"):
        model = make_mlp()
        sm = SparkModel(model, mode=mode, num_workers=2)
        hist = sm.fit(rdd, epochs=3, batch_size=32, verbose=0)
        parts = [p for e in sm.stats.epochs for p in e.partitions.values()]
        out[mode] = {
            "placements": sorted({(tuple(p.get("gpus", [])), tuple(p.get("cuda_ordinals", [])), p.get("device")) for p in parts}),
            "unplaced": sum(1 for p in parts if not p.get("gpus")),  # every epoch's tasks say which GPU they had
            "pids": sorted({p["pid"] for p in parts}),
            "executor_ids": sm.stats.executor_ids(),
            "registration": sm.stats.registration,
            "loss": hist.history["loss"],
            "acc": float(model.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]),
        }
    out["driver_pid"] = os.getpid()
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,2048]")
