"""Fixed cost of a fit: where the first epoch's time goes, against single-process Keras.

On the generated CTR data of ``bench/e2e/ctr.py`` (``--rows`` rows, DeepFM, batch 256), each
configuration runs in its own process with its Spark session already started (the JVM's start is
not counted), and times what a notebook user waits for:

1. ``keras``: a fresh model's first ``model.fit`` epoch on numpy arrays (tracing included);
2. ``sync``: ``SparkModel(mode="synchronous", frequency="epoch")`` with 2 workers on ``local[2]``:
   the first ``fit`` of one epoch, then a second one-epoch ``fit`` on the same SparkModel;
3. ``async``: asynchronous parameter server, frequency ``batch``: the first one-epoch ``fit``;
4. ``sync-shared`` / ``async-shared``: the same with the RDD-and-Arrow worker sharing of
   :mod:`sparkdl_train.driver.python_workers` turned on (off by default);
5. ``sync-warmed`` / ``async-warmed``: ``sparkdl_train.warm_up(spark)`` called as the session
   starts, the data and model prepared, the warm-up waited for (its remaining wait printed), then
   the first fit timed: what a notebook or job that warms up at its start sees (the Keras run, too,
   has TensorFlow imported before its clock starts).

Each sparkdl_train run prints, per fit, ``FitStats.fixed_costs()``: the driver's phases before the first
epoch (payload, adapter, preflight, sample check, ...), the first epoch's driver phases
(broadcast, job, merge) and the slowest task's startup (TensorFlow import, model rebuild, state,
first batch, first step, first pull), and the CPU seconds each process spent in the fit (the driver,
the JVM with its JIT compilers apart, the Python workers; read from ``/proc``). Ratios are against (1), measured in the same invocation;
the issue's targets: first fit ≤ 1.1x (synchronous), second fit ≤ 1.0x, asynchronous ≤ 1.5x.

    python -m bench.e2e.fixed_cost --rows 200000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench.e2e import ctr as e2e_ctr
from bench.harness import results as results_file
from bench.harness.results import ROOT

BATCH = 256
TARGETS = {"sync first fit": 1.1, "sync second fit": 1.0, "async first fit": 1.5}


def run_keras(meta: dict) -> dict:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(e2e_ctr.cores())
    x, y = e2e_ctr.read_arrays(os.path.join(meta["path"], "train"))
    model = e2e_ctr.build_model(meta["vocab_size"])
    t0 = time.perf_counter()
    model.fit(x, y, epochs=1, batch_size=BATCH, verbose=0, shuffle=True)
    return {"fits": [time.perf_counter() - t0]}


def _cpu_by_process() -> dict[tuple[str, int], float]:
    """CPU seconds (user + system) so far of this process ("driver"), each thread of its JVM (JIT
    compilers apart) and each Python worker below it, read from /proc (Linux; empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def stat(path: str) -> tuple[str, int, float] | None:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return None
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick

    if not os.path.isdir("/proc/self/task"):
        return {}
    procs = {int(p): st for p in os.listdir("/proc") if p.isdigit() and (st := stat(f"/proc/{p}/stat"))}
    mine, frontier = set(), {os.getpid()}
    while frontier:  # this process and its descendants
        mine |= frontier
        frontier = {pid for pid, (_, ppid, _) in procs.items() if ppid in frontier and pid not in mine}
    out: dict[tuple[str, int], float] = {}
    for pid in mine:
        name, _, cpu = procs[pid]
        if pid == os.getpid():
            out[("driver", pid)] = cpu
        elif name == "java":
            for tid in os.listdir(f"/proc/{pid}/task"):
                t = stat(f"/proc/{pid}/task/{tid}/stat")
                if t is not None:
                    out[("jvm_jit" if "CompilerThre" in t[0] else "jvm", int(tid))] = t[2]
        else:
            out[("python_workers", pid)] = cpu
    return out


def _cpu_spent(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]) -> dict[str, float]:
    """Per kind, the CPU seconds between two readings (threads and workers that ended in between are lost)."""
    spent = {"driver": 0.0, "jvm": 0.0, "jvm_jit": 0.0, "python_workers": 0.0}
    for key, cpu in after.items():
        spent[key[0]] += max(0.0, cpu - before.get(key, 0.0))
    return spent


def run_sdt(meta: dict, mode: str, frequency: str, fits: int, share: bool, warm: bool = False,
            conf: dict | None = None) -> dict:
    from sparkdl_train import SparkModel, warm_up

    # shareDaemon: one Python worker pool for RDD and DataFrame tasks (off by default)
    spark = e2e_ctr.spark_session("local[2]", 1, f"sparkdl_train fixed cost: {mode}",
                                  {"spark.sparkdl_train.worker.shareDaemon": str(share).lower(),
                                   # as the shipped conf/ files and ./run job set it (README: Fast start)
                                   "spark.python.daemon.module": "sparkdl_train.worker.daemon", **(conf or {})})
    try:
        started = time.perf_counter()
        check = warm_up(spark) if warm else None
        train = spark.read.parquet(os.path.join(meta["path"], "train"))
        columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
        sm = SparkModel(e2e_ctr.build_model(meta["vocab_size"]), mode=mode, frequency=frequency, num_workers=2,
                        seed=e2e_ctr.SEED, worker_threads=1)
        out: dict = {"fits": [], "fixed_costs": []}
        if check is not None:
            prepared = time.perf_counter()
            check.result()
            out["warm_up"] = {"prepare": prepared - started, "left_to_wait": time.perf_counter() - prepared}
        for _ in range(fits):
            cpu0 = _cpu_by_process()
            t0 = time.perf_counter()
            sm.fit(train, epochs=1, batch_size=BATCH, verbose=0, **columns)
            out["fits"].append(time.perf_counter() - t0)
            out.setdefault("cpu", []).append(_cpu_spent(cpu0, _cpu_by_process()))
            out["fixed_costs"].append(sm.stats.fixed_costs())
        return out
    finally:
        spark.stop()


def child(cfg: dict) -> None:
    meta = e2e_ctr.prepare(cfg["rows"], cfg["work"])
    if cfg["kind"] == "keras":
        result = run_keras(meta)
    else:
        result = run_sdt(meta, cfg["mode"], cfg["frequency"], cfg["fits"], cfg["share"], cfg.get("warm", False),
                         cfg.get("conf"))
    with open(cfg["result"], "w") as f:
        json.dump(result, f)


def launch(cfg: dict) -> dict:
    import subprocess

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.setdefault("SPARK_CONF_DIR", os.path.join(ROOT, "conf"))
    proc = subprocess.run([sys.executable, "-m", "bench.e2e.fixed_cost", "--child", json.dumps(cfg)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-6000:])
        raise SystemExit(f"{cfg['name']} failed (exit {proc.returncode})")
    with open(cfg["result"]) as f:
        return json.load(f)


def _costs(fixed: dict) -> str:
    parts = [f"{k} {v:.2f}" for k, v in fixed["driver"].items() if v >= 0.05]
    parts += [f"epoch.{k} {v:.2f}" for k, v in fixed["first_epoch"].items() if v >= 0.05]
    parts += [f"task.{k} {v:.2f}" for k, v in fixed["tasks"].items() if v >= 0.05]
    return ", ".join(parts)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "sparkdl_train_bench"))
    p.add_argument("--configs", nargs="+", help="run only these configurations (keras always runs)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for every sparkdl_train run (e.g. spark.sparkdl_train.data.directParquet=false)")
    p.add_argument("--child")
    args = p.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    os.makedirs(args.work, exist_ok=True)
    e2e_ctr.launch({"kind": "prepare", "rows": args.rows, "work": args.work,
                    "result": os.path.join(args.work, "prepare.json")}, e2e_ctr.cores())
    configs = [
        {"name": "keras", "kind": "keras"},
        {"name": "sync", "kind": "sdt", "mode": "synchronous", "frequency": "epoch", "fits": 2, "share": False},
        {"name": "async", "kind": "sdt", "mode": "asynchronous", "frequency": "batch", "fits": 1, "share": False},
        {"name": "sync-shared", "kind": "sdt", "mode": "synchronous", "frequency": "epoch", "fits": 2, "share": True},
        {"name": "async-shared", "kind": "sdt", "mode": "asynchronous", "frequency": "batch", "fits": 1, "share": True},
        {"name": "sync-warmed", "kind": "sdt", "mode": "synchronous", "frequency": "epoch", "fits": 1, "share": False,
         "warm": True},
        {"name": "async-warmed", "kind": "sdt", "mode": "asynchronous", "frequency": "batch", "fits": 1, "share": False,
         "warm": True},
    ]
    if args.configs:
        configs = [c for c in configs if c["name"] == "keras" or c["name"] in args.configs]
    results = {}
    for cfg in configs:
        cfg.update(rows=args.rows, work=args.work, conf=dict(kv.split("=", 1) for kv in args.conf), result=os.path.join(args.work, f"fixed_{cfg['name']}.json"))
        results[cfg["name"]] = r = launch(cfg)
        print(f"{cfg['name']:>15}: fits {', '.join(f'{s:.2f} s' for s in r['fits'])}", flush=True)
        if "warm_up" in r:
            w = r["warm_up"]
            print(f"{'':>17}warm_up: data and model prepared in {w['prepare']:.2f} s, then {w['left_to_wait']:.2f} s "
                  "left to wait before the fit", flush=True)
        for i, fixed in enumerate(r.get("fixed_costs", [])):
            print(f"{'':>17}fit {i + 1}: {_costs(fixed)}", flush=True)
            if r.get("cpu"):
                print(f"{'':>17}       CPU s: " + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu"][i].items()), flush=True)
    keras_first = results["keras"]["fits"][0]
    wanted = {
        "sync first fit": ("sync", 0),
        "sync second fit": ("sync", 1),
        "async first fit": ("async", 0),
        "sync first fit, shareDaemon": ("sync-shared", 0),
        "sync second fit, shareDaemon": ("sync-shared", 1),
        "async first fit, shareDaemon": ("async-shared", 0),
        "sync first fit after warm_up": ("sync-warmed", 0),
        "async first fit after warm_up": ("async-warmed", 0),
    }
    ratios = {k: results[name]["fits"][i] / keras_first for k, (name, i) in wanted.items() if name in results}
    print(f"\nagainst Keras' first epoch ({keras_first:.2f} s, {args.rows} rows, batch {BATCH}):")
    for name, ratio in ratios.items():
        target = TARGETS.get(name)
        print(f"  {name:<36} {ratio:5.2f}x" + (f"   target <= {target}x: {'met' if ratio <= target else 'NOT met'}" if target else ""))
    out = {"rows": args.rows, "batch_size": BATCH, "keras_first_epoch_s": keras_first, "targets": TARGETS,
           "seconds": {k: v["fits"] for k, v in results.items()}, "ratios": ratios}
    print(json.dumps(out))
    if not args.configs and not args.conf:
        print("wrote", results_file.write("fixed_cost", out))


if __name__ == "__main__":
    main(sys.argv[1:])
