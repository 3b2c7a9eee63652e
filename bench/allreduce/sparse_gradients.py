"""Embedding gradients through the allreduce as the rows each step touched, against whole tables
(``spark.sparkdl_train.allreduce.sparseGradients``), on the flagship's DeepFM and data.

One session, the job's generated data and features (cached), the same seeded model; fits with
``mode='allreduce', frequency='batch'`` alternate between ``sparse_gradients=False`` and ``True``.
Prints per setting: the median samples/s of the epochs after each fit's first, the ring's seconds
and bytes per step (all ranks), and the ratios; and checks that both settings give the same weights
(with 2 ranks every element of the gradient is the same pair of floats, so bit for bit).

    python -m bench.allreduce.sparse_gradients [--master local[2]] [--rows 400000] [--vocab-min-count 1] [--repeats 3]

``--vocab-min-count`` / ``--vocab-max-size`` set the vocabulary as the job's flags do (the job: 5 and
65,536 per field; 1 keeps every value seen); ``--table-rows 1000000`` gives the tables the rows of a
Criteo-sized vocabulary (the generated ids use the first ones).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.harness.session import session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--vocab-min-count", type=int, default=1)
    ap.add_argument("--vocab-max-size", type=int, default=65536)
    ap.add_argument("--table-rows", type=int, default=0,
                    help="rows of each table at least this many (a Criteo-sized vocabulary: 1M); the data's ids stay "
                         "the vocabulary's")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    import keras
    import numpy as np

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.models.ctr import build_vocabulary, ctr_features, deepfm

    # rank 0's state (a 1M-row table with Adam's slots: 108 MB) comes back through the driver's JVM
    spark = session(args.master, {"spark.driver.memory": "4g"})
    raw = ctr_data.generate(spark, ctr_data.CTRSpec(rows=args.rows, seed=args.seed), partitions=2)
    vocab = build_vocabulary(raw, ctr_data.CAT_COLS, min_count=args.vocab_min_count, max_size=args.vocab_max_size)
    train = ctr_features(raw, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, ["label"]).repartition(2).cache()
    n = train.count()
    columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
    rows = max(vocab.size, args.table_rows)
    print(f"{args.master}: {n} rows, vocabulary {vocab.size} ids, tables {rows} x 8 and x 1 "
          f"({rows * 9 * 4 / 1e6:.1f} MB of float32), batch {args.batch_size}", flush=True)

    def fit(sparse: bool) -> tuple[list[np.ndarray], dict]:
        keras.utils.set_random_seed(args.seed)
        model = deepfm(vocab_size=rows, embed_dim=8, hidden=(64, 32), learning_rate=0.002)
        sm = SparkModel(model, mode="allreduce", frequency="batch", num_workers=2, seed=args.seed, sparse_gradients=sparse)
        t0 = time.perf_counter()
        sm.fit(train, epochs=args.epochs, batch_size=args.batch_size, verbose=0, shuffle=False, **columns)
        wall = time.perf_counter() - t0
        server = sm.stats.server
        steady = [e.samples / e.seconds for e in sm.stats.epochs[1:]]
        per_step = [sum(i["comm_seconds"] for i in e.partitions.values()) / max(1, max(i["global_steps"] for i in e.partitions.values()))
                    for e in sm.stats.epochs[1:]]
        return model.get_weights(), {"samples_per_s": statistics.median(steady), "wall": wall,
                                     "comm_s_per_step_all_ranks": statistics.median(per_step),
                                     "bytes_per_step": (server["bytes_sent"] + server["bytes_received"]) / max(1, server["steps"]),
                                     "tables": server["sparse_gradients"]}

    fit(True)  # warm the workers (TensorFlow, the model's traces)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    weights: dict[bool, list[np.ndarray]] = {}
    for _ in range(args.repeats):
        for sparse in (False, True):
            weights[sparse], stats = fit(sparse)
            runs[sparse].append(stats)
            print(f"  sparse={sparse!s:5}  {stats['samples_per_s']:9.0f} samples/s  comm {1e3 * stats['comm_s_per_step_all_ranks']:.2f} ms/step  "
                  f"{stats['bytes_per_step'] / 1e3:9.1f} kB/step  {stats['tables']}", flush=True)
    same = all(np.array_equal(a, b) for a, b in zip(weights[False], weights[True]))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("samples_per_s", "comm_s_per_step_all_ranks", "bytes_per_step")}
           for k, v in runs.items()}
    print(f"\nmedians of {args.repeats} ({args.master}, epochs after the first):")
    print("| tables' gradients | samples/s | ring seconds per step (both ranks) | bytes per step (both ranks) |")
    print("| --- | --- | --- | --- |")
    print(f"| whole (dense ring) | {med[False]['samples_per_s']:,.0f} | {1e3 * med[False]['comm_s_per_step_all_ranks']:.2f} ms | "
          f"{med[False]['bytes_per_step'] / 1e3:,.0f} kB |")
    print(f"| rows touched | {med[True]['samples_per_s']:,.0f} ({med[True]['samples_per_s'] / med[False]['samples_per_s']:.2f}x) | "
          f"{1e3 * med[True]['comm_s_per_step_all_ranks']:.2f} ms ({med[True]['comm_s_per_step_all_ranks'] / med[False]['comm_s_per_step_all_ranks']:.2f}x) | "
          f"{med[True]['bytes_per_step'] / 1e3:,.0f} kB ({med[False]['bytes_per_step'] / med[True]['bytes_per_step']:.1f}x fewer) |")
    print(f"same weights bit for bit: {same}")
    spark.stop()


if __name__ == "__main__":
    main()
