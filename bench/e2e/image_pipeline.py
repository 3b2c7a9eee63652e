"""Image pipeline benchmark: PNG bytes decoded on the executors versus pre-decoded arrays.

One process, one ``local[N]`` session, the generated digits PNGs (``jobs/train_images.py``'s
data). The same seeded CNN trains for ``--epochs`` epochs on the same images in the same
partitions, fed three ways:

1. ``arrays``: pre-decoded float arrays (``array<float>``, decoded once by Spark and cached):
   the baseline, measured in this run;
2. ``png``: the cached PNG bytes, decoded by the batch transform on each task's data thread,
   overlapped with training;
3. ``png-2t``: the same with ``transform_threads=2``.

Reported: steady-state training images/s (epochs after the first, training jobs only) and
its ratio to (1); the target is >= 0.8x for decoding on the executors (issue 18).

    python -m bench.e2e.image_pipeline                    # 4 copies of the digits (~7k images), 3 epochs
    python -m bench.e2e.image_pipeline --copies 8 --mode allreduce
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", default="asynchronous")
    p.add_argument("--frequency", default="batch")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three variants (interleaved; the median counts)")
    p.add_argument("--data", help="PNG folder (generated there when it does not exist; default: a temporary folder)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import images

    data = args.data or os.path.join(tempfile.mkdtemp(prefix="sdt-images-"), "png")
    if not os.path.exists(data):
        images.write_pngs(data, copies=args.copies)
    spark = (SparkSession.builder.master(f"local[{args.workers}]").appName("sparkdl_train bench: image pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "2g")
             .config("spark.python.daemon.module", "sparkdl_train.worker.daemon").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").option("pathGlobFilter", "*.png")
             .load(data).select("path", "content").repartition(args.workers).cache())
    n = files.count()
    transform = images.DigitsTransform()

    def decode(batches):
        for rb in batches:
            out = transform({"path": rb.column("path").to_pylist(), "content": rb.column("content").to_pylist()})
            flat = out["image"].reshape(len(out["image"]), -1)
            yield pa.RecordBatch.from_pydict({
                "image": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1]).cast(pa.list_(pa.float32())),
                "label": pa.array(out["label"]),
            })

    arrays = files.mapInArrow(decode, "image array<float>, label bigint").cache()  # same partitions, same order
    assert arrays.count() == n
    frequency = int(args.frequency) if args.frequency.isdigit() else args.frequency

    def run(name: str, df, **kw) -> float:
        model = images.cnn(seed=0)
        extra = {"frequency": frequency} if args.mode != "allreduce" else {}
        sm = SparkModel(model, mode=args.mode, num_workers=args.workers, seed=0, transform_threads=kw.pop("threads", 1), **extra)
        t0 = time.perf_counter()
        sm.fit(df, epochs=args.epochs, batch_size=args.batch_size, verbose=0, feature_cols="image", **kw)
        wall = time.perf_counter() - t0
        steady = [e.samples / e.seconds for e in sm.stats.epochs[1:]] or [sm.stats.epochs[0].samples / sm.stats.epochs[0].seconds]
        rate = statistics.median(steady)
        print(f"  {name:8s} {rate:8.0f} images/s steady  ({wall:.1f} s for {args.epochs} epochs)", flush=True)
        return rate

    variants = [("arrays", arrays, {}), ("png", files, {"transform": transform}), ("png-2t", files, {"transform": transform, "threads": 2})]
    rates: dict[str, list[float]] = {v[0]: [] for v in variants}
    print(f"{n} images, {args.workers} workers on local[{args.workers}], mode {args.mode}/{args.frequency}, batch {args.batch_size}")
    for r in range(args.repeats):
        print(f"round {r + 1}/{args.repeats}")
        for name, df, kw in variants:
            rates[name].append(run(name, df, **dict(kw)))
    base = statistics.median(rates["arrays"])
    results = {name: {"images_per_s": statistics.median(v), "ratio_to_arrays": statistics.median(v) / base, "runs": v}
               for name, v in rates.items()}
    print("\nvariant   images/s   ratio to pre-decoded arrays (target >= 0.8 for decoding on the executors)")
    for name, r in results.items():
        print(f"{name:8s} {r['images_per_s']:9.0f}   {r['ratio_to_arrays']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"images": n, "args": vars(args), "results": results, "cpu_count": os.cpu_count(), "np": np.__version__}, f, indent=2)
    spark.stop()
    from bench.harness import results as results_file

    print("wrote", results_file.write("image_pipeline", {"images": n, "workers": args.workers, "mode": f"{args.mode}/{args.frequency}",
                                                         "batch_size": args.batch_size, "epochs": args.epochs, "repeats": args.repeats,
                                                         "results": results}))


if __name__ == "__main__":
    main()
