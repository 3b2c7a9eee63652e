"""GPU smoke benchmark: the CTR model trained by sparkdl_train on the GPU against the CPU.

On a machine with a CUDA GPU and a GPU-capable TensorFlow (a venv made with
``pip install -e ".[gpu]"``, which brings ``tensorflow[and-cuda]`` in place of the CPU-only
``tensorflow-cpu`` that ``./run`` installs; on a cluster, executors get the same from the
archive of ``./run pack --gpu``), this

1. prepares the benchmark's CTR Parquet features (``bench/e2e/ctr.py``'s data, cached
   under ``bench_data/``);
2. runs, each in its own process, one sparkdl_train worker (``mode='synchronous'``) with
   the GPU visible and with ``CUDA_VISIBLE_DEVICES=-1`` (CPU only), on a Spark session
   whose task asks for one GPU (``spark.task.resource.gpu.amount=1`` with a discovery
   script listing the visible GPUs), so the task pins TensorFlow to the GPU Spark gave it;
3. prints steady-state samples/s of each and the GPU/CPU ratio, plus where the task ran.

    python -m bench.gpu.smoke                 # 1M rows, batch 4096, 3 epochs
    python -m bench.gpu.smoke --rows 200000   # quicker

Without a GPU it says so and exits 0 after the CPU run (nothing to compare).

On a GPU cluster the same placement runs on every executor: submit with
``--archives sparkdl_env.tar.gz#environment`` (from ``./run pack --gpu``),
``spark.executor.resource.gpu.amount=1``, ``spark.task.resource.gpu.amount=1`` and
``spark.executor.resource.gpu.discoveryScript`` (Spark ships ``getGpusResources.sh``);
``conf/spark-defaults.yarn.conf`` has the lines to uncomment.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import time

from bench.e2e import ctr as e2e_ctr
from bench.harness.results import ROOT

DISCOVERY = """#!/bin/sh
# lists every GPU nvidia-smi reports (physical ids), as Spark's resource discovery expects
ids=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ' | awk 'NF' | sed 's/.*/"&"/' | paste -sd, -)
echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [$ids]}"
"""


def child(cfg: dict) -> None:
    import tensorflow as tf
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel

    meta = cfg["meta"]
    gpus = tf.config.list_physical_devices("GPU")
    b = (
        SparkSession.builder.master("local[2]").appName("sparkdl_train gpu smoke")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "4g").config("spark.ui.enabled", "false")
    )
    if gpus:
        # local mode: the driver's resources are the tasks' resources
        b = (b.config("spark.driver.resource.gpu.amount", "1")
             .config("spark.driver.resource.gpu.discoveryScript", cfg["discovery"])
             .config("spark.task.resource.gpu.amount", "1"))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    train = spark.read.parquet(os.path.join(meta["path"], "train"))
    model = e2e_ctr.build_model(meta["vocab_size"])
    sm = SparkModel(model, num_workers=1, seed=e2e_ctr.SEED)
    t0 = time.perf_counter()
    sm.fit(train, epochs=cfg["epochs"], batch_size=cfg["batch_size"], verbose=0,
           feature_cols={"numeric": "numeric", "categorical": "categorical"}, label_col="label")
    wall = time.perf_counter() - t0
    epochs = sm.stats.epochs
    steady = e2e_ctr.throughput([e.samples for e in epochs], [e.seconds for e in epochs])
    part = next(iter(epochs[-1].partitions.values()))
    print("RESULT " + json.dumps({
        "tf_gpus": [g.name for g in gpus],
        "placement": {k: part.get(k) for k in ("gpus", "cuda_ordinals", "device")},
        "samples_per_second": steady["samples_per_second"],
        "wall_seconds": wall,
    }), flush=True)
    spark.stop()


def run(cfg: dict, cpu_only: bool) -> dict:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.smoke", "--child", json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{'cpu' if cpu_only else 'gpu'} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--work", default=os.path.join(ROOT, "bench_data"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    os.makedirs(args.work, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need this interpreter's keras
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    meta = e2e_ctr.prepare(args.rows, args.work)
    discovery = os.path.join(tempfile.mkdtemp(), "discover_gpus.sh")
    with open(discovery, "w") as f:
        f.write(DISCOVERY)
    os.chmod(discovery, os.stat(discovery).st_mode | stat.S_IEXEC)
    cfg = {"meta": meta, "epochs": args.epochs, "batch_size": args.batch_size, "discovery": discovery}
    print(f"CTR DeepFM, {meta['train_rows']:,} training rows, batch {args.batch_size}, {args.epochs} epochs, "
          "one sparkdl_train worker on local[2]", flush=True)
    cpu = run(cfg, cpu_only=True)
    print(f"cpu: {cpu['samples_per_second']:,.0f} samples/s (steady state)", flush=True)
    gpu = run(cfg, cpu_only=False)
    if not gpu["tf_gpus"]:
        print("no GPU visible to TensorFlow here: nothing to compare (install tensorflow[and-cuda] on a GPU machine)")
        return
    print(f"gpu: {gpu['samples_per_second']:,.0f} samples/s (steady state); TensorFlow sees {gpu['tf_gpus']}; "
          f"the task ran on {gpu['placement']}")
    print(f"gpu / cpu: {gpu['samples_per_second'] / cpu['samples_per_second']:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
