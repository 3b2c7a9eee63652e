"""Time to a target AUC: single-process Keras, sparkdl_train and Elephas 7.3 on one CTR job.

The job: the bench's generated CTR data (``bench/e2e/ctr.py``'s, ``--rows`` rows, a planted model),
DeepFM (embed 8, MLP 64-32, Adam 0.002), batch 256, 2 workers on ``local[2]``. Elephas feeds a
model one array, so every library trains the same single-input DeepFM: 39 floats per row (13
numeric features, then the 26 field ids, split and cast back to ids inside the model).

1. ``keras``: ``model.fit`` in one process, the held-out AUC after every epoch; the target is 99%
   of its best.
2. For each library and mode, in its own process and venv (``--python`` for Elephas, which needs
   tensorflow<2.20, numpy<2, pyspark<=4.0 and is not a dependency of this project), with Spark
   started and its Python workers warmed by one small fit first (sparkdl_train with its worker
   daemon, ``spark.python.daemon.module``, and ``warm_up(spark)`` at session start, as its README
   sets it up): a fresh model is fitted for 1, 2,
   ... ``--epochs`` epochs until the AUC on the held-out rows (evaluated on the driver, not timed)
   reaches the target; the time to target is that fit's wall time, fixed costs included.
   sparkdl_train runs on an RDD of ``(x, y)`` (as Elephas does) and on a DataFrame.

Prints one row per run and the ratios: Elephas' time over sparkdl_train's for every mode both have.

    python -m bench.e2e.time_to_target --elephas-python /path/to/elephas-venv/bin/python [--rows 200000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
from keras import ops  # noqa: E402

SEED, LR, BATCH, N_DENSE, N_FIELDS = 7, 0.002, 256, 13, 26
MODES = {  # name: (Elephas / sparkdl_train mode, frequency)
    "synchronous/epoch": ("synchronous", "epoch"),
    "asynchronous/batch": ("asynchronous", "batch"),
    "asynchronous/epoch": ("asynchronous", "epoch"),
    "hogwild/epoch": ("hogwild", "epoch"),
}


@keras.saving.register_keras_serializable(package="bench_ttt")
class SplitIds(keras.layers.Layer):
    """``(batch, 39)`` floats -> the 13 numeric features and the 26 field ids."""

    def call(self, x):
        return x[:, :N_DENSE], ops.cast(x[:, N_DENSE:], "int32")


@keras.saving.register_keras_serializable(package="bench_ttt")
class FM(keras.layers.Layer):
    def call(self, emb):
        s = ops.sum(emb, axis=1)
        return 0.5 * ops.sum(s * s - ops.sum(emb * emb, axis=1), axis=1, keepdims=True)


@keras.saving.register_keras_serializable(package="bench_ttt")
class FieldSum(keras.layers.Layer):
    def call(self, x):
        return ops.sum(x, axis=1)


CUSTOM = {f"{prefix}{cls.__name__}": cls for cls in (SplitIds, FM, FieldSum) for prefix in ("", "bench_ttt>")}


def build_model(vocab: int):
    """Single-input DeepFM (plain Keras 3 layers and three small ones defined here, so that the
    Elephas venv, which lacks sparkdl_train, builds the same model)."""
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((N_DENSE + N_FIELDS,), name="features")
    numeric, ids = SplitIds(name="split")(inp)
    emb = keras.layers.Embedding(vocab, 8, name="field_embedding")(ids)
    lin = FieldSum(name="linear_sum")(keras.layers.Embedding(vocab, 1, name="linear_embedding")(ids))
    deep = keras.layers.Concatenate()([keras.layers.Flatten()(emb), numeric])
    for i, units in enumerate((64, 32)):
        deep = keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(deep)
    terms = [lin, keras.layers.Dense(1, name="linear_numeric")(numeric), keras.layers.Dense(1, name="deep_logit")(deep),
             FM(name="fm")(emb)]
    out = keras.layers.Activation("sigmoid")(keras.layers.Add()(terms))
    model = keras.Model(inp, out, name="deepfm_single_input")
    model.compile(optimizer=keras.optimizers.Adam(LR), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc", num_thresholds=1000)])
    return model, CUSTOM


def load(work: str):
    d = np.load(os.path.join(work, "ttt_arrays.npz"))
    return d["x"], d["y"], d["xt"], d["yt"], int(d["vocab"])


def auc_of(model, xt, yt) -> float:
    return float(model.evaluate(xt, yt, batch_size=4096, verbose=0, return_dict=True)["auc"])


# -- children ----------------------------------------------------------------------------------

def run_keras(cfg: dict) -> list[dict]:
    x, y, xt, yt, vocab = load(cfg["work"])
    model, _ = build_model(vocab)
    rows: list[dict] = []
    clock = {"start": 0.0, "evaluating": 0.0}

    class Clock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            t = time.perf_counter()
            seconds = t - clock["start"] - clock["evaluating"]  # training only, fixed costs included
            rows.append({"lib": "keras", "mode": "single process", "data": "numpy", "epochs": epoch + 1,
                         "auc": auc_of(self.model, xt, yt), "seconds": seconds})
            clock["evaluating"] += time.perf_counter() - t

    clock["start"] = time.perf_counter()
    model.fit(x, y, epochs=cfg["epochs"], batch_size=BATCH, verbose=0, shuffle=True, callbacks=[Clock()])
    return rows


def spark_session(lib: str, conf: dict | None = None):
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName(f"time to target: {lib}")
         .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "3g")
         .config("spark.default.parallelism", "2").config("spark.ui.showConsoleProgress", "false"))
    if lib == "sparkdl_train":  # its documented set-up (docs/clusters.md: "Fast start": the worker daemon, the executor plugin)
        b = b.config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
        if os.environ.get("SDT_EXECUTOR_START", "on") != "off":
            from sparkdl_train import jvm

            for k, v in jvm.settings().items():
                b = b.config(k, v)
    for k, v in {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}.items():
        b = b.config(f"spark.executorEnv.{k}", v)
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark(cfg: dict) -> list[dict]:
    lib = cfg["lib"]
    x, y, xt, yt, vocab = load(cfg["work"])
    spark = spark_session(lib)
    sc = spark.sparkContext
    if lib == "sparkdl_train":  # its documented session start (README: Notebook); Elephas has none
        from sparkdl_train import warm_up

        warm_up(spark, kind="rdd")
    out = []
    try:
        rdd = sc.parallelize(list(zip(x, y)), 2).cache()
        rdd.count()
        df = None
        if lib == "sparkdl_train":
            import pandas as pd

            df = spark.createDataFrame(pd.DataFrame({"features": list(x), "label": y})).repartition(2).cache()
            df.count()

        ports = itertools.count()  # Elephas binds a fixed port per server: a new one per fit

        def fit(mode: str, epochs: int, data: str, rows: int | None = None):
            model, custom = build_model(vocab)
            m, freq = MODES[mode] if mode in MODES else (mode, "batch")
            t = time.perf_counter()
            if lib == "elephas":  # SparkModel is synchronous; the other modes are AsynchronousSparkModel's
                from elephas.spark_model import AsynchronousSparkModel, SparkModel

                train = rdd if rows is None else sc.parallelize(list(zip(x[:rows], y[:rows])), 2)
                if m == "synchronous":
                    sm = SparkModel(model, num_workers=2, custom_objects=custom, batch_size=BATCH)
                else:
                    sm = AsynchronousSparkModel(model, num_workers=2, custom_objects=custom, batch_size=BATCH, mode=m,
                                                frequency=freq, port=cfg["port"] + next(ports))
                sm.fit(train, epochs=epochs, batch_size=BATCH, verbose=0, validation_split=0.0)
                trained = sm.master_network
            else:
                from sparkdl_train import SparkModel

                sm = SparkModel(model, mode=m, frequency=freq, num_workers=2, seed=SEED, worker_threads=1)
                if data == "rdd":
                    train = rdd if rows is None else sc.parallelize(list(zip(x[:rows], y[:rows])), 2)
                    sm.fit(train, epochs=epochs, batch_size=BATCH, verbose=0)
                else:
                    train = df if rows is None else df.limit(rows)
                    sm.fit(train, epochs=epochs, batch_size=BATCH, verbose=0, feature_cols="features", label_col="label")
                trained = model
            return time.perf_counter() - t, trained

        fit("synchronous/epoch", 1, "rdd", rows=2048)  # warm the Python workers (both libraries alike)
        if df is not None:
            fit("synchronous/epoch", 1, "dataframe", rows=2048)
        runs = [(mode, "rdd") for mode in MODES]
        if lib == "sparkdl_train":
            runs += [(mode, "dataframe") for mode in MODES] + [("allreduce", "rdd"), ("allreduce", "dataframe")]
        for mode, data in runs:
            for epochs in range(1, cfg["epochs"] + 1):
                try:
                    seconds, trained = fit(mode, epochs, data)
                    auc = auc_of(trained, xt, yt)
                except Exception as exc:  # noqa: BLE001 - a library that cannot run a mode: say so
                    out.append({"lib": lib, "mode": mode, "data": data, "epochs": epochs, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    break
                out.append({"lib": lib, "mode": mode, "data": data, "epochs": epochs, "auc": auc, "seconds": seconds})
                print(json.dumps(out[-1]), file=sys.stderr, flush=True)
                if auc >= cfg["target"]:
                    break
    finally:
        spark.stop()
    return out


def child(cfg: dict) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    rows = run_keras(cfg) if cfg["lib"] == "keras" else run_spark(cfg)
    with open(cfg["result"], "w") as f:
        json.dump(rows, f)


# -- parent ------------------------------------------------------------------------------------

def prepare(rows: int, work: str) -> None:
    from bench.e2e import ctr as e2e_ctr

    meta = e2e_ctr.prepare(rows, work)
    path = os.path.join(work, "ttt_arrays.npz")
    if os.path.exists(path):
        return
    x, y = e2e_ctr.read_arrays(os.path.join(meta["path"], "train"))
    xt, yt = e2e_ctr.read_arrays(os.path.join(meta["path"], "test"))

    def flat(a):
        return np.concatenate([a["numeric"], a["categorical"].astype("float32")], axis=1).astype("float32")

    np.savez(path, x=flat(x), y=y, xt=flat(xt), yt=yt, vocab=meta["vocab_size"])


def launch(python: str, cfg: dict, reuse: bool = False) -> list[dict]:
    result = os.path.join(cfg["work"], f"ttt_{cfg['lib']}.json")
    if reuse and os.path.exists(result):  # --rerun names the libraries to run again
        with open(result) as f:
            return json.load(f)
    env = child_env(python)
    proc = subprocess.run([python, "-m", "bench.e2e.time_to_target", "--child", json.dumps({**cfg, "result": result})],
                          env=env, timeout=7200, cwd="/tmp" if cfg["lib"] == "elephas" else None)
    if proc.returncode != 0:
        raise SystemExit(f"{cfg['lib']} run failed (exit {proc.returncode})")
    with open(result) as f:
        return json.load(f)


def child_env(python: str, backend: str = "tensorflow") -> dict[str, str]:
    """The environment of a benchmark child run by ``python`` (its own venv: Elephas', or this checkout's):
    its Spark workers run that Python, and of this checkout it imports the bench package only (the child
    imports Elephas or sparkdl_train from its venv)."""
    from bench.harness.results import ROOT

    return {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, "OMP_NUM_THREADS": "2",
            "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend, "PYTHONPATH": ROOT}


def first_at(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r.get("auc", -1) >= target), None)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--elephas-python", help="python of a venv with elephas==7.3 (left out: no Elephas rows)")
    p.add_argument("--work", default=os.path.join("/tmp", "sparkdl_train_bench"))
    p.add_argument("--rerun", nargs="+", choices=["keras", "sparkdl_train", "elephas"],
                   help="run only these again; take the others' results from --work")
    args = p.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    os.makedirs(args.work, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors of the data preparation
    prepare(args.rows, args.work)
    base = {"work": args.work, "epochs": args.epochs, "port": 4000 + os.getpid() % 20000}

    def reuse(lib: str) -> bool:
        return args.rerun is not None and lib not in args.rerun

    keras_rows = launch(sys.executable, {**base, "lib": "keras", "target": 0.0}, reuse("keras"))
    target = 0.99 * max(r["auc"] for r in keras_rows)
    k = first_at(keras_rows, target)
    print(f"keras: best held-out AUC {max(r['auc'] for r in keras_rows):.4f}, target {target:.4f}, "
          f"reached after {k['epochs']} epoch(s) in {k['seconds']:.1f} s", flush=True)
    results = {"keras": keras_rows, "target": target}
    results["sparkdl_train"] = launch(sys.executable, {**base, "lib": "sparkdl_train", "target": target}, reuse("sparkdl_train"))
    if args.elephas_python:
        results["elephas"] = launch(args.elephas_python, {**base, "lib": "elephas", "target": target}, reuse("elephas"))
    with open(os.path.join(args.work, "time_to_target.json"), "w") as f:
        json.dump(results, f, indent=1)

    print(f"\n{'library':<15}{'mode':<22}{'data':<11}{'epochs':>7}{'AUC':>8}{'seconds':>9}{'vs Keras':>10}")
    best: dict[tuple[str, str, str], dict | None] = {}
    for lib in ("sparkdl_train", "elephas"):
        for r in results.get(lib, []):
            best.setdefault((lib, r["mode"], r["data"]), None)
        for key in [k for k in best if k[0] == lib]:
            rows = [r for r in results[lib] if (r["lib"], r["mode"], r["data"]) == key]
            hit = first_at(rows, target)
            best[key] = hit
            last = rows[-1]
            if hit:
                print(f"{lib:<15}{key[1]:<22}{key[2]:<11}{hit['epochs']:>7}{hit['auc']:>8.4f}{hit['seconds']:>9.1f}"
                      f"{hit['seconds'] / k['seconds']:>10.2f}")
            else:
                why = last.get("error") or f"AUC {last.get('auc', float('nan')):.4f} after {last['epochs']} epochs"
                print(f"{lib:<15}{key[1]:<22}{key[2]:<11}{'':>7}{'':>8}{'never':>9}   ({why})")
    print(f"{'keras':<15}{'single process':<22}{'numpy':<11}{k['epochs']:>7}{k['auc']:>8.4f}{k['seconds']:>9.1f}{1.0:>10.2f}")
    if "elephas" in results:
        print("\nElephas' time to target over sparkdl_train's (the faster of its RDD and DataFrame runs):")
        ratios = []
        for mode in MODES:
            e = best.get(("elephas", mode, "rdd"))
            ours = [best.get(("sparkdl_train", mode, d)) for d in ("rdd", "dataframe")]
            ours = [o for o in ours if o]
            mine = min(o["seconds"] for o in ours) if ours else None
            if e and mine:
                print(f"  {mode:<22} {e['seconds'] / mine:.2f}x")
                r = e["seconds"] / mine
                ratios.append({"mode": mode, "low": r, "high": r, "median": r})
            else:
                print(f"  {mode:<22} Elephas {'%.1f s' % e['seconds'] if e else 'never'}, "
                      f"sparkdl_train {'%.1f s' % mine if mine else 'never'}")
        from bench.harness import results as results_file

        print("wrote", results_file.write("time_to_target", {"elephas": "7.3", "runs": 1, "modes": ratios}))


if __name__ == "__main__":
    main(sys.argv[1:])
