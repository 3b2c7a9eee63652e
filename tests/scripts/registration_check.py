"""Fits started right after a local-cluster session is created must wait for both executors to
register and train on both, with the default ``num_workers`` taken after that wait.

To make the race certain rather than likely, every executor JVM starts paused
(``-XX:+PauseAtStartup``: HotSpot waits until its pause file is removed) and is released only when
the fit says it is waiting for executors (a log handler on ``sparkdl_train.driver.registration``).
A fit that did not wait would plan on no executor at all and its tasks would land on whichever
registered first; a watchdog releases the executors after ``RELEASE_AFTER`` seconds anyway, so
such a fit ends (narrower) instead of hanging.

Each round creates a fresh ``local-cluster[2,1,1024]`` session and fits one engine at once
(averaging, the asynchronous parameter server, allreduce: in turn; twice each by default, the second
time a session started again in the same driver process). The pause makes every round meet the race,
so repeating a round adds no coverage, only minutes. Prints one RESULT line of
JSON: every fit's executors, workers, registration wait and whether the fit asked to wait before
its executors were released. Run by tests/spark/test_registration.py."""

import json
import logging
import os
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ENGINES = {
    "averaging": {"mode": "synchronous"},
    "asynchronous": {"mode": "asynchronous", "frequency": 4},
    "allreduce": {"mode": "allreduce"},
}
RELEASE_AFTER = 60.0


class Release(logging.Handler):
    """Removes the executors' pause file once the fit logs that it waits for them (or the watchdog
    fires), and keeps removing it until the session ends: an executor JVM that starts later creates
    it again."""

    def __init__(self, pause_file: str):
        super().__init__(logging.INFO)
        self.pause_file = pause_file
        self.asked = threading.Event()  # the fit said it waits for executors
        self.released = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("waiting for executors to register"):
            self.asked.set()
            self.released.set()

    def _run(self) -> None:
        self.released.wait(RELEASE_AFTER)
        self.released.set()
        while not self.done.is_set():
            try:
                os.remove(self.pause_file)
            except FileNotFoundError:
                pass
            self.done.wait(0.05)


def main(master: str, rounds: int) -> None:
    from helpers import digits_split, make_mlp
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel

    x, y, _, _ = digits_split()
    rows = list(zip(x, y))
    names = list(ENGINES)
    scratch = tempfile.mkdtemp(prefix="sparkdl_train-registration-")
    out = {"driver_pid": os.getpid(), "rounds": []}
    registration_log = logging.getLogger("sparkdl_train.driver.registration")
    registration_log.setLevel(logging.INFO)
    for i in range(rounds):
        pause_file = os.path.join(scratch, f"paused-{i}")
        release = Release(pause_file)
        registration_log.addHandler(release)
        started = time.monotonic()
        spark = (
            SparkSession.builder.master(master).appName(f"sparkdl_train-registration-{i}")
            .config("spark.ui.enabled", "false")
            .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", "512m")
            .config("spark.executor.extraJavaOptions",
                    f"-XX:+UnlockDiagnosticVMOptions -XX:+PauseAtStartup -XX:PauseAtStartupFile={pause_file}")
            .getOrCreate()
        )
        sc = spark.sparkContext
        sc.setLogLevel("ERROR")
        at_start = int(sc._jsc.sc().getExecutorIds().size())  # executors registered when the fit starts
        name = names[i % len(names)]
        sm = SparkModel(make_mlp(), **ENGINES[name])  # num_workers left to its default
        sm.fit(sc.parallelize(rows, 2), epochs=1, batch_size=64, verbose=0)
        parts = [p for e in sm.stats.epochs for p in e.partitions.values()]
        out["rounds"].append({
            "engine": name, "executors_at_start": at_start, "asked_to_wait": release.asked.is_set(),
            "executor_ids": sm.stats.executor_ids(), "num_workers": sm.stats.num_workers,
            "pids": sorted({p["pid"] for p in parts}), "registration": sm.stats.registration,
            "samples": sm.stats.epochs[0].samples, "seconds": round(time.monotonic() - started, 1),
        })
        spark.stop()
        release.done.set()
        registration_log.removeHandler(release)
    out["rows"] = len(rows)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,1024]", int(sys.argv[2]) if len(sys.argv) > 2 else len(ENGINES))
