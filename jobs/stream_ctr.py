"""Continuous CTR training from a Kafka topic of click events (jobs/ctr_events.py writes them): each micro-batch
scored by the model before it trains on it (prequential AUC), then trained on; model versions published as it goes.

    eval "$(./run kafka up)"                      # a broker on this machine: KAFKA_BOOTSTRAP, SPARK_KAFKA_JARS
    ./run kafka generate --topic clicks --rate 2000 --drift-at 200000 &
    ./run submit --jars "$SPARK_KAFKA_JARS" jobs/stream_ctr.py --kafka "$KAFKA_BOOTSTRAP" --topic clicks --output stream_out

Categorical ids are hashed into ``--buckets`` rows per field (a stream has no data at rest to build a vocabulary
from: every id, new or not, has a row). A micro-batch takes at most ``--max-offsets`` events
(``maxOffsetsPerTrigger``: a stream faster than training waits in Kafka, nothing lost) and the job prints each one's
rows, prequential AUC, seconds, the offsets still behind the topic's end (lag) and the version published after it.
It stops after ``--rows`` trained events, ``--timeout`` seconds, or with ``--trigger available-now`` once it trained
what the topic held, and writes ``<output>/summary.json``; run again with the same ``--output`` (after a stop, a
crash or a killed driver) it goes on where it stopped (``<output>/checkpoint``), training no event twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kafka", required=True, help="bootstrap servers, host:port")
    p.add_argument("--topic", default="clicks")
    p.add_argument("--output", default="stream_out", help="checkpoint, model versions and summary.json")
    p.add_argument("--mode", default="asynchronous", help="synchronous | asynchronous | hogwild | allreduce")
    p.add_argument("--frequency", default="batch", help="epoch | batch | N")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512, dest="batch_size")
    p.add_argument("--buckets", type=int, default=2048, help="hashed ids per categorical field")
    p.add_argument("--embed-dim", type=int, default=8, dest="embed_dim")
    p.add_argument("--learning-rate", type=float, default=0.002, dest="learning_rate")
    p.add_argument("--max-offsets", type=int, default=20_000, dest="max_offsets", help="events per micro-batch at most")
    p.add_argument("--trigger", default="2 seconds",
                   help="processing-time trigger, or 'available-now': train on what the topic holds, then stop")
    p.add_argument("--publish-every", type=int, default=5, dest="publish_every", help="a model version every N micro-batches")
    p.add_argument("--rows", type=int, help="stop after training this many events (default: run until --timeout)")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop after this many seconds")
    p.add_argument("--starting-offsets", default="earliest", dest="starting_offsets", help="earliest | latest (a new query)")
    return p.parse_args(argv)


def events(spark, args):
    """The topic's events as the feature table: ``numeric``, ``categorical`` (hashed), ``label``, and the
    oracle columns ``p_true`` and ``regime`` (never features)."""
    from pyspark.sql import functions as F

    from sparkdl_train.datasets import ctr
    from sparkdl_train.models.vocabulary import ctr_features

    schema = ", ".join(["id bigint", *[f"{c} float" for c in ctr.DENSE_COLS], *[f"{c} bigint" for c in ctr.CAT_COLS],
                        "label int", "p_true double", "regime int"])
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.kafka).option("subscribe", args.topic)
           .option("startingOffsets", args.starting_offsets).option("maxOffsetsPerTrigger", args.max_offsets)
           .option("failOnDataLoss", "true").load())
    rows = raw.select(F.from_csv(F.col("value").cast("string"), schema).alias("e")).select("e.*")
    return ctr_features(rows, ctr.DENSE_COLS, ctr.CAT_COLS, args.buckets, ["id", "label", "p_true", "regime"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel
    from sparkdl_train.datasets import ctr
    from sparkdl_train.models.ctr import MODELS

    spark = SparkSession.builder.appName("sparkdl_train stream_ctr").getOrCreate()
    output = os.path.abspath(args.output) if "://" not in args.output else args.output
    model = MODELS["deepfm"](vocab_size=len(ctr.CAT_COLS) * args.buckets, embed_dim=args.embed_dim, hidden=(64, 32),
                             learning_rate=args.learning_rate)
    frequency = int(args.frequency) if args.frequency.isdigit() else args.frequency
    sm = SparkModel(model, mode=args.mode, frequency=frequency, num_workers=args.workers)
    fit = sm.fit_stream(events(spark, args), f"{output}/checkpoint", batch_size=args.batch_size,
                        feature_cols={"numeric": "numeric", "categorical": "categorical"}, label_col="label",
                        trigger={"availableNow": True} if args.trigger == "available-now" else args.trigger, prequential=True, publish_every=args.publish_every,
                        publish_dir=f"{output}/versions", query_name=f"stream_ctr:{args.topic}")
    started, shown, trained = time.monotonic(), 0, 0
    try:
        while True:
            active = fit.isActive and time.monotonic() - started < args.timeout and (args.rows is None or trained < args.rows)
            if active:
                fit.awaitTermination(1.0)
            batches = [b for b in fit.batches if b.skipped or b.error or b.batch_id <= fit.committed]  # finished
            for b in batches[shown:]:
                if not b.reported and active and fit.isActive:
                    break  # Spark's progress report (the lag) comes a moment after the batch: print it then
                trained += b.rows if b.skipped is None and b.error is None else 0
                auc = (b.prequential or {}).get("auc")
                print(f"batch {b.batch_id}: {b.rows} rows in {b.seconds:.1f} s, prequential AUC "
                      f"{'-' if auc is None else f'{auc:.4f}'}, lag {b.lag}, "
                      f"version {b.version or '-'}{f', skipped ({b.skipped})' if b.skipped else ''}", flush=True)
                shown += 1
            if not active:
                break
        error = fit.exception()
    finally:
        fit.stop()
    summary = {"topic": args.topic, "mode": args.mode, "trained_rows": trained, "committed": fit.committed,
               "version": fit.version, "error": None if error is None else str(error),
               "application_id": spark.sparkContext.applicationId,
               "batches": [{"batch_id": b.batch_id, "rows": b.rows, "seconds": b.seconds, "attempts": b.attempts,
                            "skipped": b.skipped, "error": b.error, "version": b.version, "executors": b.executors,
                            "prequential": b.prequential, "lag": b.lag} for b in fit.batches],
               "progress": dataclasses.asdict(fit.progress(window=len(fit.batches) or 1))}
    from sparkdl_train.fs import FileSystem

    FileSystem(spark.sparkContext).replace_bytes(f"{output}/summary.json", json.dumps(summary, indent=1).encode())
    print(f"progress: {fit.progress()}", flush=True)
    print(f"trained {trained} events in {len(summary['batches'])} micro-batches; last version {fit.version}; "
          f"summary in {output}/summary.json", flush=True)
    return 1 if error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
