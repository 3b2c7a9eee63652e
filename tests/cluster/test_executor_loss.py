"""Executor and node loss on a Spark standalone cluster, for every engine: tests/scripts/executor_loss_check.py
is submitted with the executors' environment installed on the nodes (`./run pack`'s archive unpacked once,
outside the checkout, as a cluster whose nodes have the environment installed; shipping it with `--archives`
is tests/cluster/test_standalone.py's and test_yarn.py's: here each of the dozen replacement executors would
unpack its 1.5 GB again) and SIGKILLs an executor JVM, or a Worker daemon's whole process group, in the second
of three epochs of a fit on a cached DataFrame. Lost Workers are replaced while it runs, as a cluster manager
would.

This module starts a cluster of its own (a Master and two Workers; `standalone_cluster` below
overrides the session's), so that on the slow suite's two pytest-xdist workers (`--dist loadfile`,
.ci/run) it runs beside tests/cluster/test_standalone.py rather than after it, and the kills cannot touch
the other file's executors. The archive is packed once for all workers (conftest's `env_archive`)."""

import json
import os
import subprocess

import pytest
from helpers import SCRIPTS, submit_command


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    from helpers import TEST_JVM_OPTIONS

    from minicluster.standalone import StandaloneCluster

    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("standalone_loss")), jvm_options=TEST_JVM_OPTIONS).start()
    yield cluster
    cluster.stop()


LOSS_EPOCHS = 3
ENGINES = ["averaging", "sync-ps", "async-ps", "hogwild-ps", "allreduce"]


@pytest.fixture(scope="module")
def node_env(env_archive, tmp_path_factory):
    """The executors' environment as a node would have it installed: ./run pack's archive, unpacked once."""
    where = tmp_path_factory.mktemp("node_env")
    subprocess.run(["tar", "xzf", env_archive, "-C", str(where)], check=True, timeout=600)
    return str(where / "bin" / "python")


@pytest.fixture(scope="module")
def loss(standalone_cluster, node_env, tmp_path_factory):
    out = tmp_path_factory.mktemp("executor_loss")
    conf = ["spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1", "spark.executor.memory=1g",
            "spark.task.maxFailures=4", "spark.sparkdl_train.progress.interval=0.1"]
    cmd, env = submit_command(standalone_cluster.url, [], out, conf=conf, python=node_env,
                              job=os.path.join(SCRIPTS, "executor_loss_check.py"))
    with standalone_cluster.replacing_lost_workers():
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2400, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    with open(out / "loss.json") as f:
        result = json.load(f)
    result["by_name"] = {c["name"]: c for c in result["cases"]}
    result["replaced"] = list(standalone_cluster.replaced)
    print(json.dumps({c["name"]: {k: c.get(k) for k in ("ok", "seconds", "seconds_after_kill", "epoch_samples",
                                                       "attempts", "epoch_retries", "epoch_executors")}
                      for c in result["cases"]}, indent=1))  # shown with -rP: the README's table
    return result


def _released(case):
    assert case["threads_after"] == [], case  # report server, parameter server, helper threads
    assert case["new_listening_sockets"] == 0, case
    if "server_port_closed" in case:
        assert case["server_port_closed"], case


def _lost(case):
    """The kill happened in epoch 2, to an executor that had run epoch 1's tasks."""
    assert case.get("executor_pid") and case["seconds_after_kill"] is not None, case
    assert case["executor_id"] in case["epoch_executors"][0], case
    assert case["cached_before"] == 2, case  # both cached partitions were there; one went with the executor


@pytest.mark.parametrize("kind", ["executor", "node"])
@pytest.mark.parametrize("engine", ENGINES)
def test_fit_survives_a_lost_executor_or_node_with_every_epoch_counted_once(loss, engine, kind, reference_accuracy):
    case = loss["by_name"][f"{engine}/{kind}"]
    _lost(case)
    assert case["ok"], case.get("error")
    figures = f"{engine}, {kind} lost: fit ended {case['seconds_after_kill']:.1f} s after the kill ({case['seconds']:.1f} s in all)"
    assert case["epochs"] == LOSS_EPOCHS, figures
    assert case["epoch_samples"] == [loss["n"]] * LOSS_EPOCHS, figures  # the lost attempt's samples are not counted
    if engine == "allreduce":
        assert case["epoch_retries"] == 1, figures  # the barrier epoch re-ran from its start state, and says so
    else:
        assert max(case["attempts"][1].values()) >= 1, (figures, case["attempts"])  # a retried task
    # the lost executor (or every executor of the lost node) ran nothing after the loss
    assert case["executor_id"] not in case["epoch_executors"][2], (figures, case["epoch_executors"])
    assert "driver" not in case["executor_ids"] and os.getpid() != case["driver_pid"]
    assert case["driver_pid"] not in case["pids"]
    assert case["acc"] >= reference_accuracy - 0.1, (figures, case["acc"], reference_accuracy)
    assert case["cached_after"] == 2, figures  # the lost cached partition was recomputed and cached again
    _released(case)
    assert case["seconds_after_kill"] < 180, figures


def test_allreduce_without_retries_fails_fast_naming_the_lost_executor(loss):
    case = loss["by_name"]["allreduce-no-retry/executor"]
    _lost(case)
    assert not case["ok"] and case["error_type"] == "WorkerError", case
    assert case["cause"] == "executor_lost", case
    assert f"executor {case['executor_id']}" in case["error"], case["error"][:2000]
    assert "epoch 2/3" in case["error"], case["error"][:2000]
    assert case["seconds_after_kill"] < 60, case["seconds_after_kill"]  # well inside allreduce_timeout (120 s)
    _released(case)


def test_the_session_trains_normally_afterwards_on_the_replaced_nodes(loss, node_env, reference_accuracy):
    after = loss["after"]
    assert after["ok"] and after["epoch_samples"] == [loss["n"]] * LOSS_EPOCHS, after
    assert all(v == 0 for e in after["attempts"] for v in e.values()), after["attempts"]
    assert after["acc"] >= reference_accuracy - 0.1
    assert len(after["executor_ids"]) == 2 and "driver" not in after["executor_ids"]
    _released(after)
    assert len(loss["replaced"]) == len(ENGINES), loss["replaced"]  # one Worker per node-loss case, replaced
    assert loss["executor_pythons"] == [node_env], loss["executor_pythons"]  # the nodes' environment, not the checkout's
