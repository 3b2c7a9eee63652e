"""Failed Spark jobs as typed causes (sparkdl_train/failures.py), checked against the error texts
this Spark version produces for real failed jobs on local[2]; the retry policy decides by cause."""

import pickle
import threading
import time

import pytest

from sparkdl_train.data.adapters import RDDAdapter
from sparkdl_train.errors import DataError, FitCancelled, WorkerError
from sparkdl_train.failures import Cause, FailurePolicy, classify, classify_text
from sparkdl_train.merge import Partial


def _run(sc, task, rdd=None):
    adapter = RDDAdapter(rdd if rdd is not None else sc.parallelize([(0.0, 0.0)] * 4, 2))
    return adapter.map_reduce(task, "sparkdl_train test job")


def test_a_data_error_on_an_executor_is_a_user_error(sc):
    def task(partition, chunks):
        if partition == 1:
            raise DataError("column 'x' (for 'pixels') holds NaN in row 3")
        return Partial()

    with pytest.raises(WorkerError) as info:
        _run(sc, task)
    err = info.value
    assert err.cause == Cause.USER_ERROR.value and len(err.failures) == 1
    assert "sparkdl_train.errors.DataError: column 'x'" in err.message
    assert pickle.loads(pickle.dumps(err)).cause == "user_error"


def test_an_exception_in_task_code_is_a_task_error(sc):
    def task(partition, chunks):
        if partition == 0:
            raise RuntimeError("boom in partition 0")
        return Partial()

    with pytest.raises(WorkerError) as info:
        _run(sc, task)
    assert info.value.cause == Cause.TASK_ERROR.value
    assert len(info.value.failures) == 1 and "RuntimeError: boom in partition 0" in info.value.message


def test_a_python_worker_that_dies_is_a_lost_worker(sc):
    def task(partition, chunks):
        import os

        if partition == 1:
            os._exit(1)  # as a SIGKILL or the OOM killer would end it
        return Partial()

    with pytest.raises(WorkerError) as info:
        _run(sc, task)
    assert info.value.cause == Cause.WORKER_LOST.value, info.value.message[:2000]
    assert FailurePolicy().should_retry(Cause(info.value.cause), 0)


def test_a_cancelled_job_is_fit_cancelled(sc):
    started = threading.Event()

    def task(partition, chunks):
        import time as t

        t.sleep(60)
        return Partial()

    box = {}

    def run():
        sc.setJobGroup("sparkdl_train-test-cancel", "test", interruptOnCancel=True)
        started.set()
        try:
            _run(sc, task)
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    started.wait(10)
    deadline = time.monotonic() + 30
    while not sc.statusTracker().getJobIdsForGroup("sparkdl_train-test-cancel") and time.monotonic() < deadline:
        time.sleep(0.05)
    sc.cancelJobGroup("sparkdl_train-test-cancel")
    t.join(60)
    assert isinstance(box.get("error"), FitCancelled), box
    assert "was cancelled: Job" in str(box["error"])


@pytest.mark.parametrize("text,cause", [
    # what this machine's Spark logged when a local-cluster executor was killed
    ("Job aborted due to stage failure: Task 1 in stage 3.0 failed 4 times, most recent failure: Lost task 1.3 in "
     "stage 3.0 (TID 9) (192.0.2.2 executor 1): ExecutorLostFailure (executor 1 exited caused by one of the running "
     "tasks) Reason: Command exited with code 143", Cause.EXECUTOR_LOST),
    ("Lost executor 1 on 192.0.2.2: Command exited with code 143", Cause.EXECUTOR_LOST),
    ("sparkdl_train.worker.allreduce_task.RankError: allreduce rank 0 of 2 failed: RingTimeout: rank 0: rendezvous "
     "(allGather) not complete after 4 s", Cause.TIMEOUT),
    ("ConnectionResetError: [Errno 104] Connection reset by peer", Cause.CONNECTION_LOST),
    # a lost worker that also shows a user error was the user error first: not retried
    ("Python worker exited unexpectedly (crashed)\nsparkdl_train.errors.ModelError: bad", Cause.USER_ERROR),
])
def test_classify_texts(text, cause):
    assert classify_text(text).cause is cause


def test_a_lost_executor_is_named_with_its_partition():
    # what Spark 4 printed when the standalone cluster's executor 10 was SIGKILLed in a barrier stage
    text = ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure "
            "reason: Stage failed because barrier task ResultTask(60, 1) finished unsuccessfully.\n"
            "ExecutorLostFailure (executor 10 exited caused by one of the running tasks) Reason: Command exited with "
            "code 137\n\tat org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:4560)")
    f = classify_text(text)
    assert (f.cause, f.executor, f.partition) == (Cause.EXECUTOR_LOST, "10", 1)
    assert f.summary == ("executor 10 was lost (ExecutorLostFailure (executor 10 exited caused by one of the running "
                         "tasks) Reason: Command exited with code 137)")
    assert classify_text("Lost executor 3 on 192.0.2.2: Worker shutting down").executor == "3"
    assert classify_text("Lost task 1.3 in stage 3.0 (TID 9): Python worker exited unexpectedly").executor is None


def test_a_container_killed_for_its_memory_names_the_setting_to_raise_and_is_not_retried():
    # the reason Spark's YARN allocator gives (YarnAllocator: exit status -104), as a task failure shows it
    text = ("Job aborted due to stage failure: Task 1 in stage 4.0 failed 2 times, most recent failure: Lost task 1.1 in "
            "stage 4.0 (TID 11) (127.0.0.1 executor 4): ExecutorLostFailure (executor 4 exited caused by one of the "
            "running tasks) Reason: Container killed by YARN for exceeding physical memory limits. 1.1 GB of 1 GB "
            "physical memory used. Consider boosting spark.executor.memoryOverhead.\n\tat org.apache.spark.scheduler")
    f = classify_text(text)
    assert (f.cause, f.executor, f.partition) == (Cause.CONTAINER_MEMORY, "4", 1)
    assert f.summary == ("executor 4's container was killed for its memory: Container killed by YARN for exceeding physical "
                         "memory limits. 1.1 GB of 1 GB physical memory used. Consider boosting spark.executor.memoryOverhead.")
    # a line that does not say what to raise gets the advice
    k8s = classify_text("ExecutorLostFailure (executor 2 exited caused by one of the running tasks) Reason: "
                        "The executor with id 2 exited with exit code 137(SIGKILL, possible container OOM). OOMKilled")
    assert k8s.cause is Cause.CONTAINER_MEMORY and "raise spark.executor.memoryOverhead" in k8s.summary
    assert not FailurePolicy().should_retry(Cause.CONTAINER_MEMORY, 0)


def test_classify_ignores_errors_that_are_not_spark_jobs():
    assert classify(ValueError("Python worker exited unexpectedly")) is None


def test_the_policy_retries_lost_ranks_only_and_only_so_often():
    policy = FailurePolicy(max_retries=2)
    for cause in (Cause.WORKER_LOST, Cause.EXECUTOR_LOST, Cause.CONNECTION_LOST):
        assert policy.should_retry(cause, 0) and policy.should_retry(cause, 1) and not policy.should_retry(cause, 2)
    for cause in (Cause.TIMEOUT, Cause.USER_ERROR, Cause.TASK_ERROR, Cause.CANCELLED, None):
        assert not policy.should_retry(cause, 0)
    assert not FailurePolicy(max_retries=0).should_retry(Cause.WORKER_LOST, 0)


def test_releasing_a_broadcast_on_a_stopped_context_does_not_replace_the_fits_error(caplog):
    """The YARN test's killed application: the fit failed, then its cleanup's unpersist raised Spark's
    NullPointerException from a stopped context, and that was the error the notebook showed."""
    from sparkdl_train.data.adapters import DataAdapter

    class Stopped:
        def unpersist(self):
            raise RuntimeError("An error occurred while calling o533.unpersist.\n: java.lang.NullPointerException: Cannot "
                               "invoke \"RpcEndpointRef.askSync\" because BlockManagerMaster.driverEndpoint() is null")

    DataAdapter.unshare(None, Stopped())  # no exception
    assert "could not release a broadcast" in caplog.text and "NullPointerException" in caplog.text
