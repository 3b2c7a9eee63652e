"""SparkModel on local-cluster[2,1,2048]: two executor JVMs, each with its own Python workers."""

import pytest
from helpers import assert_ran_on_executors, run_check_script


@pytest.fixture(scope="module")
def result():
    return run_check_script("cluster_check.py")


def test_training_runs_in_separate_executor_processes(result):
    assert result["master"] == "local-cluster[2,1,2048]"
    pids = {pid for _, pid in result["worker_processes"]}
    assert len(pids) >= 2
    assert_ran_on_executors(result["executor_ids"], sorted(pids), result["driver_pid"])


def test_each_executor_starts_its_python_daemons_imports_as_it_starts(result):
    """The executor plugin (sparkdl_train.jvm): every training worker's daemon is the zygote its executor JVM
    started (one per executor, not the driver's JVM), and the fit's check of the executors found each
    report's daemon served by its executor's zygote."""
    jvms = set()
    for pid, ((daemon, daemon_cmd), (jvm, jvm_cmd), _) in result["worker_lineage"].items():
        assert "-m sparkdl_train.worker.zygote" in daemon_cmd, (pid, daemon_cmd)
        assert "CoarseGrainedExecutorBackend" in jvm_cmd and jvm != result["driver_jvm"], (pid, jvm_cmd)
        jvms.add(jvm)
    assert len(jvms) == 2, result["worker_lineage"]
    served = [z for _, z in result["env_zygotes"]]
    assert served and all(z is not None and z["jvm"] in jvms and z["imports_s"] > 0 for z in served), result["env_zygotes"]
    assert {e for e, _ in result["env_zygotes"]} == set(result["executor_ids"]), result["env_zygotes"]


def test_accuracy_within_two_points_of_single_process(result):
    assert result["ref_acc"] > 0.93
    assert result["acc"] >= result["ref_acc"] - 0.02, result
    assert result["epochs"] == 12
    assert result["rdd_acc"] > 0.8


def test_predict_and_evaluate_equal_single_process(result):
    assert result["pred_max_abs_diff"] < 1e-5
    assert result["eval_loss"] == pytest.approx(result["local_loss"], rel=1e-4)
    assert result["eval_acc"] == pytest.approx(result["local_acc"], abs=1e-6)


def test_asynchronous_per_batch_parameter_server_across_executors(result):
    assert result["async_acc"] >= result["ref_acc"] - 0.03, result
    assert len(result["async_pids"]) == 2
    assert_ran_on_executors(result["async_executor_ids"], result["async_pids"], result["driver_pid"])
    steps = result["async_worker_steps"]
    assert len(steps) == 2 and result["async_updates"] == sum(steps.values())
    assert result["async_updates"] >= 12 * (1437 // 32)  # one push per batch, every epoch


def test_task_retry_resumes_from_the_servers_weights(result):
    n = 1437
    assert result["retry_epochs"] == 12  # no lost epoch
    assert result["retry_epoch_samples"] == [n] * 12  # the failed attempt's partial is not counted twice
    # the server saw the failed attempt's pushes as well as the retry's
    assert sum(result["retry_server_samples"].values()) > 12 * n
    assert result["retry_acc"] >= result["ref_acc"] - 0.03, result


def test_allreduce_across_executors(result):
    # every epoch, both ranks (in different executor processes) end with identical weights
    assert result["ar_epochs"] == 12
    assert all(len(d) == 1 for d in result["ar_digests"]), result["ar_digests"]
    assert result["ar_ranks"] == [0, 1]
    assert len(result["ar_pids"]) == 2
    assert_ran_on_executors(result["ar_executor_ids"], result["ar_pids"], result["driver_pid"])
    assert result["ar_acc"] >= result["ref_acc"] - 0.02, result
    assert min(result["ar_bytes_sent"]) > 0 and result["ar_server"]["engine"] == "allreduce"


def test_allreduce_runs_four_epochs_per_barrier_stage_across_executors(result):
    """allreduce.epochsPerStage=4 on the two executors: 12 epochs in 3 stages, each rank one task
    per stage (its executor, worker and task id the same for the stage's four epochs), the partition
    kept in the executor's Spark local directory, and the weights of a stage per epoch bit for bit."""
    assert result["stage_same_weights"] is True
    server = result["stage_server"]
    assert server["stages"] == 3 and server["epoch_ends_in_stage"] == 9, server
    tasks = result["stage_tasks"]
    assert len(tasks) == 12
    for stage in range(3):
        epochs = tasks[4 * stage: 4 * stage + 4]
        assert all(e == epochs[0] for e in epochs), epochs  # one task per rank ran the stage's epochs
        assert sorted(executor for _, executor, _, _ in epochs[0]) == ["0", "1"], epochs[0]
    assert all("spark-" in d or "blockmgr" in d for d in result["stage_kept_in"]), result["stage_kept_in"]
