"""The allreduce engine through XLA's collectives against the project's ring, on Keras' JAX backend
(``spark.sparkdl_train.allreduce.collectives``: 'xla' or 'ring').

One session; the same seeded MLP (``--layers`` x Dense(``--width``): 4 x 1024 is 16.8 MB of float32
gradients) and data; fits with ``mode='allreduce', frequency='batch'`` alternate between the two,
all epochs of a fit in one barrier stage (``allreduce.epochsPerStage``) so that the XLA ranks'
processes start once. Prints per setting the median seconds per step of the epochs after the first
(the step, the exchange and the input: what differs), the first epoch's start-up (for 'xla': the
rank process joining the JAX job and compiling the program), the ratio, and the largest difference
between the two settings' final weights (the same steps: float32 sums in another order at most).

    python -m bench.allreduce.xla [--master local[2]] [--rows 20480] [--batch-size 128] [--epochs 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "jax"
    import keras  # noqa: F401 - on JAX from here on; the fits give their stages KERAS_BACKEND

    del os.environ["KERAS_BACKEND"]

from bench.harness.session import session


def _model(width: int, layers: int, features: int):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    h = inputs
    for _ in range(layers):
        h = keras.layers.Dense(width, activation="relu")(h)
    m = keras.Model(inputs, keras.layers.Dense(1)(h))
    m.compile(keras.optimizers.SGD(1e-4), "mse")
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rows", type=int, default=20480)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np

    from sparkdl_train import SparkModel

    spark = session(args.master)
    sc = spark.sparkContext
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.features)).astype(np.float32)
    y = x[:, :4].sum(axis=1, keepdims=True).astype(np.float32)
    rdd = sc.parallelize(list(zip(x, y)), 2).cache()
    rdd.count()
    w0 = _model(args.width, args.layers, args.features).get_weights()
    runs: dict[str, list[dict]] = {"ring": [], "xla": []}
    finals = {}
    for _ in range(args.repeats):
        for how in ("ring", "xla"):
            m = _model(args.width, args.layers, args.features)
            m.set_weights(w0)
            sm = SparkModel(m, mode="allreduce", num_workers=2, collectives=how, epochs_per_stage=args.epochs)
            sm.fit(rdd, epochs=args.epochs, batch_size=args.batch_size, shuffle=False, verbose=0)
            epochs = sm.stats.epochs
            steps = [max(i.get("global_steps", 0) for i in e.partitions.values()) for e in epochs]
            first = list(epochs[0].partitions.values())
            runs[how].append({
                "step_s": statistics.median(e.seconds / s for e, s in zip(epochs[1:], steps[1:])),
                "first_epoch_s": epochs[0].seconds,
                "startup": {k: max(float(i.get("startup", {}).get(k) or 0) for i in first)
                            for k in ("rebuild", "xla_join", "first_step", "first_batch")},
                "stages": sm.stats.server.get("stages"),
            })
            finals[how] = m.get_weights()
    params = sum(int(np.prod(w.shape)) for w in w0)
    result = {"master": args.master, "gradient_bytes": 4 * params, "batch_per_rank": args.batch_size,
              "steps_per_epoch": steps[-1], "runs": runs,
              "step_s": {h: statistics.median(r["step_s"] for r in rs) for h, rs in runs.items()},
              "max_weight_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(finals["ring"], finals["xla"]))}
    result["xla_over_ring"] = result["step_s"]["xla"] / result["step_s"]["ring"]
    print(f"{args.master}: {args.layers} x Dense({args.width}), {4 * params / 1e6:.1f} MB of gradients, "
          f"batch {args.batch_size} per rank, {steps[-1]} steps an epoch, medians of {args.repeats}")
    for how, rs in runs.items():
        print(f"  {how:5s} {result['step_s'][how] * 1e3:8.1f} ms a step (epochs 2+); first epoch "
              f"{statistics.median(r['first_epoch_s'] for r in rs):6.1f} s, start-up {rs[-1]['startup']}")
    print(f"  xla / ring: {result['xla_over_ring']:.2f}x the step; weights differ by at most {result['max_weight_diff']:.2e}")
    print("RESULT " + json.dumps(result))
    spark.stop()


if __name__ == "__main__":
    main()
