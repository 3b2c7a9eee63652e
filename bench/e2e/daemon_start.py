"""The worker daemon's start with and without the host's store of compiled zip modules, in one run.

An executor's Python worker daemon (``sparkdl_train.worker.daemon``) imports TensorFlow, Keras and
pyspark's worker modules before it forks workers; a cold fit waits for it (its preflight). Spark puts
``pyspark.zip`` first on the executors' Python path, and Python compiles a zip's modules from source in
every process (twice each: once to name the module's file); ``sparkdl_train.worker.code_cache`` keeps
their code per host and user. Measured here, alternating so that a noisy machine affects each alike:

- ``preload``: a fresh interpreter with Spark's ``pyspark.zip`` and py4j's zip first on its path, as an
  executor's, runs the daemon's start (the store, the preload, pyspark's daemon module): with the store
  ``off``, with an empty folder (``cold``: the first daemon on a host), with that folder filled
  (``warm``: every later one), and, as the floor, pyspark imported from site-packages, where Python keeps
  compiled files (no zip);
- ``--fits N``: N cold DeepFM fits of ``bench.e2e.cold_first_fit`` (a process each: JVM, executors,
  imports cold; ``local[2]``, synchronous, one epoch) with the store off and warm, alternated: the fit's
  seconds and its wait for the executors' start (the preflight and sample phases).

Ratios: off / warm (above 1: the store saves that share).

    python -m bench.e2e.daemon_start [--rounds 5] [--fits 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_START = r"""
import json, sys, time
t = time.perf_counter()
from sparkdl_train.worker import code_cache, daemon
folder = code_cache.install(sys.argv[1])
failed = daemon.preload()
daemon.freeze_imports()
from pyspark import daemon as pyspark_daemon
import pyspark
print(json.dumps({"seconds": time.perf_counter() - t, "failed": failed, "folder": folder, "hits": code_cache.hits,
                  "misses": code_cache.misses, "pyspark": pyspark.__file__}))
"""


def spark_zips() -> list[str]:
    """Spark's Python archives as an executor's path has them: pyspark.zip, then py4j's."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    zips = [os.path.join(home, "python", "lib", "pyspark.zip")] + sorted(glob.glob(os.path.join(home, "python", "lib", "py4j-*.zip")))
    missing = [z for z in zips if not os.path.exists(z)]
    if missing or len(zips) < 2:
        raise SystemExit(f"Spark's Python archives not found under {home}/python/lib: {missing or 'py4j-*.zip'}")
    return zips


def start(setting: str, zips: list[str] | None) -> dict:
    """One daemon start in a fresh interpreter; ``zips`` None: pyspark from site-packages."""
    from bench.harness.results import ROOT

    path = [*(zips or []), ROOT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "tensorflow"),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _START, setting], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the daemon's start failed ({setting}):\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["failed"]:
        raise SystemExit(f"the daemon could not preload {r['failed']}")
    if zips and ".zip" not in r["pyspark"]:
        raise SystemExit(f"pyspark came from {r['pyspark']}, not from Spark's archive")
    return r


def fit(store: str, work: str, port: int) -> dict:
    """One cold DeepFM fit of bench.e2e.cold_first_fit, its executors' daemons using ``store``."""
    from bench.e2e import cold_first_fit as cold

    os.environ["SPARKDL_TRAIN_CODE_CACHE"] = store  # the child's environment, and so its executors'
    try:
        r = cold.launch({"work": work, "rows": 200_000, "model": "deepfm", "lib": "sparkdl_train", "mode": "synchronous/epoch",
                         "epochs": 1, "port": port}, sys.executable)
    finally:
        del os.environ["SPARKDL_TRAIN_CODE_CACHE"]
    if "error" in r:
        raise SystemExit(f"the cold fit failed: {r['error']}")
    driver = r["fixed_costs"]["driver"]
    return {"seconds": r["seconds"], "executors_wait": driver.get("sample", 0.0) + driver.get("preflight", 0.0),
            "phases": driver, "epoch_s": r["epoch_s"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="daemon starts per setting")
    p.add_argument("--fits", type=int, default=2, help="cold fits per setting (0: none)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "sparkdl_train_bench"))
    args = p.parse_args(argv)
    from bench.harness import results
    from bench.harness.docs import x

    zips = spark_zips()
    scratch = tempfile.mkdtemp(prefix="sdt-code-bench-")
    try:
        samples: dict[str, list[float]] = {"off": [], "cold": [], "warm": [], "site-packages": []}
        modules = 0
        for i in range(args.rounds):
            folder = os.path.join(scratch, f"store{i}")
            samples["off"].append(start("off", zips)["seconds"])
            cold = start(folder, zips)
            warm = start(folder, zips)
            if warm["misses"] or warm["hits"] != cold["misses"] + cold["hits"]:
                raise SystemExit(f"the warm start compiled {warm['misses']} module(s): {warm}")
            modules = warm["hits"]
            samples["cold"].append(cold["seconds"])
            samples["warm"].append(warm["seconds"])
            samples["site-packages"].append(start("off", None)["seconds"])
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in samples.items()), flush=True)
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"daemon start, median of {args.rounds}: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items())
              + f"; off / warm {x(med['off'] / med['warm'])}, {modules} modules from the archives")
        fits: dict[str, list[dict]] = {"off": [], "warm": []}
        if args.fits:
            from bench.e2e import time_to_target as ttt

            os.makedirs(args.work, exist_ok=True)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            ttt.prepare(200_000, args.work)
            store = os.path.join(scratch, "fits")
            start(store, zips)  # the host's store as a first daemon leaves it
            port = 4300 + os.getpid() % 20000
            for i in range(args.fits):
                for setting in ("off", "warm"):
                    port += 1
                    fits[setting].append(fit("off" if setting == "off" else store, args.work, port))
                print(f"fit pair {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f} s (executors' start {v[-1]['executors_wait']:.2f})"
                                                        for k, v in fits.items()), flush=True)
        rows = [{"what": "daemon start", "setting": k, "median_s": med[k], "samples_s": samples[k]} for k in samples]
        for k, runs in fits.items():
            rows.append({"what": "cold fit", "setting": k, "median_s": statistics.median(r["seconds"] for r in runs),
                         "executors_wait_s": statistics.median(r["executors_wait"] for r in runs), "runs": runs})
        if fits["off"]:
            f_off, f_warm = rows[-2], rows[-1]
            print(f"cold fit, median of {args.fits}: off {f_off['median_s']:.2f} s, warm {f_warm['median_s']:.2f} s "
                  f"(off / warm {x(f_off['median_s'] / f_warm['median_s'])}); the executors' start "
                  f"{f_off['executors_wait_s']:.2f} -> {f_warm['executors_wait_s']:.2f} s")
        print("wrote", results.write("daemon_start", {"rounds": args.rounds, "fits": args.fits, "modules": modules, "rows": rows}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
