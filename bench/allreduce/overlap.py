"""Overlap (``allreduce.bucketBytes``): how much of the gradient exchange hides behind the backward pass.

Two measurements, one run, ratios against the one-vector step measured in the same run:

1. **The mechanism, in one process** (no Spark): TensorFlow's fused step on a dense model whose
   backward pass is at least as long as the exchange, its buckets reduced by a thread whose
   ``reduce`` waits for the bytes' time on an emulated link (``--gbps``; a real NIC's transfer
   costs the host no CPU, a sleep neither). Steps: compute alone; one vector, then the exchange;
   buckets reduced while the backward pass runs. Hidden = 1 - (bucketed - compute) / exchange.
2. **The project's fit on ``--master``** (default ``local[2]``): two ranks, the real ring over
   loopback sockets, ``bucket_bytes`` 0 against ``--bucket-bytes``; the ranks' own statistics
   (``bucket_exchange_seconds``, ``bucket_wait_seconds``) give the hidden fraction. On one
   machine the exchange is memory copies on the same cores that run the backward pass, so less
   hides than (1) shows.

    python -m bench.allreduce.overlap [--units 1024] [--layers 4] [--batch 256] [--gbps 5] [--bucket-bytes 4194304]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench.harness.session import session


def make_model(units: int, layers: int, seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((units,))] + [keras.layers.Dense(units, activation="relu") for _ in range(layers)]
                             + [keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def in_process(args) -> dict:
    import numpy as np

    from sparkdl_train.allreduce.buckets import BucketRing
    from sparkdl_train.backend import tensorflow as tfb

    tfb.configure_threads(1)  # a rank's share of this machine
    model = make_model(args.units, args.layers)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.units)).astype(np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.float32)
    batch = (x, y, None)
    whole, bucketed = tfb.FusedStep(model, args.batch), tfb.FusedStep(model, args.batch, args.bucket_bytes)
    buf = np.empty(whole.size, np.float32)
    byte_s = args.gbps * 1e9 / 8

    def wire(view):
        time.sleep(view.nbytes / byte_s)

    exchange = buf.nbytes / byte_s
    times: dict[str, list[float]] = {"compute": [], "one vector": [], "buckets": []}
    with BucketRing(buf, [(lo, hi) for _, _, lo, hi in bucketed.bucket_bounds], wire, timeout=60) as br:
        for rep in range(args.steps + 3):
            for kind in times:
                t0 = time.perf_counter()
                if kind == "buckets":
                    br.start_step()
                    bucketed.gradients(batch, buf, br.ready)
                    br.wait()
                else:
                    whole.gradients(batch, buf)
                    if kind == "one vector":
                        wire(buf)
                whole.apply(buf)
                if rep >= 3:
                    times[kind].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    hidden = 1 - (med["buckets"] - med["compute"]) / exchange
    return {"gradient_bytes": int(buf.nbytes), "buckets": len(bucketed.bucket_bounds), "emulated_gbps": args.gbps,
            "exchange_s": exchange, **{f"{k}_s": v for k, v in med.items()},
            "buckets_over_one_vector": med["buckets"] / med["one vector"], "hidden": hidden}


def on_spark(args) -> dict:
    import numpy as np
    import pandas as pd

    from sparkdl_train import SparkModel

    spark = session(args.master)
    rng = np.random.default_rng(1)
    rows = args.batch * args.spark_steps * 2
    x = rng.standard_normal((rows, args.units)).astype(np.float32)
    y = rng.integers(0, 10, rows).astype(np.float64)
    df = spark.createDataFrame(pd.DataFrame({"features": list(x.astype("float64")), "label": y})).repartition(2).cache()
    df.count()
    out: dict = {}
    for rep in range(args.repeats):
        for bucket_bytes in (0, args.bucket_bytes):
            model = make_model(args.units, args.layers)
            sm = SparkModel(model, mode="allreduce", num_workers=2, bucket_bytes=bucket_bytes)
            sm.fit(df, epochs=args.epochs, batch_size=args.batch, verbose=0)
            epochs = sm.stats.epochs[1:]  # the first pays the model's rebuild and the step's trace
            ranks = [p for e in epochs for p in e.partitions.values()]
            steps = sum(p["global_steps"] for p in ranks) / len(ranks) * 1.0
            r = out.setdefault(bucket_bytes, {"step_s": [], "comm_per_step_s": [], "exchange_s": [], "wait_s": []})
            r["step_s"].append(statistics.median(e.seconds for e in epochs) * len(epochs) / steps)
            r["comm_per_step_s"].append(sum(p["comm_seconds"] for p in ranks) / len(ranks) / (steps / len(epochs)))
            if bucket_bytes:
                r["exchange_s"].append(sum(p["bucket_exchange_seconds"] for p in ranks))
                r["wait_s"].append(sum(p["bucket_wait_seconds"] for p in ranks))
    spark.stop()
    one, buck = out[0], out[args.bucket_bytes]
    result = {"master": args.master, "one_vector_step_s": statistics.median(one["step_s"]),
              "buckets_step_s": statistics.median(buck["step_s"]),
              "one_vector_comm_per_step_s": statistics.median(one["comm_per_step_s"]),
              "buckets_wait_per_step_s": statistics.median(buck["comm_per_step_s"]),
              "hidden": 1 - sum(buck["wait_s"]) / sum(buck["exchange_s"])}
    result["buckets_over_one_vector"] = result["buckets_step_s"] / result["one_vector_step_s"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--gbps", type=float, default=5.0, help="the emulated link of part 1")
    ap.add_argument("--bucket-bytes", type=int, default=4 << 20)
    ap.add_argument("--steps", type=int, default=20, help="part 1: timed steps of each kind")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--spark-steps", type=int, default=20, help="part 2: steps per epoch per rank")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-spark", action="store_true")
    args = ap.parse_args()

    print(f"bench/allreduce/overlap.py  dense {args.layers} x {args.units}, batch {args.batch}, buckets of "
          f"{args.bucket_bytes / 1e6:.1f} MB, cpus={os.cpu_count()}")
    a = in_process(args)
    print(f"  1. in one process, {a['gradient_bytes'] / 1e6:.1f} MB of gradients in {a['buckets']} buckets, "
          f"emulated {args.gbps:g} Gb/s link: exchange {a['exchange_s'] * 1e3:.1f} ms")
    print(f"     step: compute alone {a['compute_s'] * 1e3:.1f} ms, one vector then the exchange "
          f"{a['one vector_s'] * 1e3:.1f} ms, buckets during the backward pass {a['buckets_s'] * 1e3:.1f} ms "
          f"({a['buckets_over_one_vector']:.2f}x); exchange hidden {a['hidden']:.0%}")
    result = {"in_process": a}
    if not args.skip_spark:
        b = on_spark(args)
        print(f"  2. SparkModel on {args.master}, 2 ranks, the ring over loopback: step {b['one_vector_step_s'] * 1e3:.1f} ms "
              f"-> {b['buckets_step_s'] * 1e3:.1f} ms ({b['buckets_over_one_vector']:.2f}x); exchange per step "
              f"{b['one_vector_comm_per_step_s'] * 1e3:.1f} ms, waited for with buckets "
              f"{b['buckets_wait_per_step_s'] * 1e3:.1f} ms; hidden (the ranks' statistics) {b['hidden']:.0%}")
        result["spark"] = b
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()
