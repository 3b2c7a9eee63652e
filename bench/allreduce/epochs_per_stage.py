"""The allreduce engine's fixed cost per epoch: one barrier stage per epoch against one stage for
all of a fit's epochs (``spark.sparkdl_train.allreduce.epochsPerStage``).

A stage per epoch pays, every epoch, Spark's job and barrier stage, the state's broadcast to the
executors, the task's start in its Python worker, the partition's read from Spark, the ranks'
rendezvous and the ring's connections and the broadcast of rank 0's state round the ring. A stage
of several epochs pays them once; between its epochs the ranks hand the driver their partials
(rank 0's with the state) and wait for its "go". Same session, same data and model, alternating
the two settings fit by fit; prints the fits' seconds, the epochs' median seconds (the first
epoch of each fit left out: it pays the same rebuild either way) and the ratios, with the
weights' equality.

    python -m bench.allreduce.epochs_per_stage [--master local[2]] [--epochs 8] [--repeats 2] [--rows 1437] [--averaging]

``--averaging``: model averaging instead of gradient allreduce: Spark's (``mode='synchronous',
frequency='epoch'``, partials merged on the driver) against the ring's (``mode='allreduce',
frequency='epoch'``) with a stage per epoch and with one stage for all epochs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.harness.session import session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1437, help="training rows (the digits, repeated as needed)")
    ap.add_argument("--averaging", action="store_true", help="model averaging: Spark's against the ring's")
    args = ap.parse_args()

    import numpy as np
    import pandas as pd

    from bench.workloads.digits import digits_split, make_mlp
    from sparkdl_train import SparkModel

    spark = session(args.master)
    x, y, _, _ = digits_split()
    reps = -(-args.rows // len(x))
    x, y = np.concatenate([x] * reps)[: args.rows], np.concatenate([y] * reps)[: args.rows]
    df = spark.createDataFrame(pd.DataFrame({"features": list(x.astype("float64")), "label": y.astype("float64")})).repartition(2).cache()
    df.count()
    SparkModel(make_mlp(), mode="allreduce", num_workers=2).fit(df, epochs=2, batch_size=32, verbose=0)  # warm workers

    k = args.epochs
    runs = {"spark averaging": {"mode": "synchronous", "frequency": "epoch"},
            "ring averaging, 1": {"mode": "allreduce", "frequency": "epoch", "epochs_per_stage": 1},
            f"ring averaging, {k}": {"mode": "allreduce", "frequency": "epoch", "epochs_per_stage": k}} if args.averaging else \
        {"1": {"mode": "allreduce", "epochs_per_stage": 1}, str(k): {"mode": "allreduce", "epochs_per_stage": k}}
    fits: dict[str, list[float]] = {name: [] for name in runs}
    epochs: dict[str, list[float]] = {name: [] for name in runs}
    weights: dict[str, list] = {}
    executors: dict[str, set] = {name: set() for name in runs}
    for _ in range(args.repeats):
        for per_stage, kwargs in runs.items():
            model = make_mlp()
            sm = SparkModel(model, num_workers=2, seed=3, **kwargs)
            t0 = time.perf_counter()
            sm.fit(df, epochs=args.epochs, batch_size=32, verbose=0)
            fits[per_stage].append(time.perf_counter() - t0)
            epochs[per_stage] += [e.seconds for e in sm.stats.epochs[1:]]
            executors[per_stage] |= {p.get("executor_id") for e in sm.stats.epochs for p in e.partitions.values()}
            weights[per_stage] = model.get_weights()
    spark.stop()
    names = list(runs)
    base, last = names[0], names[-1]
    same = max(float(np.max(np.abs(a - b))) for a, b in zip(weights[base], weights[last]))
    print(f"bench/allreduce/epochs_per_stage.py  master={args.master}  epochs={k}  rows={args.rows}  repeats={args.repeats}  "
          f"cpus={os.cpu_count()}")
    for per_stage in names:
        print(f"  {'epochsPerStage=' if not args.averaging else ''}{per_stage}: fit {statistics.median(fits[per_stage]):.3f} s, epoch "
              f"{statistics.median(epochs[per_stage]):.3f} s (medians of {len(fits[per_stage])} / {len(epochs[per_stage])}); "
              f"executors {sorted(map(str, executors[per_stage]))}")
    fixed = (statistics.median(fits[base]) - statistics.median(fits[last])) / (k - 1)
    print(f"  {last} / {base}: fit {statistics.median(fits[last]) / statistics.median(fits[base]):.2f}x, epoch "
          f"{statistics.median(epochs[last]) / statistics.median(epochs[base]):.2f}x; fixed cost saved per epoch {fixed:.3f} s; "
          f"largest weight difference {same:.2g}")
    print("RESULT", {"fit_s": {str(p): statistics.median(v) for p, v in fits.items()},
                     "epoch_s": {str(p): statistics.median(v) for p, v in epochs.items()},
                     "saved_per_epoch_s": fixed, "max_weight_diff": same})


if __name__ == "__main__":
    main()
