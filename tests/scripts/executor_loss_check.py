"""Lose an executor JVM, or a whole node, in the middle of a fit on the standalone cluster, for
each engine; write the measurements to ``OUT/loss.json``. Submitted by tests/cluster/test_executor_loss.py
with ``spark-submit --master spark://...`` and the executors' environment installed on the nodes.

The training data is a cached DataFrame, read through a paced ``mapInArrow`` (:func:`pacer`). A
driver-side callback fires on the first live report of the second epoch and picks the
application's executor with the lowest id:

* ``executor``: SIGKILL to that executor's JVM (its Python daemon and workers die with it, and
  so do the cached partitions it held); the Worker stays, and the Master starts a replacement
  executor on it;
* ``node``: SIGKILL to the process group of the Worker daemon that launched it (the Worker and
  every executor it runs): the node is gone. The test replaces a lost Worker with a new one as a
  cluster manager would, so that the engines needing two slots at once (the barrier stage) can
  go on.

For each case it records the fit's outcome, its per-epoch sample counts and attempts, the time
from the kill to the end of the fit, the threads and listening sockets left, and whether the
cached partitions came back.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EPOCHS = 3
COPIES = 4  # the digits four times
PACE = (32, 0.01)  # the fit reads its rows 32 at a time, 10 ms apart: an epoch's task runs about 0.9 s
TASK_SECONDS = 0.9


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _executor_jvm() -> int:
    """The executor JVM above this Python worker (worker -> pyspark daemon -> executor)."""
    pid = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if "CoarseGrainedExecutorBackend" in _cmdline(pid):
            return pid
    return 0


def pacer(marks: str):
    """mapInArrow function between the cached DataFrame and the fit: the rows come slowly, so every
    epoch's tasks run long after their first live report and the kill lands in a running task (a
    warm epoch of these rows takes under the report interval, and its only report can be its last).

    While it yields, a task keeps a mark in ``marks`` named after its executor's JVM pid: the loss
    callback picks its victim among the executors running a task now, which Spark's status store
    cannot say (it lags task starts and ends by up to a second, longer than a task here)."""

    def paced(batches):
        from pyspark import TaskContext

        rows, pause = PACE
        ctx = TaskContext.get()
        mark = os.path.join(marks, f"{_executor_jvm()}-{ctx.stageId()}-{ctx.partitionId()}-{ctx.attemptNumber()}")
        with open(mark, "w"):
            pass
        try:
            for batch in batches:
                for start in range(0, batch.num_rows, rows):
                    time.sleep(pause)
                    yield batch.slice(start, rows)
        finally:
            os.unlink(mark)

    return paced


def app_executors(app_id: str) -> dict[str, int]:
    """This application's live executor JVMs on this host: executor id -> pid."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        cmd = _cmdline(int(name)).split()
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and app_id in cmd:
            found[cmd[cmd.index("--executor-id") + 1]] = int(name)
    return found


def worker_daemon(executor_pid: int) -> int:
    """The Worker JVM that launched ``executor_pid``."""
    pid = executor_pid
    while pid > 1:
        pid = _parent(pid)
        if "org.apache.spark.deploy.worker.Worker" in _cmdline(pid):
            return pid
    raise RuntimeError(f"no Worker daemon above executor pid {executor_pid}")


def cached_partitions(spark) -> int:
    infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
    return sum(i.numCachedPartitions() for i in infos)


def running_executors(marks: str, fresh: float) -> set[int]:
    """JVM pids of the executors running a paced task that started under ``fresh`` seconds ago (so
    most of it is still to run when the kill lands)."""
    now = time.time()
    found = set()
    for name in os.listdir(marks):
        try:
            age = now - os.stat(os.path.join(marks, name)).st_mtime
        except FileNotFoundError:  # the task ended meanwhile
            continue
        if age < fresh:
            found.add(int(name.split("-")[0]))
    return found


def make_loss(kind: str, spark, record: dict, marks: str, barrier: bool):
    import keras

    class Lose(keras.callbacks.Callback):
        """On the first live report of epoch 2, lose the lowest-numbered executor (or its node) that is
        running one of the epoch's tasks, started under half a task's time ago. Not simply the
        lowest-numbered: an epoch's two tasks need not start together, and one that has already
        finished loses only its cached partition, so nothing is retried (CI runs failed on that, and
        on picking by Spark's status store, whose running-task counts lag). A ``barrier`` stage's
        tasks run from their common start to the last ring step: every executor runs one (and the
        allreduce engine reads its own copy of the data, not the paced one)."""

        epoch = -1

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch != 1 or "at" in record:
                return
            executors = app_executors(spark.sparkContext.applicationId)
            if barrier:
                running = list(executors)
            else:
                # a task under half its time in, else (a report that came late: CI at d204887 saw none in
                # time on a loaded machine, and nothing was killed) one still running with a fifth to go
                busy = running_executors(marks, fresh=TASK_SECONDS / 2) or running_executors(marks, fresh=TASK_SECONDS * 0.8)
                running = [e for e, pid in executors.items() if pid in busy]
            if not running:
                return  # the next report
            victim = min(running, key=int)
            pid = executors[victim]
            record.update(executor_id=victim, executor_pid=pid, cached_before=cached_partitions(spark), batch=batch)
            if kind == "executor":
                os.kill(pid, signal.SIGKILL)
            else:
                worker = worker_daemon(pid)
                group = os.getpgid(worker)
                assert group != os.getpgid(0), "the Worker shares this driver's process group"
                record.update(worker_pid=worker)
                os.killpg(group, signal.SIGKILL)
            record["at"] = time.monotonic()

    return Lose()


def run_case(spark, data, name, kind, make_sm, n, xt, yt, marks):
    from fault_check import fit_record, listening_sockets, sdt_threads
    from helpers import make_mlp, settle

    listening_before = listening_sockets()
    record: dict = {}
    model = make_mlp()
    sm = make_sm(model)
    out = {"name": name, "kind": kind, "engine": name.split("/")[0]}
    start = time.monotonic()
    try:
        callbacks = [make_loss(kind, spark, record, marks, barrier=name.startswith("allreduce"))] if kind != "none" else []
        hist = sm.fit(data, epochs=EPOCHS, batch_size=16, verbose=0, feature_cols="features", label_col="label",
                      callbacks=callbacks)
        out.update(ok=True, epochs=len(hist.history["loss"]),
                   acc=model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])
    except Exception as exc:  # noqa: BLE001
        out.update(ok=False, error_type=type(exc).__name__, error=str(exc)[:4000], cause=getattr(exc, "cause", None))
    end = time.monotonic()
    out["seconds"] = end - start
    out.update({k: v for k, v in record.items() if k != "at"})
    out["seconds_after_kill"] = end - record["at"] if "at" in record else None
    out.update(fit_record(sm.stats))
    out["n"] = n
    settle(lambda: not sdt_threads(), 10)
    out["threads_after"] = sdt_threads()
    out["new_listening_sockets"] = len(listening_sockets() - listening_before)
    out["cached_after"] = cached_partitions(spark)
    return out


def main(out_dir: str, only: str | None) -> None:
    import numpy as np
    from helpers import digits_split
    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel

    spark = SparkSession.builder.appName("sparkdl_train-executor-loss").getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    # between the paced mapInArrow and the fit's, Spark regroups rows into Arrow batches of this many:
    # at its default (10,000) the fit would see a partition only once all of it had been paced
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(PACE[0]))
    x, y, xt, yt = digits_split()
    x, y = np.tile(x, (COPIES, 1)), np.tile(y, COPIES)
    df = spark.createDataFrame([(r.tolist(), int(label)) for r, label in zip(x, y)], "features array<float>, label long")
    df = df.coalesce(2).cache()
    assert df.count() == len(x)
    marks = os.path.join(out_dir, "running")
    os.makedirs(marks, exist_ok=True)
    data = df.mapInArrow(pacer(marks), df.schema)  # the cache stays below it: a lost executor loses cached partitions

    common = dict(num_workers=2, shuffle_buffer_size=256)
    engines = {
        "averaging": lambda m: SparkModel(m, **common),
        "sync-ps": lambda m: SparkModel(m, mode="synchronous", frequency="batch", **common),
        "async-ps": lambda m: SparkModel(m, mode="asynchronous", frequency=4, **common),
        "hogwild-ps": lambda m: SparkModel(m, mode="hogwild", frequency="batch", **common),
        "allreduce": lambda m: SparkModel(m, mode="allreduce", allreduce_timeout=120, **common),
        "allreduce-no-retry": lambda m: SparkModel(m, mode="allreduce", allreduce_timeout=120, epoch_retries=0, **common),
    }
    plan = [(e, k) for e in engines for k in ("executor", "node") if not (e == "allreduce-no-retry" and k == "node")]
    results = []
    for engine, kind in plan:
        name = f"{engine}/{kind}"
        if only and name not in only.split(","):
            continue
        results.append(run_case(spark, data, name, kind, engines[engine], len(x), xt, yt, marks))
        print("CASE " + json.dumps(results[-1]), flush=True)
    # the session still trains normally after all of it
    after = run_case(spark, data, "after/none", "none", engines["sync-ps"], len(x), xt, yt, marks)
    pythons = spark.sparkContext.parallelize(range(4), 4).map(lambda _: sys.executable).distinct().collect()
    with open(os.path.join(out_dir, "loss.json"), "w") as f:
        json.dump({"n": len(x), "cases": results, "after": after, "executor_pythons": pythons}, f)
    spark.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    out = args[args.index("--output") + 1]
    only = args[args.index("--cases") + 1] if "--cases" in args else None
    main(out, only)
