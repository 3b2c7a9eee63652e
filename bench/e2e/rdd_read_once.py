"""An RDD of rows read once for a fit's epochs (``data.cacheRdd``) against read every epoch, in one session.

The data of Elephas' examples: an RDD of ``(x, y)`` rows (``parallelize`` of a plain MLP's 32 float features and
10 one-hot classes, ``--rows``), 2 workers on ``local[2]``, batch 256. Per mode, fits of ``--epochs`` alternate
between the two settings (``--repeats`` each, after one fit of each that is not counted: the model rebuilt and
traced in the workers); the result is each fit's total, its read-once job and its epochs, and the ratios of the
medians: a fit's total and a steady epoch (the epochs after the first), read every epoch over read once.

    python -m bench.e2e.rdd_read_once [--modes synchronous/epoch asynchronous/epoch ...] [--rows 200000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.e2e import cold_first_fit as cff

BATCH, WORKERS = 256, 2


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", default=["synchronous/epoch", "asynchronous/epoch", "asynchronous/batch"],
                   choices=list(cff.MODES))
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-write", action="store_true", help="print only (no bench/results/rdd_read_once.json)")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    from bench.harness import results
    from sparkdl_train import SparkModel

    spark = (SparkSession.builder.master(f"local[{WORKERS}]")
             .config("spark.python.daemon.module", "sparkdl_train.worker.daemon").getOrCreate())
    x, y, _, _, _ = cff.data("mlp", "", args.rows)
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), WORKERS)
    rows = []
    for name in args.modes:
        mode, freq = cff.MODES[name]
        model = cff.build("mlp")[0]
        fits = {True: [], False: []}
        for i in range(args.repeats + 1):
            for cache in (False, True):
                sm = SparkModel(model, mode=mode, frequency=freq, num_workers=WORKERS, seed=1, worker_threads=1, cache_rdd=cache)
                t = time.perf_counter()
                sm.fit(rdd, epochs=args.epochs, batch_size=BATCH, verbose=0)
                fit = {"total_s": time.perf_counter() - t, "read_once_s": sm.stats.phases.get("read_once", 0.0),
                       "epochs_s": [e.seconds for e in sm.stats.epochs]}
                if i:  # the first pair rebuilds and traces the model in the workers
                    fits[cache].append(fit)
                print(f"{name} cacheRdd={cache}: {fit['total_s']:.2f} s (read once {fit['read_once_s']:.2f} s, epochs "
                      + " ".join(f"{s:.2f}" for s in fit["epochs_s"]) + ")", flush=True)

        def med(cache: bool, key: str) -> float:
            if key == "steady":
                return statistics.median(s for f in fits[cache] for s in f["epochs_s"][1:])
            return statistics.median(f[key] for f in fits[cache])

        row = {"mode": name, "fits": {"read_once": fits[True], "every_epoch": fits[False]},
               "fit_ratio": med(False, "total_s") / med(True, "total_s"),
               "steady_epoch_ratio": med(False, "steady") / med(True, "steady"),
               "read_once_s": med(True, "read_once_s"), "steady_epoch_s": {"read_once": med(True, "steady"),
                                                                          "every_epoch": med(False, "steady")}}
        rows.append(row)
        print(f"{name}: fit of {args.epochs} epochs {row['fit_ratio']:.2f}x, steady epoch {row['steady_epoch_ratio']:.2f}x "
              "(read every epoch over read once)", flush=True)
    spark.stop()
    if not args.no_write:
        print("wrote", results.write("rdd_read_once", {"rows": args.rows, "epochs": args.epochs, "batch_size": BATCH,
                                                       "workers": WORKERS, "repeats": args.repeats, "modes": rows}))


if __name__ == "__main__":
    main(sys.argv[1:])
