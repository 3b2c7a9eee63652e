"""Kill one executor's Python worker (SIGKILL, by pid) in the middle of a fit, for each engine,
on local-cluster; print one RESULT line of JSON. Run by tests/cluster/test_faults.py.

The training data is an RDD whose partition 1, on its second pass (the second epoch), writes
its Python worker's pid to a file at row 300 and then waits; a driver thread kills that pid.
A marker file makes it happen once per fit, whichever attempt or stage retry comes next.
"""

import json
import os
import signal
import socket
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

EPOCHS = 3


def listening_sockets() -> set[int]:
    """Inodes of this process's listening TCP sockets."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(int(link[8:-1]))
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":  # LISTEN
                        listening.add(int(parts[9]))
        except OSError:
            pass
    return mine & listening


def sdt_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("sparkdl_train-") and t.is_alive())


def flaky_rdd(sc, x, y, workdir):
    rows = list(zip(x, y))

    def part(i):
        if i == 1:
            with open(os.path.join(workdir, "starts"), "a") as f:
                f.write("x\n")
        for k, r in enumerate(rows[i::2]):
            if i == 1 and k == 300 and not os.path.exists(os.path.join(workdir, "killed")):
                with open(os.path.join(workdir, "starts")) as f:
                    second_pass = len(f.read().split()) >= 2
                if second_pass:
                    open(os.path.join(workdir, "killed"), "w").close()
                    with open(os.path.join(workdir, "pid.tmp"), "w") as f:
                        f.write(str(os.getpid()))
                    os.rename(os.path.join(workdir, "pid.tmp"), os.path.join(workdir, "pid"))
                    time.sleep(120)  # killed long before this ends
            yield r

    return sc.parallelize(range(2), 2).flatMap(part)


def killer(workdir, record):
    deadline = time.monotonic() + 600
    path = os.path.join(workdir, "pid")
    while time.monotonic() < deadline and not record.get("stop"):
        if os.path.exists(path):
            pid = int(open(path).read())
            os.kill(pid, signal.SIGKILL)
            record.update(pid=pid, at=time.monotonic())
            return
        time.sleep(0.05)


class KillRankBetweenEpochs:
    """A Keras callback (built lazily: keras is imported by the fit) that, at the end of the first
    epoch, hands rank 1's Python worker pid to :func:`killer` (which kills it at once)."""

    def __new__(cls, sm, workdir):
        import keras

        class Kill(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 0:
                    pid = sm.stats.epochs[-1].partitions[1]["pid"]
                    with open(os.path.join(workdir, "pid.tmp"), "w") as f:
                        f.write(str(pid))
                    os.rename(os.path.join(workdir, "pid.tmp"), os.path.join(workdir, "pid"))
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline and _alive(pid):
                        time.sleep(0.05)

        return Kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def port_closed(address) -> bool:
    try:
        socket.create_connection(tuple(address), timeout=2).close()
        return False
    except OSError:
        return True


def fit_record(stats) -> dict:
    """What a fault case records of a fit's stats: samples, attempts and where each epoch's tasks
    ran, the engine's epoch retries, whether the parameter server's port is closed."""
    out: dict = {"driver_pid": os.getpid()}
    if stats is None:
        return out
    out["epoch_samples"] = [e.samples for e in stats.epochs]
    out["attempts"] = [{str(p): i.get("attempt", 0) for p, i in e.partitions.items()} for e in stats.epochs]
    out["pids"] = sorted({i["pid"] for e in stats.epochs for i in e.partitions.values()})
    out["executor_ids"] = stats.executor_ids()
    out["epoch_executors"] = [sorted({str(i.get("executor_id")) for i in e.partitions.values()}) for e in stats.epochs]
    server = stats.server or {}
    out["epoch_retries"] = server.get("epoch_retries")
    out["stages"] = server.get("stages")
    if "address" in server:
        out["server_port_closed"] = port_closed(server["address"])
    return out


def run_case(spark, name, make_sm, x, y, xt, yt, base):
    from helpers import make_mlp

    workdir = os.path.join(base, name)
    os.makedirs(workdir)
    listening_before = listening_sockets()
    record: dict = {}
    t = threading.Thread(target=killer, args=(workdir, record), daemon=True)
    t.start()
    model = make_mlp()
    sm = make_sm(model)
    start = time.monotonic()
    out = {"name": name}
    data, callbacks = flaky_rdd(spark.sparkContext, x, y, workdir), []
    if sm.config.allreduce.epochs_per_stage > 1:
        # a stage of several epochs reads its partitions once: kill rank 1 while it waits between epochs 1 and 2
        # (its task then fails in the ring of epoch 2, and the engine re-runs the stage from the driver's epoch 1)
        rows = list(zip(x, y))
        data = spark.sparkContext.parallelize(range(2), 2).flatMap(lambda i: rows[i::2])
        callbacks = [KillRankBetweenEpochs(sm, workdir)]
    try:
        hist = sm.fit(data, epochs=EPOCHS, batch_size=32, verbose=0, callbacks=callbacks)
        out.update(ok=True, epochs=len(hist.history["loss"]),
                   acc=model.evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"])
    except Exception as exc:  # noqa: BLE001
        out.update(ok=False, error_type=type(exc).__name__, error=str(exc)[:4000])
    out["seconds"] = time.monotonic() - start
    record["stop"] = True
    t.join(5)
    out["killed_pid"] = record.get("pid")
    out["seconds_after_kill"] = time.monotonic() - record["at"] if "at" in record else None
    out.update(fit_record(sm.stats))
    from helpers import settle

    settle(lambda: not sdt_threads(), 10)  # server threads end as the fit's context exits; give them a bounded moment
    out["threads_after"] = sdt_threads()
    out["new_listening_sockets"] = len(listening_sockets() - listening_before)
    return out


def main(master: str) -> None:
    import tempfile

    from pyspark.sql import SparkSession

    from sparkdl_train import SparkModel

    spark = (
        SparkSession.builder.master(master).appName("sparkdl_train-faults")
        .config("spark.ui.enabled", "false")
        .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "1g")
        .config("spark.task.maxFailures", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    from helpers import digits_split

    x, y, xt, yt = digits_split()

    cases = {
        "averaging": lambda m: SparkModel(m, num_workers=2, shuffle_buffer_size=128),
        "sync-ps": lambda m: SparkModel(m, mode="synchronous", frequency="batch", num_workers=2, shuffle_buffer_size=128),
        "async-ps": lambda m: SparkModel(m, mode="asynchronous", frequency=4, num_workers=2, shuffle_buffer_size=128),
        "hogwild-ps": lambda m: SparkModel(m, mode="hogwild", frequency="batch", num_workers=2, shuffle_buffer_size=128),
        "allreduce": lambda m: SparkModel(m, mode="allreduce", num_workers=2, allreduce_timeout=60, shuffle_buffer_size=128),
        "allreduce-no-retry": lambda m: SparkModel(m, mode="allreduce", num_workers=2, allreduce_timeout=60,
                                                   epoch_retries=0, shuffle_buffer_size=128),
        "allreduce-stage": lambda m: SparkModel(m, mode="allreduce", num_workers=2, allreduce_timeout=60,
                                                shuffle_buffer_size=128, epochs_per_stage=EPOCHS),
    }
    only = os.environ.get("FAULT_CASES")
    results = []
    with tempfile.TemporaryDirectory() as base:
        for name, make in cases.items():
            if only and name not in only.split(","):
                continue
            results.append(run_case(spark, name, make, x, y, xt, yt, base))
            print("CASE " + json.dumps(results[-1]), flush=True)
    print("RESULT " + json.dumps({"n": len(x), "cases": results}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local-cluster[2,1,2048]")
