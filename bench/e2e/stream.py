"""Continuous training from a stream: sustained events/s, freshness, and the same rows as a batch fit.

On ``local[2]`` with the CTR job's model (DeepFM over ``jobs/stream_ctr.py``'s features: log counts, categorical
values hashed into ``--buckets`` rows per field), in one process and one Spark session:

1. ``backlog``: ``--files`` Parquet files of planted-model click events (4,096 each) already in the folder,
   ``fit_stream`` through them with ``--per-trigger`` files per micro-batch (``maxFilesPerTrigger``; availableNow),
   once for each value given. Sustained events/s: the micro-batches after the first (which sets the engine up),
   their rows over their seconds.
2. ``batch``: the same files read at rest, a two-epoch ``fit`` with the same engine and batch size: samples/s
   of its second epoch (its first, like the first micro-batch, sets the executors up). The ratio stream/batch
   is what a micro-batch costs beyond its rows (its Spark job, the commit).
3. ``arrival``: a new folder that a writer thread fills with one file every ``--interval`` seconds (below the
   sustained rate), ``fit_stream`` on it as files come (Spark's default trigger), a model version published
   after every micro-batch. An event's freshness: from its file's arrival to the publication of the first
   version that trained on it (``BatchRecord.published_at``; which micro-batch read which file: Spark's file
   source log). p50/p99 over the events after the first micro-batch's (those wait for the engine's setup:
   reported apart).

    python -m bench.e2e.stream --files 12 --interval 4

Writes bench/results/stream.json (docs/streaming.md's table).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from bench.harness import results as results_file

MODE = {"mode": "asynchronous", "frequency": "batch"}


def write_events(folder: str, files: int, start: int = 0) -> list[str]:
    """``files`` Parquet files of planted-model events (one generator block each) in a staging folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdl_train.datasets import ctr

    planted = ctr.PlantedModel.make(ctr.CTRSpec(rows=ctr.BLOCK_ROWS * (start + files)))
    os.makedirs(folder, exist_ok=True)
    out = []
    for i in range(start, start + files):
        cols = ctr.generate_block(planted, i)
        path = os.path.join(folder, f"events-{i:05d}.parquet")
        pq.write_table(pa.table(cols), path)
        out.append(path)
    return out


def features(df, buckets: int):
    from sparkdl_train.datasets import ctr
    from sparkdl_train.models.vocabulary import ctr_features

    return ctr_features(df, ctr.DENSE_COLS, ctr.CAT_COLS, buckets, ["label"])


def model(buckets: int, learning_rate: float):
    from sparkdl_train.datasets import ctr
    from sparkdl_train.models.ctr import MODELS

    return MODELS["deepfm"](vocab_size=len(ctr.CAT_COLS) * buckets, embed_dim=8, hidden=(64, 32), learning_rate=learning_rate)


def stream(spark, folder: str, location: str, args, per_trigger: int = 1, **kwargs):
    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import ctr

    raw = spark.readStream.schema(ctr.spark_schema()).option("maxFilesPerTrigger", per_trigger).parquet(folder)
    sm = SparkModel(model(args.buckets, args.learning_rate), num_workers=2, **MODE)
    return sm, sm.fit_stream(features(raw, args.buckets), location, batch_size=args.batch_size,
                             feature_cols={"numeric": "numeric", "categorical": "categorical"}, label_col="label", **kwargs)


def batch_files(location: str) -> dict[str, int]:
    """Which micro-batch read which file: Spark's file source log (``<checkpoint>/query/sources/0``)."""
    out = {}
    for path in glob.glob(os.path.join(location, "query", "sources", "0", "*")):
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    entry = json.loads(line)
                    out[os.path.basename(entry["path"])] = int(entry["batchId"])
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=12, help="files (4,096 events each) in the backlog and arrival runs")
    p.add_argument("--per-trigger", default="1,4", dest="per_trigger", help="files per micro-batch in the backlog runs, comma-separated")
    p.add_argument("--interval", type=float, default=4.0, help="seconds between two files' arrival in the arrival run")
    p.add_argument("--buckets", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=512, dest="batch_size")
    p.add_argument("--learning-rate", type=float, default=0.002, dest="learning_rate")
    p.add_argument("--no-write", action="store_true", help="print, do not write bench/results/stream.json")
    args = p.parse_args(argv)

    from bench.harness.session import session
    from sparkdl_train.datasets import ctr

    spark = session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    work = tempfile.mkdtemp(prefix="bench_stream_")
    try:
        # 1. backlog
        backlog = os.path.join(work, "backlog")
        write_events(backlog, args.files)
        runs = []
        for k in [int(v) for v in args.per_trigger.split(",")]:
            _, fit = stream(spark, backlog, os.path.join(work, f"ckpt_backlog_{k}"), args, per_trigger=k,
                            trigger={"availableNow": True})
            fit.awaitTermination(3600)
            fit.stop()
            trained = [b for b in fit.batches if b.skipped is None]
            steady = trained[1:]
            rate = sum(b.rows for b in steady) / sum(b.seconds for b in steady)
            runs.append({"files_per_micro_batch": k, "events_per_micro_batch": k * ctr.BLOCK_ROWS, "micro_batches": len(trained),
                         "first_seconds": trained[0].seconds, "events_per_second": rate,
                         "seconds_per_micro_batch": float(np.median([b.seconds for b in steady]))})
            print(f"backlog, {k} file(s) a micro-batch: {len(trained)} micro-batches, first {trained[0].seconds:.1f} s, "
                  f"then {rate:,.0f} events/s", flush=True)

        # 2. the same rows at rest, one epoch
        from sparkdl_train import SparkModel

        rest = features(spark.read.schema(ctr.spark_schema()).parquet(backlog), args.buckets)
        sm = SparkModel(model(args.buckets, args.learning_rate), num_workers=2, **MODE)
        sm.fit(rest, epochs=2, batch_size=args.batch_size, feature_cols={"numeric": "numeric", "categorical": "categorical"},
               label_col="label", verbose=0)
        epoch = sm.stats.epochs[-1]
        batch_rate = epoch.samples / epoch.seconds
        print(f"batch fit, second epoch: {epoch.samples:,} rows in {epoch.seconds:.1f} s, {batch_rate:,.0f} samples/s; "
              "stream/batch " + ", ".join(f"{r['events_per_second'] / batch_rate:.2f}x" for r in runs), flush=True)

        # 3. arrival: a file every --interval seconds, a version after every micro-batch
        staging, arrive = os.path.join(work, "staging"), os.path.join(work, "arrive")
        os.makedirs(arrive)
        staged = write_events(staging, args.files, start=args.files)
        arrived: dict[str, float] = {}
        location = os.path.join(work, "ckpt_arrive")
        _, fit = stream(spark, arrive, location, args, publish_every=1, publish_dir=os.path.join(work, "versions"))

        def writer() -> None:
            for path in staged:  # a hidden name first (the file source skips those), renamed into place whole
                name = os.path.basename(path)
                hidden = os.path.join(arrive, f".{name}.tmp")
                shutil.move(path, hidden)
                os.rename(hidden, os.path.join(arrive, name))
                arrived[name] = time.time()
                time.sleep(args.interval)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        deadline = time.monotonic() + args.files * args.interval + 600
        while sum(b.rows for b in fit.batches if b.skipped is None and b.version) < args.files * ctr.BLOCK_ROWS:
            if not fit.isActive or time.monotonic() > deadline:
                raise SystemExit(f"the arrival run stopped early: {fit.exception()}")
            time.sleep(0.5)
        fit.stop()
        thread.join()
        where = batch_files(location)
        published = {b.batch_id: b.published_at for b in fit.batches if b.published_at}
        fresh, first = [], []
        for name, t in arrived.items():
            (first if where[name] == min(published) else fresh).extend([published[where[name]] - t] * ctr.BLOCK_ROWS)
        p50, p99 = percentile(fresh, 50), percentile(fresh, 99)
        batches = [b for b in fit.batches if b.skipped is None]
        print(f"arrival: a file ({ctr.BLOCK_ROWS:,} events) every {args.interval:g} s, {len(batches)} micro-batches; "
              f"freshness p50 {p50:.1f} s, p99 {p99:.1f} s (the first micro-batch's events: {max(first) if first else 0:.1f} s)", flush=True)
        result = {
            "engine": MODE, "workers": 2, "master": "local[2]", "batch_size": args.batch_size, "events_per_file": ctr.BLOCK_ROWS,
            "backlog": [{**r, "to_batch": r["events_per_second"] / batch_rate} for r in runs],
            "batch": {"samples": epoch.samples, "seconds": epoch.seconds, "samples_per_second": batch_rate},
            "arrival": {"files": args.files, "interval": args.interval, "micro_batches": len(batches),
                        "freshness_p50": p50, "freshness_p99": p99, "freshness_max": max(fresh),
                        "first_version_seconds": max(first) if first else None,
                        "seconds_per_micro_batch": float(np.median([b.seconds for b in batches[1:]]))},
        }
        if not args.no_write:
            print("wrote", results_file.write("stream", result))
        return 0
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
