"""End-to-end CTR benchmark: sparkdl_train against plain single-process Keras.

On one generated CTR dataset (planted model, ``--rows`` rows, written once as
Parquet features), each configuration runs in its own process (fresh JVM,
fresh Python workers, so peak memory is its own) and trains the same seeded
DeepFM for ``--epochs`` epochs with the same batch size and learning rate:

1. ``keras``: plain ``model.fit`` on numpy arrays, one process, every core;
2. ``sdt-1w``: sparkdl_train with one worker (``local[N]``, all cores to it):
   the framework tax is its samples/s over (1)'s;
3. every engine with 2 workers on ``local[2]`` and on ``local-cluster[2,1,...]``:
   synchronous model averaging, asynchronous and hogwild parameter server
   (push every 4 steps, sparse embedding rows), ring allreduce;
4. memory: asynchronous PS on ``local-cluster`` at ``--rows`` and at
   ``--memory-rows`` (one epoch each): executor peak RSS must stay within 1.2x
   (partitions are streamed from Parquet, never loaded whole).

Reported per run: steady-state training samples/s (epochs after the first;
training jobs only, validation excluded), startup (the first epoch's extra
seconds: TensorFlow import and model rebuild on fresh workers, tracing),
seconds of training (startup included) until the held-out AUC first reaches
99% of (1)'s best, evaluated after each epoch,
final test AUC and logloss, bytes communicated per training sample, peak RSS
of the driver's Python process and of the executors' Python workers. Ratios
are printed against (1), measured in the same invocation.

Threads are set explicitly and printed: each process gets
``OMP_NUM_THREADS`` / TF intra-op = its share of the cores, TF inter-op = 2.

    python -m bench.e2e.ctr                      # 1M rows, then the 4M-row memory run
    python -m bench.e2e.ctr --rows 200000 --memory-rows 800000 --skip-local-cluster   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from bench.harness import results as results_file
from bench.harness.results import ROOT

SEED = 7
LR = 0.002


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    return {
        "OMP_NUM_THREADS": str(threads),
        "TF_NUM_INTRAOP_THREADS": str(threads),
        "TF_NUM_INTEROP_THREADS": str(min(2, threads)),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "KERAS_BACKEND": "tensorflow",
    }


def peak_rss_mb() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# -- child: prepare the data ------------------------------------------------------------------

def spark_session(master: str, threads_per_worker: int, app: str, extra: dict | None = None):
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.master(master).appName(app)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "3g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "8192")
        # one Parquet file = one partition = one worker's stream
        .config("spark.sql.files.maxPartitionBytes", str(4 << 30))
        .config("spark.sql.files.openCostInBytes", str(4 << 30))
        .config("spark.sparkdl_train.worker.threads", str(threads_per_worker))
    )
    for k, v in thread_env(threads_per_worker).items():
        b = b.config(f"spark.executorEnv.{k}", v)
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def prepare(rows: int, work: str) -> dict:
    """Generate the CTR data and write the model's features as Parquet (2 files per split)."""
    out = os.path.join(work, f"ctr_{rows}")
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            return json.load(f)
    from pyspark.sql import functions as F

    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.models.ctr import build_vocabulary, ctr_features

    spark = spark_session(f"local[{cores()}]", 1, "sparkdl_train bench: prepare")
    t0 = time.perf_counter()
    raw_path = os.path.join(out, "raw")
    ctr_data.write(spark, ctr_data.CTRSpec(rows=rows, seed=SEED), raw_path)
    raw = spark.read.parquet(raw_path)
    is_test = F.pmod(F.xxhash64("id"), F.lit(10)) == 0
    vocab = build_vocabulary(raw.where(~is_test), ctr_data.CAT_COLS, min_count=5)
    keep = ["label", "p_true"]
    for name, part in (("train", raw.where(~is_test)), ("test", raw.where(is_test))):
        ctr_features(part, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, keep).repartition(2).write.mode(
            "overwrite").parquet(os.path.join(out, name))
    test = spark.read.parquet(os.path.join(out, "test"))
    meta = {
        "rows": rows,
        "train_rows": spark.read.parquet(os.path.join(out, "train")).count(),
        "test_rows": test.count(),
        "vocab_size": vocab.size,
        "bayes": ctr_data.bayes_metrics(test),
        "prepare_seconds": time.perf_counter() - t0,
        "path": out,
    }
    spark.stop()
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=1)
    return meta


# -- child: one configuration -------------------------------------------------------------------

def build_model(vocab_size: int):
    import keras

    from sparkdl_train.models.ctr import deepfm

    keras.utils.set_random_seed(SEED)
    return deepfm(vocab_size=vocab_size, embed_dim=8, hidden=(64, 32), learning_rate=LR)


def read_arrays(path: str):
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["numeric", "categorical", "label"])
    n = t.num_rows
    numeric = t.column("numeric").combine_chunks().flatten().to_numpy().reshape(n, -1).astype("float32")
    categorical = t.column("categorical").combine_chunks().flatten().to_numpy().reshape(n, -1).astype("int32")
    label = t.column("label").to_numpy().astype("float32")
    return {"numeric": numeric, "categorical": categorical}, label


def run_keras(cfg: dict, meta: dict) -> dict:
    import keras
    import tensorflow as tf

    threads = cfg["threads"]
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    x, y = read_arrays(os.path.join(meta["path"], "train"))
    xt, yt = read_arrays(os.path.join(meta["path"], "test"))
    model = build_model(meta["vocab_size"])

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.train_seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()

        def on_test_begin(self, logs=None):  # validation starts: the epoch's training is over
            self.train_seconds.append(time.perf_counter() - self._t)

    clock = Clock()
    hist = model.fit(x, y, epochs=cfg["epochs"], batch_size=cfg["batch_size"], validation_data=(xt, yt),
                     callbacks=[clock], verbose=0, shuffle=True)
    final = model.evaluate(xt, yt, batch_size=4096, verbose=0, return_dict=True)
    return {
        **throughput([len(y)] * cfg["epochs"], clock.train_seconds),
        "epoch_train_seconds": clock.train_seconds,
        "epoch_val_auc": hist.history["val_auc"],
        "test_auc": final["auc"],
        "test_logloss": final["loss"],
        "bytes_per_sample": 0.0,
        "driver_peak_rss_mb": peak_rss_mb(),
        "executor_peak_rss_mb": None,
    }


def throughput(samples: list[int], seconds: list[float]) -> dict:
    """Steady-state samples/s (epochs after the first) and the first epoch's extra seconds
    (TensorFlow import and model rebuild on fresh workers, tracing: paid once per fit)."""
    if len(seconds) < 2:
        return {"samples_per_second": sum(samples) / sum(seconds), "startup_seconds": None}
    steady = sum(samples[1:]) / sum(seconds[1:])
    return {"samples_per_second": steady, "startup_seconds": seconds[0] - samples[0] / steady}


def communicated_bytes(stats, state_bytes: int) -> float:
    server = stats.server or {}
    if server.get("engine") == "allreduce":
        return float(server["bytes_sent"])
    if server:
        return float(server["bytes_in"] + server["bytes_out"])
    # model averaging: the state is broadcast to every worker and every worker returns its own
    return float(2 * state_bytes * stats.num_workers * len(stats.epochs))


def run_sdt(cfg: dict, meta: dict) -> dict:
    import numpy as np

    from sparkdl_train import SparkModel

    spark = spark_session(cfg["master"], cfg["threads"], f"sparkdl_train bench: {cfg['name']}")
    try:
        train = spark.read.parquet(os.path.join(meta["path"], "train"))
        test = spark.read.parquet(os.path.join(meta["path"], "test"))
        model = build_model(meta["vocab_size"])
        state_bytes = sum(np.asarray(v).nbytes for v in [*model.weights, *model.optimizer.variables])
        columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
        sm = SparkModel(model, mode=cfg["mode"], frequency=cfg.get("frequency"), num_workers=cfg["workers"],
                        seed=SEED, worker_threads=cfg["threads"])
        hist = sm.fit(train, epochs=cfg["epochs"], batch_size=cfg["batch_size"], validation_data=test, verbose=0, **columns)
        final = sm.evaluate(test, batch_size=4096, return_dict=True, **columns)
        stats = sm.stats
        samples = sum(e.samples for e in stats.epochs)
        rss = [p.get("peak_rss_mb", 0.0) for e in stats.epochs for p in e.partitions.values()]
        return {
            **throughput([e.samples for e in stats.epochs], [e.seconds for e in stats.epochs]),
            "epoch_train_seconds": [e.seconds for e in stats.epochs],
            "epoch_val_auc": hist.history["val_auc"],
            "test_auc": final["auc"],
            "test_logloss": final["loss"],
            "bytes_per_sample": communicated_bytes(stats, state_bytes) / samples,
            "driver_peak_rss_mb": peak_rss_mb(),
            "executor_peak_rss_mb": max(rss) if rss else None,
            "server": stats.server,
        }
    finally:
        spark.stop()


def child(cfg_json: str) -> None:
    cfg = json.loads(cfg_json)
    if cfg["kind"] == "prepare":
        result = prepare(cfg["rows"], cfg["work"])
    else:
        meta = prepare(cfg["rows"], cfg["work"])
        result = run_keras(cfg, meta) if cfg["kind"] == "keras" else run_sdt(cfg, meta)
        result.update(name=cfg["name"], rows=cfg["rows"], threads=cfg["threads"], master=cfg.get("master"),
                      workers=cfg.get("workers", 1), epochs=cfg["epochs"])
    with open(cfg["result"], "w") as f:
        json.dump(result, f, indent=1, default=str)


# -- parent: orchestrate ----------------------------------------------------------------------------

def launch(cfg: dict, threads: int) -> dict:
    env = {**os.environ, **thread_env(threads), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "conf"))  # quiet log4j
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.e2e.ctr", "--child", json.dumps(cfg)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:])
        raise SystemExit(f"{cfg.get('name', cfg['kind'])} failed (exit {proc.returncode})")
    with open(cfg["result"]) as f:
        result = json.load(f)
    result["wall_seconds"] = time.perf_counter() - t0
    return result


def time_to(target: float, r: dict) -> float | None:
    elapsed = 0.0
    for seconds, auc in zip(r["epoch_train_seconds"], r["epoch_val_auc"]):
        elapsed += seconds
        if auc >= target:
            return elapsed
    return None


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--memory-rows", type=int, default=4_000_000, help="rows of the memory run (0: skip it)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench_data"))
    ap.add_argument("--skip-local-cluster", action="store_true")
    ap.add_argument("--only", help="comma-separated run names to keep (keras always runs), e.g. sdt-1w")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)

    n = cores()
    work = os.path.abspath(args.work)
    res_dir = os.path.join(work, "results")
    os.makedirs(res_dir, exist_ok=True)
    base = {"epochs": args.epochs, "batch_size": args.batch_size, "work": work}
    print(f"sparkdl_train e2e CTR benchmark: {args.rows:,} rows, {args.epochs} epochs, batch {args.batch_size}, {n} cores")
    print(f"threads: single process and one worker: OMP_NUM_THREADS = TF intra-op = {n}, inter-op = {min(2, n)}; "
          f"two workers: {max(1, n // 2)} each (spark.sparkdl_train.worker.threads, spark.executorEnv.OMP_NUM_THREADS)")
    t0 = time.perf_counter()
    meta = launch({"kind": "prepare", "rows": args.rows, "work": work, "result": os.path.join(res_dir, "prepare.json")}, n)
    print(f"data: {meta['train_rows']:,} train / {meta['test_rows']:,} test rows, vocabulary {meta['vocab_size']:,}, "
          f"Bayes-optimal AUC {meta['bayes']['auc']:.4f} ({time.perf_counter() - t0:.0f} s)")

    engines = [("sync-avg", "synchronous", None), ("async-ps", "asynchronous", 4), ("hogwild-ps", "hogwild", 4), ("allreduce", "allreduce", None)]
    masters = [f"local[{n}]"] + ([] if args.skip_local_cluster else [f"local-cluster[2,{max(1, n // 2)},4096]"])
    configs = [dict(kind="keras", name="keras", rows=args.rows, threads=n),
               dict(kind="sdt", name="sdt-1w", rows=args.rows, threads=n, master=f"local[{n}]", workers=1, mode="synchronous")]
    for master in masters:
        tag = "local" if master.startswith("local[") else "local-cluster"
        for name, mode, freq in engines:
            configs.append(dict(kind="sdt", name=f"{name} {tag}", rows=args.rows, threads=max(1, n // 2), master=master,
                                workers=2, mode=mode, frequency=freq))
    if args.only:
        keep = {k.strip() for k in args.only.split(",")}
        configs = [c for c in configs if c["name"] == "keras" or c["name"] in keep]
    results = []
    for cfg in configs:
        cfg = {**base, **cfg, "result": os.path.join(res_dir, cfg["name"].replace(" ", "_") + ".json")}
        r = launch(cfg, cfg["threads"])
        results.append(r)
        print(f"  {r['name']:<26} {r['samples_per_second']:>9,.0f} samples/s  AUC {r['test_auc']:.4f}  ({r['wall_seconds']:.0f} s)", flush=True)

    ref = results[0]
    target = 0.99 * max(ref["epoch_val_auc"])
    ref_time = time_to(target, ref)
    print(f"\ntarget AUC = 99% of single-process Keras' best held-out AUC = {target:.4f}")
    header = ("| run | workers | samples/s | vs Keras | startup s | time to target AUC (s) | vs Keras | test AUC | logloss "
              "| bytes/sample | driver RSS MiB | executor RSS MiB |")
    lines = [header, "|" + "---|" * 12]
    reached = True
    for r in results:
        tt = time_to(target, r)
        reached &= tt is not None
        lines.append(
            f"| {r['name']} | {r['workers']} | {r['samples_per_second']:,.0f} | {r['samples_per_second'] / ref['samples_per_second']:.2f} "
            f"| {fmt(r['startup_seconds'], '.1f')} | {fmt(tt, '.1f')} | {fmt(ref_time / tt if tt else None, '.2f')} "
            f"| {r['test_auc']:.4f} | {r['test_logloss']:.4f} "
            f"| {r['bytes_per_sample']:,.0f} | {fmt(r['driver_peak_rss_mb'], ',.0f')} | {fmt(r['executor_peak_rss_mb'], ',.0f')} |"
        )
    one = next((r for r in results if r["name"] == "sdt-1w"), None)
    tax = one["samples_per_second"] / ref["samples_per_second"] if one else float("nan")
    summary = {"framework_tax": tax, "target_auc": target, "every_run_reaches_target": reached}

    if args.memory_rows:
        mem = []
        master = masters[-1]
        for rows in (args.rows, args.memory_rows):
            if rows != args.rows:
                launch({"kind": "prepare", "rows": rows, "work": work, "result": os.path.join(res_dir, f"prepare_{rows}.json")}, n)
            cfg = {**base, "kind": "sdt", "name": f"memory {rows}", "rows": rows, "epochs": 1, "threads": max(1, n // 2),
                   "master": master, "workers": 2, "mode": "asynchronous", "frequency": 4,
                   "result": os.path.join(res_dir, f"memory_{rows}.json")}
            mem.append(launch(cfg, cfg["threads"]))
        growth = mem[1]["executor_peak_rss_mb"] / mem[0]["executor_peak_rss_mb"]
        summary.update(memory_rows=[args.rows, args.memory_rows],
                       executor_peak_rss_mb=[m["executor_peak_rss_mb"] for m in mem], memory_growth=growth)
        lines.append("")
        lines.append(f"Memory (asynchronous PS, 2 workers, {master}, 1 epoch): executor peak RSS "
                     f"{mem[0]['executor_peak_rss_mb']:,.0f} MiB at {args.rows:,} rows, {mem[1]['executor_peak_rss_mb']:,.0f} MiB "
                     f"at {args.memory_rows:,} rows: {growth:.2f}x (target <= 1.2x)")

    info = results_file.versions()
    print(f"\n{time.strftime('%Y-%m-%d')}, {n} cores, {platform.machine()}, {platform.platform()}; "
          + ", ".join(f"{k} {v}" for k, v in info.items()))
    print("\n".join(lines))
    print(f"\nframework tax (1 worker / Keras samples/s): {tax:.2f} (target >= 0.9); "
          f"every run reaches the target AUC: {'yes' if reached else 'NO'}")
    with open(os.path.join(res_dir, "summary.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "cores": n, "versions": info, "meta": meta, "runs": results,
                   **summary}, f, indent=1, default=str)
    with open(os.path.join(res_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if not args.only:
        print("wrote", results_file.write("e2e_ctr", {"rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size, "cores": n,
                                                      "bayes_auc": meta["bayes"]["auc"], "runs": results, **summary}))


if __name__ == "__main__":
    main(sys.argv[1:])
