"""Submitted by tests/cluster/test_yarn.py to the YARN mini cluster in client mode, with the shipped archive
(conf/spark-defaults.yarn.conf): the driver runs here, the tasks in YARN containers.

``engines``: the flagship job (``jobs/train_ctr.py``'s ``main`` on this application's session) once per engine
on the same Parquet data on HDFS, each writing its summary to ``<output>/<engine>/summary.json`` (one
application: the containers start and import TensorFlow once for all).

``killed``: what a notebook's driver sees when the application is killed under it (``yarn application
-kill``) during a long fit: the fit fails, and this process stays alive to report how long the failure
took, its message, and which of the fit's threads and listening sockets are left (``<output>/killed.json``).

``late``: submitted while one NodeManager has no room, so that YARN grants one of the two executors and holds
the other: a synchronous fit (its rounds need both workers at once) started then, and another once the test
gave the node its room back (``LATE WAITING`` tells it when); each fit's outcome, how long it took and where
it ran (``<output>/late.json``). Then, on the two executors it ends with (``LOST NODE FIT`` says when it
starts), an asynchronous fit of ``--lost-node-epochs`` during which the test stops the NodeManager of one
executor: where each epoch's tasks ran and the held-out AUC (``<output>/lost_node.json``); one application for
both, as the containers' start is most of each one's time.

``elastic``: submitted under dynamic allocation (one executor at first, two at most, idle ones released), its
data uncached: an asynchronous fit of four workers that starts on one executor and gets a second while its
tasks wait, loses one when both sit idle through a slow step between two epochs and gets another; then an
averaging fit and an allreduce fit (refused: barrier stages need their slots fixed). Each epoch's executors,
Spark's record of when each executor came and went, and the outcomes (``<output>/elastic.json``).

``memory``: submitted with containers too small for TensorFlow: the job's start (its executors' check) or its
asynchronous fit meets a container killed by its NodeManager for its memory; what the job reports, when, and
the cause it was given (``<output>/memory.json``).
"""

import argparse
import json
import os
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from jobfiles import load_job

from sparkdl_train.driver.submit import start_job

# (name, train_ctr.py arguments): every engine (docs/engines.md)
ENGINES = [
    ("averaging", ["--mode", "synchronous", "--frequency", "epoch"]),
    ("synchronous_ps", ["--mode", "synchronous", "--frequency", "4"]),
    ("hogwild", ["--mode", "hogwild"]),
    ("allreduce_ring", ["--mode", "allreduce"]),  # the job's default: the state averaged through the ring each epoch
    ("allreduce_batch", ["--mode", "allreduce", "--frequency", "batch"]),
]


def listening_ports(pid: int) -> list[int]:
    """TCP ports this process listens on (its sockets' inodes in /proc/net/tcp*, state LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def engines(spark, args, out_dir: str) -> None:
    ctr = load_job("train_ctr")
    for name, extra in ENGINES:
        ctr.main(["--data", args.data, "--epochs", str(args.epochs), "--workers", "2", *extra,
                  "--output", os.path.join(out_dir, name)], spark=spark)


def features(spark, data: str, cache: bool = True):
    """The job's feature tables from the CTR data (train in two partitions cached on the executors, or as read
    and uncached), test, and the model."""
    from pyspark.sql import functions as F

    from sparkdl_train.datasets import ctr as ctr_data
    from sparkdl_train.models.ctr import build_vocabulary, ctr_features

    df = spark.read.parquet(data)
    is_test = F.pmod(F.xxhash64(F.col("id"), F.lit(42)), F.lit(1000)) < F.lit(100)
    vocab = build_vocabulary(df.where(~is_test), ctr_data.CAT_COLS, min_count=5, max_size=65536)
    train, test = (ctr_features(d, ctr_data.DENSE_COLS, ctr_data.CAT_COLS, vocab, ["label"])
                   for d in (df.where(~is_test), df.where(is_test)))
    if cache:
        train = train.repartition(2).cache()
        train.count()
    return train, test, new_model(vocab.size)


def new_model(vocab_size: int):
    from sparkdl_train.models.ctr import MODELS

    return MODELS["deepfm"](vocab_size=vocab_size, embed_dim=8, hidden=(64, 32), learning_rate=0.002)


COLUMNS = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}


def killed(spark, args, out_dir: str) -> None:
    from sparkdl_train import SparkModel

    train, _, model = features(spark, args.data)
    before_threads = {t.name for t in threading.enumerate()}
    before_ports = listening_ports(os.getpid())
    sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2)
    print(f"APPLICATION {spark.sparkContext.applicationId}", flush=True)
    out = {"application_id": spark.sparkContext.applicationId}
    started = time.monotonic()
    try:
        sm.fit(train, epochs=args.epochs, batch_size=512, verbose=1, **COLUMNS)
        out["error"] = None
    except BaseException as exc:  # what the notebook's cell shows
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    out["failed_at"] = time.time()
    out["fit_seconds"] = time.monotonic() - started
    out["epochs_done"] = len(sm.stats.epochs)
    time.sleep(2)  # servers' threads given a moment to end after the fit's cleanup
    out["threads_left"] = sorted({t.name for t in threading.enumerate()} - before_threads)
    out["ports_left"] = sorted(set(listening_ports(os.getpid())) - set(before_ports))
    with open(os.path.join(out_dir, "killed.json"), "w") as f:
        json.dump(out, f, indent=2)


def lost_node(spark, train, test, model, epochs: int, out_dir: str) -> None:
    """An asynchronous fit during which the test stops a NodeManager: where each epoch's tasks ran, the
    rows each epoch trained on, and the held-out AUC at the end."""
    from sparkdl_train import SparkModel
    from sparkdl_train.driver.submit import where_it_ran

    sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2)
    print("LOST NODE FIT", flush=True)
    sm.fit(train, epochs=epochs, batch_size=512, verbose=1, **COLUMNS)
    logs = sm.evaluate(test, batch_size=4096, return_dict=True, **COLUMNS)
    out = {**where_it_ran(spark, sm.stats), "auc": logs["auc"], "train_rows": train.count(),
           "epochs": [{"samples": e.samples,
                       "containers": sorted({i.get("container") for i in e.partitions.values()}),
                       "nodemanagers": sorted({i.get("nodemanager") for i in e.partitions.values()})} for e in sm.stats.epochs]}
    with open(os.path.join(out_dir, "lost_node.json"), "w") as f:
        json.dump(out, f, indent=2)


def late(spark, args, out_dir: str) -> None:
    from sparkdl_train import SparkModel
    from sparkdl_train.driver.submit import where_it_ran

    print(f"APPLICATION {spark.sparkContext.applicationId}", flush=True)
    train, test, first = features(spark, args.data)
    vocab = first.get_layer("field_embedding").input_dim
    out = {"executors_at_start": spark.sparkContext._jsc.sc().getExecutorIds().size()}
    for name in ("held", "granted"):
        if name == "granted":
            print("LATE WAITING", flush=True)  # the test gives the node its room back now
        model = first if name == "held" else new_model(vocab)
        sm = SparkModel(model, mode="synchronous", frequency=4, num_workers=2)
        started = time.monotonic()
        try:
            sm.fit(train, epochs=args.epochs, batch_size=512, verbose=1, **COLUMNS)
            logs = sm.evaluate(test, batch_size=4096, return_dict=True, **COLUMNS)
            out[name] = {"error": None, "auc": logs["auc"], **where_it_ran(spark, sm.stats)}
        except Exception as exc:  # noqa: BLE001 - what the person sees
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out[name]["seconds"] = time.monotonic() - started
    with open(os.path.join(out_dir, "late.json"), "w") as f:
        json.dump(out, f, indent=2)
    if args.lost_node_epochs:
        lost_node(spark, train, test, new_model(vocab), args.lost_node_epochs, out_dir)


def executor_timeline(sc) -> dict[str, dict]:
    """Spark's record of this application's executors (the driver's status store): when each came, when and why
    it went (epoch seconds)."""
    out = {}
    executors = sc._jsc.sc().statusStore().executorList(False)
    for i in range(executors.size()):
        e = executors.apply(i)
        if e.id() == "driver":
            continue
        removed = e.removeTime()
        reason = e.removeReason()
        out[str(e.id())] = {"added": e.addTime().getTime() / 1000,
                            "removed": removed.get().getTime() / 1000 if removed.isDefined() else None,
                            "reason": str(reason.get()) if reason.isDefined() else None}
    return out


def _wait_for(what: str, condition, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def elastic(spark, args, out_dir: str) -> None:
    import keras

    from sparkdl_train import SparkModel
    from sparkdl_train.errors import ConfigError

    sc = spark.sparkContext
    print(f"APPLICATION {sc.applicationId}", flush=True)
    train, test, model = features(spark, args.data, cache=False)  # nothing cached: any executor may be released

    def active() -> list[str]:
        return sorted(k for k, v in executor_timeline(sc).items() if v["removed"] is None)

    out = {"application_id": sc.applicationId, "train_rows": train.count()}
    # the session's first executor only (minExecutors): what a fit started in a quiet notebook finds
    out["settle_seconds"] = _wait_for("one executor left", lambda: len(active()) == 1, 120)
    out["before_fit"] = active()

    class SlowStep(keras.callbacks.Callback):
        """A step of the driver's own after the second epoch (a slow checkpoint, a validation elsewhere), long
        enough for dynamic allocation to release an idle executor (nothing cached on it)."""

        def on_epoch_end(self, epoch, logs=None):
            present = set(active())
            if epoch == 1 and len(present) > 1:
                out["release_wait"] = _wait_for("an idle executor released", lambda: not present <= set(active()), 120)
                out["released_in_step"] = sorted(present - set(active()))

    fits = {}
    for name, mode, frequency, epochs, callbacks in (("asynchronous", "asynchronous", 4, 4, [SlowStep()]),
                                                     ("averaging", "synchronous", "epoch", 2, [])):
        # four workers' tasks for one executor's core: they wait long enough for Spark to add an executor
        sm = SparkModel(model, mode=mode, frequency=frequency, num_workers=4)
        started = time.time()
        sm.fit(train, epochs=epochs, batch_size=64, callbacks=callbacks, verbose=1, **COLUMNS)
        logs = sm.evaluate(test, batch_size=4096, return_dict=True, **COLUMNS)
        fits[name] = {"started": started, "ended": time.time(), "auc": logs["auc"],
                      "epochs": [{"samples": e.samples, "executors": e.executors} for e in sm.stats.epochs]}
    out["fits"] = fits
    sm = SparkModel(model, mode="allreduce", num_workers=2)
    started = time.monotonic()
    try:
        sm.fit(train, epochs=1, batch_size=64, verbose=0, **COLUMNS)
        out["allreduce"] = {"error": None}
    except ConfigError as exc:
        out["allreduce"] = {"error": str(exc)}
    out["allreduce"]["seconds"] = time.monotonic() - started
    out["executors"] = executor_timeline(sc)
    with open(os.path.join(out_dir, "elastic.json"), "w") as f:
        json.dump(out, f, indent=2)


def memory(spark, args, out_dir: str) -> None:
    """Containers too small for the executors' TensorFlow: the session's start is ours (``start_job`` is the
    step under test: its executors' check may be where the first container is killed)."""
    from sparkdl_train.failures import classify

    print(f"APPLICATION {spark.sparkContext.applicationId}", flush=True)
    out = {"application_id": spark.sparkContext.applicationId, "stage": "start"}
    started = time.monotonic()
    try:
        start_job("sparkdl_train-yarn-memory", out_dir, spark=spark)
        from sparkdl_train import SparkModel

        train, _, _ = features(spark, args.data)
        out["stage"], fit_started = "fit", time.monotonic()
        # the model a person sized for the data, with an embedding table of --embedding-rows (ids hashed
        # into a big table): its weights, their optimizer slots and the fit's copies outgrow the container
        model = new_model(args.embedding_rows)
        sm = SparkModel(model, mode="asynchronous", frequency=4, num_workers=2)
        sm.fit(train, epochs=args.epochs, batch_size=512, verbose=1, **COLUMNS)
        out["error"] = None
    except BaseException as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["error_type"] = type(exc).__name__
        failure = classify(exc)  # Spark's own error (the data preparation's jobs), or the fit's WorkerError's cause
        out["cause"] = failure.cause.value if failure else getattr(exc, "cause", None)
        out["traceback"] = traceback.format_exc()[-4000:]
    out["seconds"], out["failed_at"] = time.monotonic() - started, time.time()
    out["fit_seconds"] = time.monotonic() - fit_started if out["stage"] == "fit" else None
    with open(os.path.join(out_dir, "memory.json"), "w") as f:
        json.dump(out, f, indent=2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["engines", "killed", "late", "memory", "elastic"])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--output", required=True)
    p.add_argument("--embedding-rows", type=int, default=4_000_000)
    p.add_argument("--lost-node-epochs", type=int, default=0, help="late: then a fit that loses a node (0: none)")
    args = p.parse_args()
    if args.what == "memory":  # its own start_job is under test
        from sparkdl_train.driver.submit import submitted_session

        os.makedirs(args.output, exist_ok=True)
        spark = submitted_session("sparkdl_train-yarn-memory")
        memory(spark, args, os.path.abspath(args.output))
        spark.stop()
        return
    spark, _, out_dir = start_job(f"sparkdl_train-yarn-{args.what}", args.output)
    {"engines": engines, "killed": killed, "late": late, "elastic": elastic}[args.what](spark, args, out_dir)
    if args.what != "killed":
        spark.stop()


if __name__ == "__main__":
    main()
