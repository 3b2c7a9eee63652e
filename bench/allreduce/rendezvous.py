"""The allreduce engine's per-epoch rendezvous: the driver's server against Spark's allGather.

Every allreduce epoch is a barrier stage whose ranks exchange ``host:port`` before forming the ring.
Spark's ``BarrierTaskContext.allGather`` answers after up to a second (its executor polls the
coordinator's reply once a second); ``spark.sparkdl_train.allreduce.rendezvous=driver`` (the default)
asks the driver's rendezvous server instead. Same session, same data and model, alternating the two
settings fit by fit; prints each epoch's seconds and each rank's rendezvous seconds (the task's
``startup["rendezvous"]``: the exchange and the ring's connections), and the ratios.

    python -m bench.allreduce.rendezvous [--master local[2]] [--epochs 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.harness.session import session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import pandas as pd

    from bench.workloads.digits import digits_split, make_mlp
    from sparkdl_train import SparkModel

    spark = session(args.master)
    x, y, _, _ = digits_split()
    df = spark.createDataFrame(pd.DataFrame({"features": list(x.astype("float64")), "label": y.astype("float64")})).repartition(2).cache()
    df.count()
    SparkModel(make_mlp(), mode="allreduce", num_workers=2).fit(df, epochs=1, batch_size=32, verbose=0)  # warm workers

    epochs: dict[str, list[float]] = {"driver": [], "spark": []}
    meets: dict[str, list[float]] = {"driver": [], "spark": []}
    for _ in range(args.repeats):
        for how in ("spark", "driver"):
            spark.sparkContext._conf.set("spark.sparkdl_train.allreduce.rendezvous", how)  # what a fit reads
            sm = SparkModel(make_mlp(), mode="allreduce", num_workers=2)
            sm.fit(df, epochs=args.epochs, batch_size=32, verbose=0)
            epochs[how] += [e.seconds for e in sm.stats.epochs[1:]]  # the first epoch pays the model's rebuild
            meets[how] += [p["startup"]["rendezvous"] for e in sm.stats.epochs[1:] for p in e.partitions.values()
                           if "rendezvous" in p.get("startup", {})]
    spark.stop()
    print(f"bench/allreduce/rendezvous.py  master={args.master}  epochs={args.epochs}  repeats={args.repeats}  cpus={os.cpu_count()}")
    for how in ("spark", "driver"):
        print(f"  {how:>6}: epoch {statistics.median(epochs[how]):.3f} s (median of {len(epochs[how])}), "
              f"rank rendezvous {statistics.median(meets[how]) * 1e3:.1f} ms (max {max(meets[how]) * 1e3:.1f})")
    print(f"  driver/spark: epoch {statistics.median(epochs['driver']) / statistics.median(epochs['spark']):.2f}x, "
          f"rendezvous {statistics.median(meets['driver']) / statistics.median(meets['spark']):.3f}x")
    print("RESULT", {k: {"epoch_s": statistics.median(epochs[k]), "rendezvous_s": statistics.median(meets[k]),
                         "rendezvous_max_s": float(np.max(meets[k]))} for k in epochs})


if __name__ == "__main__":
    main()
