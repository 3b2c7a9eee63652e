"""Killing an executor's Python worker (SIGKILL, by pid) mid-fit on local-cluster[2,1,2048], for
every engine (tests/scripts/fault_check.py does the killing in a separate driver process)."""

import pytest
from helpers import assert_ran_on_executors, run_check_script

EPOCHS = 3


@pytest.fixture(scope="module")
def cases():
    result = run_check_script("fault_check.py", timeout=1200)
    return result["n"], {c["name"]: c for c in result["cases"]}


def _on_executors(case):
    assert_ran_on_executors(case["executor_ids"], case["pids"], case["driver_pid"])


def _released(case):
    assert case["threads_after"] == [], case  # report server, parameter server, helper threads
    assert case["new_listening_sockets"] == 0, case
    if "server_port_closed" in case:
        assert case["server_port_closed"], case


@pytest.mark.parametrize("name", ["averaging", "sync-ps", "async-ps", "hogwild-ps"])
def test_killed_worker_task_is_retried_with_no_lost_epoch(cases, name, reference_accuracy):
    n, by_name = cases
    case = by_name[name]
    assert case["killed_pid"], case  # the kill happened, in the second epoch
    assert case["ok"], case.get("error")
    assert case["epochs"] == EPOCHS
    assert case["epoch_samples"] == [n] * EPOCHS  # the dead attempt's samples are not counted
    assert case["attempts"][1]["1"] == 1  # epoch 2, partition 1: Spark's second attempt
    assert case["acc"] >= reference_accuracy - 0.1, case  # 3 epochs against the 12-epoch reference
    _on_executors(case)
    _released(case)


def test_allreduce_reruns_the_barrier_stage_from_the_epoch_start(cases, reference_accuracy):
    n, by_name = cases
    case = by_name["allreduce"]
    assert case["killed_pid"] and case["ok"], case.get("error")
    assert case["epochs"] == EPOCHS and case["epoch_samples"] == [n] * EPOCHS
    assert case["epoch_retries"] == 1
    assert case["acc"] >= reference_accuracy - 0.1, case
    _on_executors(case)
    _released(case)


def test_a_stage_of_several_epochs_reruns_from_the_last_epoch_the_driver_adopted(cases, reference_accuracy):
    """Rank 1's worker killed while the ranks wait between epochs 1 and 2 of a three-epoch stage:
    the stage fails in epoch 2's ring, and the engine re-runs epochs 2-3 as a new stage from the
    state the driver adopted after epoch 1; no epoch lost or counted twice."""
    n, by_name = cases
    case = by_name["allreduce-stage"]
    assert case["killed_pid"] and case["ok"], case.get("error")
    assert case["epochs"] == EPOCHS and case["epoch_samples"] == [n] * EPOCHS
    assert case["epoch_retries"] == 1 and case["stages"] == 2, case
    assert case["acc"] >= reference_accuracy - 0.1, case
    _on_executors(case)
    _released(case)


def test_allreduce_without_retries_fails_fast_and_clearly(cases):
    _, by_name = cases
    case = by_name["allreduce-no-retry"]
    assert case["killed_pid"] and not case["ok"]
    assert case["error_type"] == "WorkerError"
    assert "epoch 2/3" in case["error"] and "barrier" in case["error"]
    # whichever rank's failure reaches the driver first names the cause: the killed worker's crash, or its
    # neighbour losing the ring's connection to it (both seen: CI at d204887 got rank 0's)
    assert "Python worker exited unexpectedly" in case["error"] or "lost the connection to rank 1" in case["error"], case["error"]
    assert case["seconds_after_kill"] < 60  # well inside allreduce_timeout, nothing hangs
    _released(case)
