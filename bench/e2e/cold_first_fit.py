"""The first fit of a fresh process: time to a target against Elephas 7.3 and single-process Keras.

What a person judges a library by is the first fit in a new notebook or job: the JVM, the executors and
their Python imports all cold. Every run here is a process of its own: it starts a Spark session
(``local[2]``, the settings of ``bench.e2e.time_to_target``), builds the training RDD of ``(x, y)`` pairs
lazily (its first Python task runs inside the fit, for both libraries), and times one ``fit`` of E epochs
with 2 workers, batch 256; the held-out metric is then computed on the driver (not timed). E starts at
the epochs single-process Keras needed and grows, one fresh process each, until the metric reaches
99% of Keras' best (``--extra-epochs`` beyond Keras' at most). Three models, none tuned for this:

- ``deepfm``: the single-input DeepFM of ``bench.e2e.time_to_target`` on ``--rows`` generated CTR rows
  (AUC);
- ``mlp``: a plain MLP on one float array, as Elephas' examples: 32 features, 10 classes drawn by a
  planted teacher network (accuracy);
- ``cnn``: a small CNN on 12x12 images of four templates, shifted and in noise (accuracy).

Libraries: ``elephas`` (its ``SparkModel`` and ``AsynchronousSparkModel``, in its own venv: see
``--setup-elephas``), ``sparkdl_train`` on TensorFlow and on JAX (its documented set-up: the worker daemon and the executor plugin;
no ``warm_up``; on JAX the compilation cache as an earlier process left it, and the first try once more
with it empty: a host's very first fit of the model), and ``keras`` (``model.fit`` in one process; its epoch times give the target's epochs).
Each sparkdl_train run also prints the fit's own account of its fixed cost (``sm.stats.fixed_costs()``:
the driver's phases before the first epoch, the first epoch's phases, the slowest task's start-up, and how
many of the executors' daemons started with their executor). sparkdl_train runs with the executor plugin
(``sparkdl_train.jvm``: its executors import as they start); ``--without-executor-start`` adds its runs
without it, in the same run, and each run's session start is recorded beside its fit. Steady epochs
(``--skip-steady`` leaves them out): per library and mode one more process fits 1, 1 and 3 epochs in turn, and
a steady epoch is the third fit's time less the second's, halved (the same rule for every library).

    python -m bench.e2e.cold_first_fit --setup-elephas          # once: .bench/elephas-venv (pip, ~5 min)
    python -m bench.e2e.cold_first_fit [--models deepfm mlp cnn] [--modes ...] [--backends tensorflow jax]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from bench.e2e import time_to_target as ttt
from bench.harness.docs import x

BATCH, WORKERS = 256, 2
MODES = {  # name: (mode, frequency), the names both libraries have
    "synchronous/epoch": ("synchronous", "epoch"),
    "asynchronous/batch": ("asynchronous", "batch"),
    "asynchronous/epoch": ("asynchronous", "epoch"),
    "hogwild/batch": ("hogwild", "batch"),
    "hogwild/epoch": ("hogwild", "epoch"),
}
ELEPHAS_VENV = os.path.join(".bench", "elephas-venv")
ELEPHAS_PINS = ["elephas==7.3.0", "tensorflow>=2.16,<2.20", "numpy<2", "pyspark>=3.5,<=4.0.1", "scikit-learn"]
NO_START = "sparkdl_train, no executor start"  # the same without the executor plugin (sparkdl_train.jvm): the time before it
GOALS = {"cold time to target, Elephas' over sparkdl_train's": ">= 1.5x", "cold time to target, JAX's over TensorFlow's": "<= 1.0x",
         "steady epoch, Elephas' over sparkdl_train's": ">= 3x"}
# steady epochs (unless --skip-steady): one process per library and mode fits these epochs one after another; a steady epoch is the third fit's
# time less the second's, over the epochs between them (the first fit takes the cold start and the traces)
STEADY_FITS = (1, 1, 3)


# -- data and models (plain Keras and numpy: the Elephas venv builds them too) -----------------------------

def data(model: str, work: str, rows: int):
    """Training and held-out arrays of ``model``'s task and its vocabulary (DeepFM's; 0 for the others): x, y, xt, yt, vocab."""
    if model == "deepfm":
        return ttt.load(work)
    rng = np.random.default_rng(11)
    if model == "mlp":
        n = rows
        w1, w2 = rng.normal(size=(32, 32)) / np.sqrt(32), rng.normal(size=(32, 10)) * 1.5
        x = rng.normal(size=(n + n // 2, 32)).astype("float32")  # a large held-out set: its accuracy within 0.002
        logits = np.tanh(x @ w1) @ w2 + rng.gumbel(size=(len(x), 10))
        y = np.eye(10, dtype="float32")[np.argmax(logits, 1)]
    else:  # cnn: four templates, shifted by up to two pixels, in noise
        n = rows // 4
        templates = rng.normal(size=(4, 12, 12))
        templates = (templates + np.roll(templates, 1, 1) + np.roll(templates, 1, 2)) / 3
        c = rng.integers(0, 4, size=n + n // 10)
        dx, dy = rng.integers(-2, 3, size=(2, len(c)))
        x = np.stack([np.roll(templates[k], (a, b), (0, 1)) for k, a, b in zip(c, dx, dy)])
        x = (x + rng.normal(scale=1.0, size=x.shape))[..., None].astype("float32")
        y = np.eye(4, dtype="float32")[c]
    return x[:n], y[:n], x[n:], y[n:], 0


def build(model: str, vocab: int = 0):
    """The compiled model, its custom objects and its metric's name."""
    import keras

    if model == "deepfm":
        m, custom = ttt.build_model(vocab)
        return m, custom, "auc"
    keras.utils.set_random_seed(ttt.SEED)
    if model == "mlp":
        m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")])
        lr = 0.002
    else:
        m = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
                              keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])
        lr = 0.003
    m.compile(optimizer=keras.optimizers.Adam(lr), loss="categorical_crossentropy", metrics=["accuracy"])
    return m, {}, "accuracy"


def score(model, metric: str, xt, yt) -> float:
    return float(model.evaluate(xt, yt, batch_size=4096, verbose=0, return_dict=True)[metric])


# -- one run: a process of its own ---------------------------------------------------------------------

def child(cfg: dict) -> dict:
    x, y, xt, yt, vocab = data(cfg["model"], cfg["work"], cfg["rows"])
    model, custom, metric = build(cfg["model"], vocab)
    lib = cfg["lib"]
    if lib == "keras":
        seconds, scores, clock = [], [], [time.perf_counter(), 0.0]
        import keras

        class Clock(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                t = time.perf_counter()
                seconds.append(t - clock[0] - clock[1])
                scores.append(score(self.model, metric, xt, yt))
                clock[1] += time.perf_counter() - t

        clock[0] = time.perf_counter()
        model.fit(x, y, epochs=cfg["epochs"], batch_size=BATCH, verbose=0, shuffle=True, callbacks=[Clock()])
        return {"seconds": seconds, "scores": scores}
    t_session = time.perf_counter()
    conf = {"spark.sparkdl_train.jax.compilationCache": cfg["jax_cache"]} if cfg.get("jax_cache") else None
    spark = ttt.spark_session("sparkdl_train" if lib.startswith("sparkdl_train") else "elephas", conf)
    sc = spark.sparkContext
    session_s = time.perf_counter() - t_session
    rdd = sc.parallelize(list(zip(x, y)), WORKERS)  # lazy: its first Python task runs in the fit
    out: dict = {"session_s": session_s}
    try:
        if cfg.get("steady"):
            out["fits_s"] = [_fit(cfg, lib, model, custom, rdd, epochs, i)[0] for i, epochs in enumerate(STEADY_FITS)]
            out["steady_epoch_s"] = (out["fits_s"][2] - out["fits_s"][1]) / (STEADY_FITS[2] - STEADY_FITS[1])
            return out
        seconds, sm, trained = _fit(cfg, lib, model, custom, rdd, cfg["epochs"], 0)
        if lib != "elephas":
            out["fixed_costs"] = {**sm.stats.fixed_costs(), "prepare_tasks": sm.stats.prepare}
            out["epoch_s"] = [round(e.seconds, 3) for e in sm.stats.epochs]
        out["seconds"] = seconds
        out["score"] = score(trained, metric, xt, yt)
    finally:
        spark.stop()
    return out


def _fit(cfg: dict, lib: str, model, custom: dict, rdd, epochs: int, i: int):
    """One fit of ``epochs`` (the ``i``-th of its process): its seconds, the library's model and the trained Keras model."""
    mode, freq = MODES[cfg["mode"]]
    t = time.perf_counter()
    if lib == "elephas":
        from elephas.spark_model import AsynchronousSparkModel, SparkModel

        if mode == "synchronous":
            sm = SparkModel(model, num_workers=WORKERS, custom_objects=custom, batch_size=BATCH)
        else:  # a server of its own per fit: a port of its own
            sm = AsynchronousSparkModel(model, num_workers=WORKERS, custom_objects=custom, batch_size=BATCH, mode=mode,
                                        frequency=freq, port=cfg["port"] + 1000 * i)
        sm.fit(rdd, epochs=epochs, batch_size=BATCH, verbose=0, validation_split=0.0)
        return time.perf_counter() - t, sm, sm.master_network
    from sparkdl_train import SparkModel

    sm = SparkModel(model, mode=mode, frequency=freq, num_workers=WORKERS, seed=ttt.SEED, worker_threads=1)
    sm.fit(rdd, epochs=epochs, batch_size=BATCH, verbose=0)
    return time.perf_counter() - t, sm, model


def launch(cfg: dict, python: str, backend: str = "tensorflow") -> dict:
    from bench.harness.results import ROOT

    result = os.path.join(cfg["work"], "cold_run.json")
    if os.path.exists(result):
        os.remove(result)
    env = ttt.child_env(python, backend)
    if cfg["lib"] == NO_START:
        env["SDT_EXECUTOR_START"] = "off"
    proc = subprocess.run([python, "-m", "bench.e2e.cold_first_fit", "--child", json.dumps({**cfg, "result": result})],
                          env=env, timeout=1800, cwd="/tmp" if cfg["lib"] == "elephas" else ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-600:]}
    with open(result) as f:
        return json.load(f)


# -- the whole benchmark -------------------------------------------------------------------------------

def setup_elephas() -> str:
    from bench.harness.results import ROOT

    venv = os.path.join(ROOT, ELEPHAS_VENV)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *ELEPHAS_PINS], check=True)
    return python


def _phases(fc: dict) -> str:
    """A fit's fixed cost in one line: the driver's phases over 0.05 s, the first epoch's, the slowest task's."""
    def part(d: dict) -> str:
        return " ".join(f"{k} {v:.2f}" for k, v in d.items() if isinstance(v, (int, float)) and v >= 0.05)

    start = fc.get("executor_start") or {}
    started = (f" | daemons started with their executor: {start['started_with_executor']} of {start['workers']}"
               + (f", imports {start['imports_s']:.2f} s" if start.get("imports_s") else "")) if start.get("workers") else ""
    return (f"driver: {part(fc.get('driver', {}))} | first epoch: {part(fc.get('first_epoch', {}))} | task: {part(fc.get('tasks', {}))}"
            + started)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child")
    p.add_argument("--setup-elephas", action="store_true", help=f"create {ELEPHAS_VENV} with {' '.join(ELEPHAS_PINS)}")
    p.add_argument("--elephas-python", help=f"default: {ELEPHAS_VENV}/bin/python where it exists")
    p.add_argument("--models", nargs="+", default=["deepfm", "mlp", "cnn"], choices=["deepfm", "mlp", "cnn"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], choices=["tensorflow", "jax"])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--keras-epochs", type=int, default=4)
    p.add_argument("--extra-epochs", type=int, default=2, help="epochs a distributed fit may take beyond Keras' own")
    p.add_argument("--work", default=os.path.join("/tmp", "sparkdl_train_bench"))
    p.add_argument("--skip-steady", action="store_true",
                   help=f"leave out the steady epochs (per library and mode a process of its own fitting {STEADY_FITS} epochs in turn)")
    p.add_argument("--without-executor-start", action="store_true",
                   help="also run sparkdl_train on TensorFlow without the executor plugin (sparkdl_train.jvm), in the same run")
    args = p.parse_args(argv)
    if args.child:
        cfg = json.loads(args.child)
        out = child(cfg)
        with open(cfg["result"], "w") as f:
            json.dump(out, f)
        return
    from bench.harness import results as results_file
    from bench.harness.results import ROOT

    if args.setup_elephas:
        print("Elephas' venv:", setup_elephas())
        return
    elephas = args.elephas_python or os.path.join(ROOT, ELEPHAS_VENV, "bin", "python")
    if not os.path.exists(elephas):
        raise SystemExit(f"no Elephas venv at {elephas}: run python -m bench.e2e.cold_first_fit --setup-elephas first")
    os.makedirs(args.work, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "deepfm" in args.models:
        ttt.prepare(args.rows, args.work)
    port = 4100 + os.getpid() % 20000
    runs: list[dict] = []
    for model in args.models:
        base = {"work": args.work, "rows": args.rows, "model": model}
        k = launch({**base, "lib": "keras", "epochs": args.keras_epochs}, sys.executable)
        if "error" in k:
            raise SystemExit(f"keras on {model} failed: {k['error']}")
        target = 0.99 * max(k["scores"])
        k_epochs = next(i + 1 for i, s in enumerate(k["scores"]) if s >= target)
        keras_row = {"model": model, "lib": "keras", "backend": "tensorflow", "mode": "single process", "epochs": k_epochs,
                     "seconds": k["seconds"][k_epochs - 1], "score": k["scores"][k_epochs - 1], "target": target,
                     "first_epoch_s": k["seconds"][0]}
        runs.append(keras_row)
        print(f"{model}: keras best {max(k['scores']):.4f}, target {target:.4f}, reached after {k_epochs} epoch(s) "
              f"in {keras_row['seconds']:.1f} s", flush=True)
        libs = [("elephas", "tensorflow", elephas)] + [("sparkdl_train", b, sys.executable) for b in args.backends]
        if args.without_executor_start:
            libs.insert(1, (NO_START, "tensorflow", sys.executable))
        for mode in args.modes:
            for lib, backend, python in libs:
                tries, cache, empty = [], None, None
                if backend == "jax":  # the first try in an empty compilation cache, then again as a later process finds it
                    cache = os.path.join(args.work, "jax_cache", f"{model}_{mode.replace('/', '_')}")
                    shutil.rmtree(cache, ignore_errors=True)
                    port += 1
                    empty = launch({**base, "lib": lib, "mode": mode, "epochs": k_epochs, "port": port, "jax_cache": cache}, python, backend)
                for epochs in range(k_epochs, k_epochs + args.extra_epochs + 1):
                    port += 1
                    r = launch({**base, "lib": lib, "mode": mode, "epochs": epochs, "port": port, "jax_cache": cache}, python, backend)
                    tries.append({"epochs": epochs, **r})
                    if "error" in r or r["score"] >= target:
                        break
                last = tries[-1]
                # the row's figures are its last try's (last_try): the epochs that reached the target, or the most tried
                row = {"model": model, "lib": lib, "backend": backend, "mode": mode, "target": target, "tries": tries,
                       "reached": "error" not in last and last["score"] >= target}
                if empty is not None:
                    row["empty_cache"] = {"epochs": k_epochs, **empty}
                if not args.skip_steady and lib != NO_START:
                    port += 3
                    row["steady"] = launch({**base, "lib": lib, "mode": mode, "epochs": 0, "port": port, "jax_cache": cache,
                                            "steady": True}, python, backend)
                runs.append(row)
                what = (f"error: {last['error'][-200:]}" if "error" in last else
                        f"{last['score']:.4f} after {last['epochs']} epoch(s) in {last['seconds']:.1f} s"
                        + ("" if row["reached"] else " (target not reached)"))
                session = f" (session {last['session_s']:.1f} s)" if "session_s" in last else ""
                print(f"  {mode:<20} {lib:<14} {backend:<11} {what}{session}", flush=True)
                if "fixed_costs" in last:
                    print(f"  {'':<47}{_phases(last['fixed_costs'])}", flush=True)
                if "steady_epoch_s" in row.get("steady", {}):
                    print(f"  {'':<47}steady epoch {row['steady']['steady_epoch_s']:.2f} s (fits of {STEADY_FITS} epochs in one "
                          f"process: {', '.join(f'{v:.1f}' for v in row['steady']['fits_s'])} s)", flush=True)
                elif "steady" in row:
                    print(f"  {'':<47}steady epochs: error: {row['steady'].get('error', '')[-200:]}", flush=True)
                if empty is not None and "seconds" in empty:
                    print(f"  {'':<47}with an empty compilation cache ({k_epochs} epoch(s)): {empty['seconds']:.1f} s; "
                          f"{_phases(empty['fixed_costs'])}", flush=True)

    summary = _summarize(runs)
    print("\nTime to target, cold (goals:", "; ".join(f"{k} {v}" for k, v in GOALS.items()) + ")")
    for s in summary:
        before = f"  TF without the plugin {_s(s['tensorflow_no_start_s'])}" if s.get("tensorflow_no_start_s") else ""
        print(f"  {s['model']:<7} {s['mode']:<20} Elephas {_s(s['elephas_s'])}  TF {_s(s['tensorflow_s'])} ({x(s['vs_elephas_tf'])})"
              f"  JAX {_s(s['jax_s'])} ({x(s['vs_elephas_jax'])}, JAX/TF {x(s['jax_over_tf'])}){before}"
              f"  session + fit: Elephas/TF {x(s['vs_elephas_tf_with_session'])}"
              f"  steady epoch: Elephas/TF {x(s['steady_vs_elephas_tf'])}, Elephas/JAX {x(s['steady_vs_elephas_jax'])}")
    print("wrote", results_file.write("cold_first_fit", {"elephas": "7.3", "rows": args.rows, "batch_size": BATCH, "workers": WORKERS,
                                                          "goals": GOALS, "summary": summary, "runs": runs}))


def last_try(row: dict) -> dict:
    """A library's run: its last try (the fewest epochs that reached the target, or the most tried);
    single-process Keras' row is its own."""
    return row["tries"][-1] if "tries" in row else row


def _s(v: float | None) -> str:
    return "  never" if v is None else f"{v:5.1f} s"


def _summarize(runs: list[dict]) -> list[dict]:
    """Per model and mode: each library's cold time to target and the ratios (None where one never reached it)."""
    def run(model, mode, lib, backend) -> dict:
        return next((r for r in runs if (r["model"], r["mode"], r["lib"], r["backend"]) == (model, mode, lib, backend)), {})

    def t(r: dict) -> float | None:
        return last_try(r)["seconds"] if r.get("reached") else None

    def with_session(r: dict) -> float | None:  # the process's session start too: what the executor plugin overlaps
        return last_try(r)["seconds"] + last_try(r)["session_s"] if r.get("reached") else None

    def steady(r: dict) -> float | None:
        return r.get("steady", {}).get("steady_epoch_s")

    def over(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    out = []
    for model, mode in dict.fromkeys((r["model"], r["mode"]) for r in runs if r["lib"] != "keras"):
        jr = run(model, mode, "sparkdl_train", "jax")
        et, tt = with_session(run(model, mode, "elephas", "tensorflow")), with_session(run(model, mode, "sparkdl_train", "tensorflow"))
        e, tf, jx = t(run(model, mode, "elephas", "tensorflow")), t(run(model, mode, "sparkdl_train", "tensorflow")), t(jr)
        keras_s = next(r["seconds"] for r in runs if r["model"] == model and r["lib"] == "keras")
        empty = jr.get("empty_cache", {}).get("seconds")
        out.append({"model": model, "mode": mode, "keras_s": keras_s, "elephas_s": e, "tensorflow_s": tf, "jax_s": jx,
                    "vs_elephas_tf": e / tf if e and tf else None, "vs_elephas_jax": e / jx if e and jx else None,
                    "jax_over_tf": jx / tf if jx and tf else None, "jax_empty_cache_s": empty,
                    "tensorflow_no_start_s": t(run(model, mode, NO_START, "tensorflow")),
                    "elephas_with_session_s": et, "tensorflow_with_session_s": tt,
                    "vs_elephas_tf_with_session": et / tt if et and tt else None,
                    "elephas_steady_s": steady(run(model, mode, "elephas", "tensorflow")),
                    "tensorflow_steady_s": steady(run(model, mode, "sparkdl_train", "tensorflow")), "jax_steady_s": steady(jr)})
        s = out[-1]
        s["steady_vs_elephas_tf"] = over(s["elephas_steady_s"], s["tensorflow_steady_s"])
        s["steady_vs_elephas_jax"] = over(s["elephas_steady_s"], s["jax_steady_s"])
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
