"""Click events for jobs/stream_ctr.py: the planted-model CTR rows (sparkdl_train.datasets.ctr) written to a Kafka
topic at a chosen rate, optionally with drift (the planted model changes after ``--drift-at`` events).

    ./run kafka generate --topic clicks --rate 2000 --rows 400000 --drift-at 200000

Each event's value is one CSV line: ``id, I1..I13, C1..C26, label, p_true, regime`` (``p_true``: the planted click
probability, an oracle column for judging the model, never a feature; ``regime``: 0 before the drift, 1 after);
its key the id. The topic is created with ``--partitions`` if it does not exist. Prints one line per second
sent and exits after ``--rows`` events (never with none: the job's reader waits).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from sparkdl_train.datasets import ctr


def csv_lines(cols: dict[str, np.ndarray]) -> list[bytes]:
    names = ["id", *ctr.DENSE_COLS, *ctr.CAT_COLS, "label", "p_true", "regime"]
    fmt = ",".join(["%d", *["%g"] * len(ctr.DENSE_COLS), *["%d"] * len(ctr.CAT_COLS), "%d", "%.6f", "%d"])
    table = np.empty((len(cols["id"]), len(names)), dtype=object)
    for j, n in enumerate(names):
        table[:, j] = cols[n]
    return [(fmt % tuple(row)).encode() for row in table]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kafka", required=True, help="bootstrap servers, host:port")
    p.add_argument("--topic", default="clicks")
    p.add_argument("--partitions", type=int, default=2, help="partitions of the topic when it is created here")
    p.add_argument("--rate", type=float, default=2000.0, help="events per second (0: as fast as possible)")
    p.add_argument("--rows", type=int, default=400_000, help="events to send")
    p.add_argument("--start", type=int, default=0, help="the first event's id (a multiple of 4096)")
    p.add_argument("--seed", type=int, default=42, help="the planted model's seed (the data's)")
    p.add_argument("--drift-at", type=int, dest="drift_at", help="events from this id on are clicked as another planted model")
    a = p.parse_args(argv)
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    if a.start % ctr.BLOCK_ROWS:
        p.error(f"--start must be a multiple of {ctr.BLOCK_ROWS}")
    admin = KafkaAdminClient(bootstrap_servers=a.kafka, request_timeout_ms=30_000)
    try:
        admin.create_topics([NewTopic(a.topic, a.partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    spec = ctr.CTRSpec(rows=a.start + a.rows, seed=a.seed)
    planted = ctr.PlantedModel.make(spec)
    drifted = ctr.PlantedModel.make(ctr.CTRSpec(rows=spec.rows, seed=a.seed + 1000)) if a.drift_at is not None else None
    logging.getLogger("kafka").setLevel(logging.ERROR)  # the client's event-loop notices on a busy machine
    producer = KafkaProducer(bootstrap_servers=a.kafka, linger_ms=20, acks=1, enable_idempotence=False)
    started, sent, reported = time.monotonic(), 0, 0.0
    try:
        for block in range(a.start // ctr.BLOCK_ROWS, -(-spec.rows // ctr.BLOCK_ROWS)):
            cols = ctr.event_block(planted, block, drifted, a.drift_at)
            for key, line in zip(cols["id"], csv_lines(cols)):
                producer.send(a.topic, key=str(int(key)).encode(), value=line)
                sent += 1
                if a.rate > 0:
                    ahead = sent / a.rate - (time.monotonic() - started)
                    if ahead > 0.005:
                        time.sleep(ahead)
                now = time.monotonic() - started
                if now - reported >= 1.0:
                    reported = now
                    print(f"sent {sent} events ({sent / max(now, 1e-9):.0f}/s)", flush=True)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    print(f"sent {sent} events in {time.monotonic() - started:.1f} s to {a.topic}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
