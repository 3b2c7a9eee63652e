"""The fit's monitor ending an epoch at once, before Spark's own retries end it: a container killed for its memory
during a fit (cause container_memory and the line that names the setting to raise, whatever error Spark's
retries would have ended with: a fetch failure for the lost executor's shuffle output, minutes later, on the mini
YARN cluster), and an engine's abort (the parameter server's round that timed out). No Spark: a fake context
whose status store lists the executors that went away."""

import threading
import time
from types import SimpleNamespace

import pytest

from sparkdl_train.driver.monitor import FitMonitor
from sparkdl_train.driver.progress import FitProgress
from sparkdl_train.errors import WorkerError
from sparkdl_train.failures import Cause, memory_kill

# what Spark's YarnAllocator records as the removal reason of an executor whose NodeManager killed it (exit -104)
YARN_REASON = ("Container killed by YARN for exceeding physical memory limits. 1.8 GB of 1.5 GB physical memory used. "
               "Consider boosting spark.executor.memoryOverhead.")


def test_a_removal_for_memory_is_found_among_others():
    assert memory_kill({}) is None
    assert memory_kill({"1": "Executor killed by driver", "2": "Command exited with code 143"}) is None
    f = memory_kill({"1": "Executor killed by driver", "3": YARN_REASON})
    assert (f.cause, f.executor, f.partition) == (Cause.CONTAINER_MEMORY, "3", -1)
    assert f.summary == f"executor 3's container was killed for its memory: {YARN_REASON}"
    k8s = memory_kill({"5": "The executor with id 5 exited with exit code 137(SIGKILL, possible container OOM). OOMKilled"})
    assert k8s.executor == "5" and "raise spark.executor.memoryOverhead" in k8s.summary


class _Seq:  # a Scala Seq as py4j shows it
    def __init__(self, items):
        self.items = list(items)

    def size(self):
        return len(self.items)

    def apply(self, i):
        return self.items[i]


class _Option:
    def __init__(self, value):
        self.value = value

    def isDefined(self):
        return self.value is not None

    def get(self):
        return self.value


class _Executor:
    def __init__(self, id_, active, reason=None):
        self._id, self._active, self._reason = id_, active, reason

    def id(self):
        return self._id

    def isActive(self):
        return self._active

    def removeReason(self):
        return _Option(self._reason)


class FakeContext:
    """What FitMonitor uses of a SparkContext: local properties, job tags, cancel, threads, the status store."""

    def __init__(self):
        self.executors = [_Executor("driver", True), _Executor("1", False, "Executor killed by driver"), _Executor("2", True)]
        self.props, self.cancelled = {}, threading.Event()
        store = SimpleNamespace(executorList=lambda active_only: _Seq(self.executors))
        self._jsc = SimpleNamespace(sc=lambda: SimpleNamespace(statusStore=lambda: store))

    def getLocalProperty(self, k):
        return self.props.get(k)

    def setLocalProperty(self, k, v):
        self.props[k] = v

    def setJobGroup(self, group, description, interruptOnCancel=False):
        self.props["spark.jobGroup.id"] = group

    def addJobTag(self, tag):
        pass

    def removeJobTag(self, tag):
        pass

    def cancelJobsWithTag(self, tag):
        self.cancelled.set()

    def thread(self, target, args=(), name=None):
        return threading.Thread(target=target, args=args, name=name, daemon=True)


def _monitor(sc):
    m = FitMonitor(sc, SimpleNamespace(stop_training=False), None, FitProgress(2, 0, 2), 2, "127.0.0.1", 1.0, live=False)
    m.watch_interval = 0.2
    return m


def test_an_executor_killed_for_its_memory_ends_the_epoch_at_once_and_names_the_setting():
    sc = FakeContext()

    def epoch():  # a Spark job that Spark would retry for minutes, until cancelled
        sc.executors[2] = _Executor("2", False, YARN_REASON)  # executor 2's container is killed under it
        if not sc.cancelled.wait(60):
            return "trained"
        raise RuntimeError("Job 7 cancelled part of cancelled job tag sparkdl_train-x")

    started = time.monotonic()
    with _monitor(sc) as monitor, pytest.raises(WorkerError) as info:
        monitor.run(0, epoch)
    assert time.monotonic() - started < 5 and sc.cancelled.is_set()
    err = info.value
    assert err.cause == "container_memory" and "epoch 1 failed" in err.message
    assert "executor 2's container was killed for its memory" in err.message and "spark.executor.memoryOverhead" in err.message
    assert "executor 1" not in err.message  # gone before the fit, for another reason


def test_a_failed_epoch_reports_the_memory_kill_behind_it():
    """Spark's own error is a fetch failure for the killed executor's shuffle output: the cause stays the memory."""
    sc = FakeContext()

    def epoch():
        sc.executors[2] = _Executor("2", False, YARN_REASON)
        raise RuntimeError("MetadataFetchFailedException: Missing an output location for shuffle 1 partition 1")

    with _monitor(sc) as monitor, pytest.raises(WorkerError) as info:
        monitor.run(0, epoch)
    assert info.value.cause == "container_memory" and "MetadataFetch" in repr(info.value.__cause__)


def test_executors_released_for_other_reasons_change_nothing():
    sc = FakeContext()

    def epoch():
        sc.executors[2] = _Executor("2", False, "Executor killed by driver.")  # released (dynamic allocation)
        time.sleep(0.5)
        return "trained"

    with _monitor(sc) as monitor:
        assert monitor.run(0, epoch) == "trained"
    assert not sc.cancelled.is_set() and monitor.memory_failure is None


def test_a_kill_during_the_fits_preparation_counts_as_the_fits():
    """The prepare job rebuilds the model on the executors before the first epoch: a container killed there is
    the fit's (the monitor compares with the executors gone when fit began, not when the epochs began)."""
    sc = FakeContext()
    before = {"1"}  # fit() read this before its preparation
    sc.executors[2] = _Executor("2", False, YARN_REASON)  # killed while the model was rebuilt ahead of epoch 1
    m = FitMonitor(sc, SimpleNamespace(stop_training=False), None, FitProgress(2, 0, 2), 2, "127.0.0.1", 1.0, live=False,
                   removed_before=before)
    m.watch_interval = 0.2
    with m as monitor, pytest.raises(WorkerError) as info:
        monitor.run(0, lambda: sc.cancelled.wait(60) and (_ for _ in ()).throw(RuntimeError("Job 3 cancelled")))
    assert info.value.cause == "container_memory" and "executor 2's container" in info.value.message


def test_a_synchronous_round_that_times_out_ends_the_epoch_at_once_without_sparks_retries():
    """The parameter server's round times out (a worker that never pushes: its host cut off): the pushing
    worker's task fails, and Spark would run it again up to spark.task.maxFailures times, each attempt failing
    at its first push after a task's start (20 s on a loaded machine for four). The engine's abort
    (ParameterServerEngine._epoch_failed) sees the server's timeout: the job is cancelled and the fit fails
    with the server's own words, cause timeout, within a poll of the timeout."""
    import numpy as np

    from sparkdl_train.driver.engines.parameter_server import ParameterServerEngine
    from sparkdl_train.ps.state import RoundTimeout, ServerState

    sc = FakeContext()
    state = ServerState([np.zeros(3, np.float32)], "synchronous", round_timeout=0.5, join_timeout=0.0)
    state.begin_epoch(2)
    state.join(0, "10.0.0.1"), state.join(1, "10.0.0.2")
    engine = ParameterServerEngine.__new__(ParameterServerEngine)  # only its state is read by the abort
    engine.state = state
    ctx = SimpleNamespace(description="sparkdl_train fit: epoch 3/6")

    def epoch():  # worker 0's task, failed and retried by Spark until the job is cancelled
        with pytest.raises(RoundTimeout):
            state.push(0, state.version, [np.ones(3, np.float32)], 5)
        if not sc.cancelled.wait(60):
            return "trained"
        raise RuntimeError("Job 9 cancelled part of cancelled job tag sparkdl_train-x")

    started = time.monotonic()
    with _monitor(sc) as monitor, pytest.raises(WorkerError) as info:
        monitor.run(2, epoch, abort=lambda: engine._epoch_failed(ctx))
    assert time.monotonic() - started < 3 and sc.cancelled.is_set()
    err = info.value
    assert err.cause == "timeout" and "Job 9 cancelled" in repr(err.__cause__), (err, err.__cause__)
    assert err.message.startswith("sparkdl_train fit: epoch 3/6 failed: synchronous round 0 timed out after 0.5 s "
                                  "(spark.sparkdl_train.ps.roundTimeout): worker 1 (its executor at 10.0.0.2) did not push"), err.message
    # an epoch whose server saw no timeout is not aborted
    state.begin_epoch(2)
    with _monitor(FakeContext()) as monitor:
        assert monitor.run(3, lambda: "trained", abort=lambda: engine._epoch_failed(ctx)) == "trained"
