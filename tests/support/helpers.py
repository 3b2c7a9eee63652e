"""Test helpers shared by the test modules and the scripts they start (tests/support is on pytest's
``pythonpath``, and on PYTHONPATH for every process the tests start: tests/conftest.py)."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

from bench.workloads.digits import digits_split, make_mlp  # noqa: F401 - the workload benches and tests share

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
SCRIPTS = os.path.join(TESTS, "scripts")  # what tests start in processes of their own
REFERENCE_EPOCHS = 12
DAEMON = "sparkdl_train.worker.daemon"  # what ./run job and the shipped conf files use

# Every JVM the tests start (the session's driver, spark-submit jobs, local-cluster executors, the
# standalone Master, Workers and executors) is short-lived and small: C1 only and the serial
# collector start one with about 40% less CPU (a local-cluster session: 35 -> 20 CPU-seconds; a
# share of the default suite: 119 -> 83), and the suites are CPU-bound on 2 cores (docs/testing.md).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def digits_frame(spark, x, y, parts=2):
    """Digits rows as a DataFrame: ``id``, ``features`` (an array of doubles), ``label``."""
    import numpy as np
    import pandas as pd

    pdf = pd.DataFrame({"id": np.arange(len(x)), "features": list(x.astype("float64")), "label": y.astype("float64")})
    return spark.createDataFrame(pdf).repartition(parts)


def settle(condition, timeout=10.0, interval=0.02):
    """Poll ``condition()`` until it is true or ``timeout`` seconds have passed; returns its last
    value (the caller asserts, or records, what it found)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def run_ranks(size, fn, timeout=60):
    """Run ``fn(rank)`` on ``size`` threads at once (ranks of a ring without Spark); returns
    ``(results, errors)`` by rank and fails if a rank is still running after ``timeout``."""
    out, errs = [None] * size, [None] * size

    def work(r):
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001
            errs[r] = exc

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out, errs


def poke_listener(groups, data, rank=1):
    """During the rendezvous of the thread ranks ``groups``, connect to rank ``rank``'s listener
    before the ring forms, send ``data`` and read until it closes. Returns a list that receives
    what the listener sent back before closing."""
    original = groups[0].all_gather
    answers = []

    def gather_and_poke(message):
        out = original(message)
        port = json.loads(out[rank])["port"]
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(data)
            s.settimeout(10)
            got = b""
            try:
                while chunk := s.recv(4096):
                    got += chunk
            except ConnectionResetError:
                pass
            answers.append(got)
        return out

    groups[0].all_gather = gather_and_poke
    return answers


def wait_until(condition, timeout=10.0, what="the condition", interval=0.02):
    """:func:`settle`, failing after ``timeout`` seconds: tests synchronise on state, never on a fixed sleep."""
    value = settle(condition, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value


@contextlib.contextmanager
def spark_conf(sc, key, value):
    """``key`` set to ``value`` on the running context's conf (what ``--conf`` would have set),
    removed again on the way out."""
    sc._conf.set(key, value)
    try:
        yield
    finally:
        sc._conf._jconf.remove(key)


def epoch_rendezvous(directory, parties, timeout=120.0):
    """A function for an RDD's tasks that blocks an epoch's task until ``parties`` tasks of that job
    have called it (a file each in ``directory``), so that their parameter-server sessions overlap
    whatever each spent before (a cold Python worker importing TensorFlow, a slot still held by an
    earlier test's task). Tasks of other jobs (the driver's sample) pass straight through. A closure,
    so that cloudpickle ships it by value (this module is not importable on the workers)."""

    def meet():
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if "epoch" not in (ctx.getLocalProperty("spark.job.description") or ""):
            return
        open(os.path.join(directory, f"{ctx.partitionId()}-{ctx.attemptNumber()}"), "w").close()
        deadline = time.monotonic() + timeout
        while len(os.listdir(directory)) < parties:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {os.listdir(directory)} of {parties} tasks started")
            time.sleep(0.01)

    return meet


def failing_rdd(sc, x, y, at, message, partition=1):
    """An RDD of (x, y) in two partitions whose `partition` raises RuntimeError(message) at row `at`."""
    rows = list(zip(x, y))

    def part(i):
        for k, r in enumerate(rows[i::2]):
            if i == partition and k == at:
                raise RuntimeError(message)
            yield r

    return sc.parallelize(range(2), 2).flatMap(part)


def run_check_script(script, master="local-cluster[2,1,2048]", timeout=900):
    """Run ``tests/<script>`` in its own driver process on ``master``; returns its RESULT JSON."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), master],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


# a job under jobs/: (its summary file, what it prints); a test's own script writes summary.json
_SUBMITTED = {"train_ctr.py": ("summary.json", ("test AUC", "Bayes-optimal")),
              "train_images.py": ("images_summary.json", ("test accuracy",))}


def spark_submit(master, args, out, conf=(), archives=None, timeout=1200, job="train_ctr.py"):
    """``spark-submit [--master MASTER] jobs/JOB ARGS --output OUT`` (``JOB`` a path: that script, a
    test's own); returns (output, the job's summary JSON).

    With ``archives`` the executors run ``./environment/bin/python`` from that archive, as on a real
    cluster; otherwise this venv's Python (PYSPARK_PYTHON)."""
    cmd, env = submit_command(master, args, out, conf, archives, job)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    summary, printed = _SUBMITTED.get(job, ("summary.json", ()))
    for line in printed:
        assert line in proc.stdout, (line, proc.stdout[-3000:])
    with open(os.path.join(str(out), summary)) as f:
        return proc.stdout + proc.stderr, json.load(f)


def submit_command(master, args, out, conf=(), archives=None, job="train_ctr.py", python=None):
    """The ``spark-submit`` command line and environment :func:`spark_submit` runs. ``archives``: the executors'
    environment shipped (``./environment/bin/python`` from it); ``python``: installed on every node at that path."""
    spark_submit_bin = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [spark_submit_bin, "--conf", "spark.ui.showConsoleProgress=false", "--conf", f"spark.python.daemon.module={DAEMON}"]
    if master is not None:  # None: no --master at all, as `./run job` submits
        cmd[1:1] = ["--master", master]
    if archives:
        env.pop("PYSPARK_PYTHON")
        cmd += ["--archives", f"{archives}#environment", "--conf", "spark.pyspark.python=./environment/bin/python",
                "--conf", f"spark.pyspark.driver.python={sys.executable}"]
    elif python:
        env["PYSPARK_PYTHON"] = python
        cmd += ["--conf", f"spark.pyspark.python={python}", "--conf", f"spark.pyspark.driver.python={sys.executable}"]
    for c in conf:
        cmd += ["--conf", c]
    cmd += [os.path.join(ROOT, "jobs", job), *args, "--output", str(out)]  # an absolute JOB stays as it is
    return cmd, env


def assert_ran_on_executors(executor_ids, worker_pids, driver_pid, expected=2):
    """A cluster test is only one if its tasks ran outside the driver: Spark's executor ids for the
    tasks are not "driver", there are as many as expected, and no Python worker is the driver process."""
    assert "driver" not in executor_ids and "None" not in executor_ids, executor_ids
    assert len(set(executor_ids)) == expected, executor_ids
    assert worker_pids and driver_pid not in worker_pids, (worker_pids, driver_pid)


def spark_jobs(sc):
    """(description, job group) of every job the driver knows, from Spark's status store, oldest first."""
    jobs = sc._jsc.sc().statusStore().jobsList(None)
    out = []
    for i in range(jobs.size()):
        j = jobs.apply(i)
        opt = lambda o: o.get() if o.isDefined() else None  # noqa: E731
        out.append((j.jobId(), opt(j.description()), opt(j.jobGroup())))
    return [(d, g) for _, d, g in sorted(out, key=lambda t: t[0])]


class DriverDied(Exception):
    """Raised by :func:`dies_after_commit` in place of a driver that dies."""


@contextlib.contextmanager
def dies_after_commit(monkeypatch, batch_id):
    """While inside, a fit_stream query "dies" right after the model's commit of micro-batch ``batch_id`` and
    before Spark's (the checkpointer's save raises once it has written): Spark replays that micro-batch on restart."""
    from sparkdl_train.driver import stream

    save = stream.Checkpointer.save

    def save_then_die(self, model, done, logs, info=None):
        path = save(self, model, done, logs, info)
        if info and info.get("batch_id") == batch_id:
            raise DriverDied(f"the driver dies after the model's commit of micro-batch {batch_id}")
        return path

    monkeypatch.setattr(stream.Checkpointer, "save", save_then_die)
    try:
        yield
    finally:
        monkeypatch.setattr(stream.Checkpointer, "save", save)
