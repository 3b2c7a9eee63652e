"""fit_stream on a real Kafka broker (minicluster/kafka.py, as `./run kafka up` starts it): jobs/ctr_events.py
fills a topic with planted-model click events, jobs/stream_ctr.py trains on it under `./run submit` as the README
writes it. Its driver is SIGKILLed (spark-submit's whole process group: JVM, Python driver, workers) after two
trained micro-batches and the same command is run again until the topic is drained: every event is trained once,
in micro-batches no larger than maxOffsetsPerTrigger, none twice, none skipped."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT

from minicluster.kafka import KafkaBroker, connector_jars

EVENTS = 6 * 4096
MAX_OFFSETS = 4096  # maxOffsetsPerTrigger: at most this many events a micro-batch
TRAINED = re.compile(r"fit_stream: micro-batch (\d+): (\d+) rows in")  # sparkdl_train's log line of a trained micro-batch
BATCH = re.compile(r"^batch (\d+): (\d+) rows in [\d.]+ s, prequential AUC (\S+), lag (\S+), version ([^,\s]+)(, skipped \((\w+)\))?")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = KafkaBroker(str(tmp_path_factory.mktemp("kafka"))).start()
    try:
        yield b
    finally:
        b.stop()
        assert not b.alive()


def _batches(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        m = BATCH.match(line)
        if m:
            out.append({"id": int(m.group(1)), "rows": int(m.group(2)), "auc": None if m.group(3) == "-" else float(m.group(3)),
                        "lag": None if m.group(4) == "None" else int(m.group(4)), "skipped": m.group(7)})
    return out


def test_a_stream_job_whose_driver_is_killed_trains_every_kafka_event_once_after_a_restart(broker, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    gen = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "ctr_events.py"), "--kafka", broker.bootstrap,
                          "--topic", "clicks", "--partitions", "2", "--rate", "0", "--rows", str(EVENTS)],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert gen.returncode == 0 and f"sent {EVENTS} events" in gen.stdout, gen.stdout[-2000:] + gen.stderr[-3000:]
    out = tmp_path / "stream"
    job = [os.path.join(ROOT, "run"), "submit", "--master", "local[2]", "--jars", ",".join(connector_jars()),
           "jobs/stream_ctr.py", "--kafka", broker.bootstrap, "--topic", "clicks", "--output", str(out),
           "--max-offsets", str(MAX_OFFSETS), "--publish-every", "2", "--learning-rate", "0.01", "--timeout", "600"]

    # first driver: killed once it reported two trained micro-batches (the next one may be under way)
    log = tmp_path / "first.log"
    with open(log, "w") as f:
        first = subprocess.Popen([*job, "--trigger", "1 second"], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len([b for b in _batches(log.read_text()) if b["rows"]]) < 2:
            assert first.poll() is None, f"the job ended before it was killed:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    before = _batches(log.read_text())

    # the same command again, draining the topic (availableNow), then stopping
    second = subprocess.run([*job, "--trigger", "available-now"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-6000:]
    after = _batches(second.stdout)
    s = json.loads((out / "summary.json").read_text())
    assert [b["batch_id"] for b in s["batches"]] == [b["id"] for b in after] and s["error"] is None, (s, after)

    # what the first driver trained: sparkdl_train logs a micro-batch once it has committed it; the job prints it only
    # a poll after that (and after Spark's progress report), so the kill can come between the two
    first_trained = {int(m.group(1)): int(m.group(2)) for m in TRAINED.finditer(log.read_text())}
    shown = {b["id"]: b for b in before}  # the prequential AUC of those it printed
    committed_first = [{"id": i, "rows": r, "skipped": None, "auc": shown.get(i, {}).get("auc")} for i, r in sorted(first_trained.items())]
    printed = [b["id"] for b in before if b["rows"]]
    assert printed == [b["id"] for b in committed_first][:len(printed)], (before, first_trained)
    # a micro-batch Spark runs again was one the first driver had committed
    assert {b["id"] for b in after if b["skipped"] == "committed"} <= set(first_trained), (after, first_trained)
    trained = committed_first + [b for b in after if b["rows"] and not b["skipped"]]
    ids = [b["id"] for b in trained]
    assert ids == list(range(ids[0], ids[0] + len(ids))), (before, after)  # no micro-batch trained twice or skipped
    assert sum(b["rows"] for b in trained) == EVENTS, (before, after)  # every event once
    assert all(0 < b["rows"] <= MAX_OFFSETS for b in trained), trained  # maxOffsetsPerTrigger respected
    assert len(before) >= 2 and after, (before, after)
    # the restarted driver replayed nothing the first one had committed: a replayed micro-batch is skipped
    assert all(b["skipped"] == "committed" for b in after if b["id"] <= before[-1]["id"]), (before, after)

    # lag (offsets behind the topic's end after each micro-batch, Spark's Kafka metric): falls to 0 as it drains
    lags = [b["lag"] for b in after if b["lag"] is not None]
    assert lags and lags[-1] == 0 and lags == sorted(lags, reverse=True), after
    # the restarted driver's summary of what it trained (StreamFit.progress over all its micro-batches)
    p = s["progress"]
    assert p["lag"] == 0 and p["trained_rows"] == sum(b["rows"] for b in after if b["rows"] and not b["skipped"]), p
    assert p["rows_per_second"] > 0 and p["committed"] == ids[-1] and p["failed_attempts"] == 0, p
    # the newest version has seen the whole topic: its offsets are the topic's end
    latest = json.loads((out / "versions" / "LATEST").read_text())
    assert latest["batch_id"] == ids[-1] or s["version"] == latest["version"], (latest, s["version"])
    ends = latest["offsets"][-1] if isinstance(latest["offsets"], list) else latest["offsets"]
    ends = json.loads(ends) if isinstance(ends, str) else ends
    if latest["batch_id"] == ids[-1]:
        assert sum(ends["clicks"].values()) == EVENTS, latest
    # prequential: each micro-batch scored before training on it; the model learns as the stream goes
    # (every micro-batch a driver printed has its score; one trained just before the kill was never printed)
    aucs = [b["auc"] for b in trained if b["id"] in shown or b in after]
    assert all(a is not None for a in aucs) and max(aucs[-2:]) > aucs[0] + 0.05, aucs
