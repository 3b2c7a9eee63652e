"""The parameter server's half-width wire (``spark.sparkdl_train.ps.compression``) on the flagship's
DeepFM and data: the asynchronous server pushing every 4 steps (the job's former default), with
float32, float16 and bfloat16 deltas and replies.

One session, the job's generated data and features (cached, 10% held out), the same seeded model;
fits alternate between the wires. Prints per wire the median samples/s of the epochs after each fit's
first, the bytes of a push and its reply, a worker's seconds per push (its own work, and the round
trip through the server), and the held-out AUC (``SparkModel.evaluate``); then the ratios to float32.

    python -m bench.ps.compression [--master local[2]] [--rows 400000] [--epochs 3] [--repeats 3] [--table-rows 0]

``--table-rows 1000000`` gives the tables the rows of a Criteo-sized vocabulary (the ids stay the
generated vocabulary's); the rows a push carries do not change with it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.harness.session import session

WIRES = ("none", "fp16", "bf16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--every", type=int, default=4, help="push every N steps")
    ap.add_argument("--table-rows", type=int, default=0)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    import keras

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.models.ctr import build_vocabulary, ctr_features, deepfm

    spark = session(args.master, {"spark.driver.memory": "4g"})
    raw = ctr_data.generate(spark, ctr_data.CTRSpec(rows=args.rows, seed=args.seed), partitions=2)
    vocab = build_vocabulary(raw, ctr_data.CAT_COLS, min_count=5, max_size=65536)
    features = ctr_features(raw, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, ["label"])
    train, test = features.randomSplit([0.9, 0.1], seed=args.seed)
    train, test = train.repartition(2).cache(), test.repartition(2).cache()
    n, n_test = train.count(), test.count()
    columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
    rows = max(vocab.size, args.table_rows)
    print(f"{args.master}: {n} training rows, {n_test} held out, tables {rows} x 8 and x 1, batch {args.batch_size}, "
          f"asynchronous, a push every {args.every} steps", flush=True)

    def fit(wire: str) -> dict:
        keras.utils.set_random_seed(args.seed)
        model = deepfm(vocab_size=rows, embed_dim=8, hidden=(64, 32), learning_rate=0.002)
        sm = SparkModel(model, mode="asynchronous", frequency=args.every, num_workers=2, seed=args.seed, ps_compression=wire)
        t0 = time.perf_counter()
        sm.fit(train, epochs=args.epochs, batch_size=args.batch_size, verbose=0, **columns)
        wall = time.perf_counter() - t0
        server = sm.stats.as_dict()["server"]
        parts = [p for e in sm.stats.epochs[1:] for p in e.partitions.values()]
        pushes = max(1, sum(p["pushes"] for p in parts))
        auc = sm.evaluate(test, batch_size=4096, return_dict=True, **columns)["auc"]
        return {"samples_per_s": statistics.median(e.samples / e.seconds for e in sm.stats.epochs[1:]), "wall": wall,
                "bytes_per_push": (server["bytes_in"] + server["bytes_out"]) / max(1, server["updates"]),
                "sync_ms": 1e3 * sum(p["push_sync_seconds"] for p in parts) / pushes,
                "round_trip_ms": 1e3 * sum(p["push_round_trip_seconds"] for p in parts) / pushes, "auc": auc}

    fit("fp16")  # warm the workers (TensorFlow, the model's traces)
    runs: dict[str, list[dict]] = {w: [] for w in WIRES}
    for _ in range(args.repeats):
        for wire in WIRES:
            stats = fit(wire)
            runs[wire].append(stats)
            print(f"  {wire:5} {stats['samples_per_s']:9.0f} samples/s  {stats['bytes_per_push'] / 1e3:8.1f} kB/push  "
                  f"worker {stats['sync_ms']:.2f} ms + round trip {stats['round_trip_ms']:.2f} ms per push  "
                  f"AUC {stats['auc']:.4f}", flush=True)
    keys = ("samples_per_s", "bytes_per_push", "sync_ms", "round_trip_ms", "auc")
    med = {w: {k: statistics.median(r[k] for r in v) for k in keys} for w, v in runs.items()}
    base = med["none"]
    print(f"\nmedians of {args.repeats} ({args.master}, epochs after the first):")
    print("| wire | samples/s | bytes per push + reply | worker's work per push | round trip per push | held-out AUC |")
    print("| --- | --- | --- | --- | --- | --- |")
    for w in WIRES:
        m = med[w]
        rel = "" if w == "none" else f" ({m['samples_per_s'] / base['samples_per_s']:.2f}x)"
        rel_bytes = "" if w == "none" else f" ({m['bytes_per_push'] / base['bytes_per_push']:.2f}x)"
        print(f"| {w} | {m['samples_per_s']:,.0f}{rel} | {m['bytes_per_push'] / 1e3:,.1f} kB{rel_bytes} | "
              f"{m['sync_ms']:.2f} ms | {m['round_trip_ms']:.2f} ms | {m['auc']:.4f} |")
    spark.stop()


if __name__ == "__main__":
    main()
