"""Spark Connect sessions (sparkdl_train.driver.connect, docs/connect.md).

The fits run in a client process of their own (tests/scripts/connect_check.py: a Connect session turns
its whole process to Connect mode) against a Spark Connect server started from the pip pyspark on
a free port (tests/scripts/connect_server.py). The default suite runs each engine family once on the
server's ``local[2]``; the slow suite runs a server on ``local-cluster`` and asserts where the
tasks ran. The unit tests below need no server.
"""

import os
import subprocess
import sys
import threading

import pytest
from connect_server import run_client

from sparkdl_train.data.sessions import ConnectContext
from sparkdl_train.driver.connect import check_reachable, unreachable_error
from sparkdl_train.errors import ConfigError
from sparkdl_train.failures import Cause, classify_text
from sparkdl_train.worker.identity import find_executor_id


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from connect_server import ConnectServer

    server = ConnectServer(str(tmp_path_factory.mktemp("connect")),
                           conf={"spark.connect.grpc.maxInboundMessageSize": str(40 << 20)}).start()
    try:
        yield run_client(server.url, "engines")
    finally:
        server.stop()


def test_the_client_has_no_spark_context(engines):
    assert engines["session"] == "pyspark.sql.connect.session"
    assert engines["has_spark_context"] is False


def test_averaging_on_connect(engines):
    r = engines["averaging"]
    assert r["accuracy"] > 0.88, r
    assert r["history"] == ["accuracy", "loss", "val_accuracy", "val_loss"]
    # the tasks named their executor themselves (no status store on a Connect client): local mode's "driver"
    assert r["executors"] == ["driver"] and len(r["pids"]) == 2 and engines["driver_pid"] not in r["pids"], r
    assert "connect_probe" not in r["phases"]  # verbose=0, no callbacks: nothing connects back


def test_allreduce_on_connect(engines):
    r = engines["allreduce"]
    assert r["accuracy"] > 0.88 and len(r["pids"]) == 2, r


def test_synchronous_parameter_server_on_connect(engines):
    r = engines["synchronous"]
    assert r["accuracy"] > 0.85 and len(r["pids"]) == 2 and r["updates"] > 0, r


def test_parameter_server_on_connect_serves_from_the_client(engines):
    r = engines["asynchronous"]
    assert r["accuracy"] > 0.88 and len(r["pids"]) == 2, r
    assert r["connect_probe"] is True
    assert r["server"][0] == "127.0.0.1", r  # the client's address on its route to the server
    assert r["updates"] >= 6 * 2, r  # pushes per batch from both workers, every epoch
    assert r["reports"] > 0 and r["batch_callbacks"] > 0, r  # live reports reached the client


def test_evaluate_and_predict_on_connect_equal_keras(engines):
    assert engines["evaluate"]["loss_diff"] < 1e-5 and engines["evaluate"]["accuracy_diff"] < 1e-6, engines["evaluate"]
    p = engines["predict"]
    assert p["type"] == "pyspark.sql.connect.dataframe" and p["columns"][-1] == "prediction", p
    assert p["rows"] == 360 and p["max_diff"] < 1e-5, p


def test_ctr_deepfm_on_connect(engines):
    """Multi-input DeepFM on the generated CTR data, the asynchronous parameter server: a useful AUC, the
    workers from the server's parallelism (asked with a query: the client has no SparkContext)."""
    r = engines["ctr"]
    assert r["workers"] == 2 and r["val_auc"] > 0.6 and r["val_auc"] <= r["bayes_auc"] + 0.01, r


def test_estimator_on_connect(engines):
    assert engines["estimator"]["accuracy"] > 0.85, engines["estimator"]
    assert "SparkModel.save" in engines["estimator"]["save"], engines["estimator"]  # Spark ML's writer needs a SparkContext


def test_cancel_on_connect_interrupts_the_tagged_operations(engines):
    c = engines["cancel"]
    assert c["raised"] == "FitCancelled" and c["seconds"] < 30, c
    assert engines["after_cancel_rows"] == 10


def test_connect_errors_name_the_fix(engines):
    e = engines["errors"]
    assert "pass the data as a DataFrame" in e["rows"] and "builtins.list" in e["rows"], e
    assert "no RDDs" in e["to_simple_rdd"], e
    assert "kind='dataframe'" in e["warm_up_rdd"], e
    # a parameter server at an address that is not this machine's: refused before any training stage
    u = e["unreachable"]
    assert "192.0.2.1" in u and "mode='allreduce'" in u and "frequency='epoch'" in u and "ps.host" in u, u
    assert e["unreachable_seconds"] < 10, e
    # a listener executors cannot connect to: the probe's task says so, and the fit fails in seconds
    assert "could not connect to 127.0.0.1:" in e["probe"] and "ConnectionRefusedError" in e["probe"], e
    assert "127.0.0.1" in e["refused"] and "mode='allreduce'" in e["refused"], e
    assert e["refused_seconds"] < 10, e
    # archive and state over the server's 40 MiB message limit: refused, naming the limit
    assert "maxInboundMessageSize=40 MiB" in e["too_big"] and "classic SparkSession" in e["too_big"], e


@pytest.mark.slow
def test_connect_server_on_local_cluster(tmp_path):
    """One Connect server on local-cluster (two executor JVMs): the tasks ran on both executors,
    outside the client and the server, and said so themselves."""
    from connect_server import ConnectServer

    server = ConnectServer(str(tmp_path), "local-cluster[2,1,2048]",
                           {"spark.scheduler.minRegisteredResourcesRatio": "1.0"}).start()
    try:
        r = run_client(server.url, "cluster")
    finally:
        server.stop()
    for mode in ("hogwild", "allreduce"):
        got = r[mode]
        assert got["accuracy"] > 0.85, got
        assert got["executors"] == ["0", "1"], got
        assert len(got["pids"]) == 2 and r["driver_pid"] not in got["pids"], got
    assert r["hogwild"]["master"].startswith("local-cluster"), r


# -- without a server ------------------------------------------------------------------

class FakeSession:
    """The part of a Connect session ConnectContext uses; tags per thread, as Connect's client."""

    def __init__(self, conf=None):
        self.conf_values = dict(conf or {})
        self.local = threading.local()
        self.interrupted = []
        self.session_id = "fake"

        class Conf:
            def get(_, key, default=None):
                return self.conf_values.get(key, default)

            @property
            def getAll(_):  # noqa: N802
                return dict(self.conf_values)

        self.conf = Conf()

    def _tags(self):
        if not hasattr(self.local, "tags"):
            self.local.tags = set()
        return self.local.tags

    def addTag(self, tag):  # noqa: N802
        self._tags().add(tag)

    def removeTag(self, tag):  # noqa: N802
        self._tags().discard(tag)

    def getTags(self):  # noqa: N802
        return set(self._tags())

    def interruptTag(self, tag):  # noqa: N802
        self.interrupted.append(tag)


def test_connect_context_maps_groups_and_tags_to_operation_tags():
    s = FakeSession({"spark.master": "local[3]", "spark.default.parallelism": "3", "spark.sparkdl_train.mode": "hogwild"})
    ctx = ConnectContext(s)
    assert ctx.master == "local[3]" and ctx.defaultParallelism == 3
    assert dict(ctx.getConf().getAll()) == s.conf_values
    ctx.setJobGroup("g1", "a fit")
    ctx.addJobTag("t1")
    assert ctx.getLocalProperty("spark.jobGroup.id") == "g1" and s.getTags() == {"g1", "t1"}
    seen = {}

    def work():
        seen["tags"] = s.getTags()
        seen["group"] = ctx.getLocalProperty("spark.jobGroup.id")

    t = ctx.thread(work, name="helper")
    t.start()
    t.join(5)
    assert seen == {"tags": {"g1", "t1"}, "group": "g1"}  # a helper thread's queries carry the caller's tags
    ctx.cancelJobsWithTag("t1")
    ctx.cancelJobGroup("g1")
    assert s.interrupted == ["t1", "g1"]
    ctx.removeJobTag("t1")
    assert s.getTags() == {"g1"}
    assert ctx.broadcast(b"abc").value == b"abc" and ctx.environment is None


def test_connect_refuses_a_value_over_the_message_limit():
    ctx = ConnectContext(FakeSession({"spark.connect.grpc.maxInboundMessageSize": str(64 << 20)}))
    ctx.check_size("the model's archive", 40 << 20)
    with pytest.raises(ConfigError, match=r"60\.0 MiB.*maxInboundMessageSize=64 MiB"):
        ctx.check_size("the model's archive", 60 << 20)
    assert ConnectContext(FakeSession({"spark.connect.grpc.maxInboundMessageSize": "128m"})).message_limit == 128 << 20
    assert ConnectContext(FakeSession()).message_limit == 128 << 20  # Connect's default
    # the state travels beside the archive in the same plan: together they are over
    with pytest.raises(ConfigError, match=r"30\.0 MiB \(with 30\.0 MiB shared beside it\)"):
        ctx.check_size("the model's state", 30 << 20, others=30 << 20)


def test_unreachable_address_fails_before_any_stage_naming_the_modes():
    ctx = ConnectContext(FakeSession())
    why = check_reachable(ctx, "192.0.2.1")  # TEST-NET: never this machine's; no stage is run
    assert why.startswith("cannot listen on 192.0.2.1"), why
    assert ctx.reachable == {"192.0.2.1": why}  # asked once per address
    msg = str(unreachable_error("asynchronous", "192.0.2.1", why))
    assert "192.0.2.1" in msg and "mode='allreduce'" in msg and "spark.sparkdl_train.ps.host" in msg


def test_an_interrupted_connect_operation_is_a_cancellation():
    text = "(org.apache.spark.SparkSQLException) [OPERATION_CANCELED] Operation has been canceled. SQLSTATE: HY008"
    failure = classify_text(text)
    assert failure.cause is Cause.CANCELLED and failure.summary.startswith("[OPERATION_CANCELED]")


def test_a_task_finds_its_executor_id_from_its_jvm_ancestor():
    """The executor JVM's command line carries --executor-id; a worker under it finds it by walking
    up /proc (a stand-in parent with that argument; a JVM without it is local mode's driver)."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code, "--executor-id", "7"], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert find_executor_id(worker) == "7"
        assert find_executor_id(parent.pid) == "7"
    finally:
        parent.kill()
        parent.wait()
    assert find_executor_id(os.getpid()) is None  # pytest: no JVM above it
