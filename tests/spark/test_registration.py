"""No fit narrower than its cluster: a fit waits, before planning its workers, for the executors the
application asked for (sparkdl_train.driver.registration). The rule and the wait are tested without
Spark; tests/scripts/registration_check.py starts fits right after fresh local-cluster sessions (slow)."""

import logging

import pytest
from helpers import assert_ran_on_executors, run_check_script

from sparkdl_train.driver import registration
from sparkdl_train.driver.registration import Expected, expected_executors, wait_for_executors


@pytest.mark.parametrize("master,conf,expected", [
    ("local-cluster[2,1,2048]", {}, Expected(2, None, "master local-cluster[2,1,2048]")),
    ("local-cluster[ 3 , 2, 1024]", {"spark.executor.instances": "9"}, Expected(3, None, "master local-cluster[ 3 , 2, 1024]")),
    ("yarn", {"spark.executor.instances": "16"}, Expected(16, None, "spark.executor.instances=16")),
    ("k8s://https://api:6443", {"spark.executor.instances": "4", "spark.cores.max": "64"}, Expected(4, None, "spark.executor.instances=4")),
    ("spark://m:7077", {"spark.cores.max": "16", "spark.executor.cores": "4"},
     Expected(4, None, "spark.cores.max=16 / spark.executor.cores=4")),
    ("spark://m:7077", {"spark.cores.max": "6"}, Expected(None, 6, "spark.cores.max=6")),
    ("yarn", {"spark.dynamicAllocation.enabled": "true", "spark.executor.instances": "8",
              "spark.dynamicAllocation.minExecutors": "2"}, Expected(2, None, "spark.dynamicAllocation.minExecutors=2")),
    ("yarn", {"spark.dynamicAllocation.enabled": "true"}, None),
    ("spark://m:7077", {}, None),  # Spark does not say: every Worker's cores, however many Workers
    ("local[*]", {"spark.executor.instances": "4"}, None),
    ("local[2]", {}, None),
])
def test_what_the_application_asked_for(master, conf, expected):
    assert expected_executors(master, conf) == expected


class _Conf:
    def __init__(self, values):
        self.values = values

    def getAll(self):
        return list(self.values.items())


class _Context:
    """What the wait reads of a SparkContext: its master, application id and conf."""

    def __init__(self, master, conf=None, app="app-1"):
        self.master, self.applicationId, self._values = master, app, conf or {}

    def getConf(self):
        return _Conf(self._values)


class _Cluster:
    """Executors registering over a fake clock: ``arrivals`` are (seconds, executors, cores)."""

    def __init__(self, arrivals):
        self.arrivals, self.now, self.calls = arrivals, 0.0, 0

    def clock(self):
        return self.now

    def count(self, sc, task_cpus):
        self.calls += 1
        self.now += 0.5  # each look at the scheduler advances the fake clock by one poll
        seen = [(e, c) for t, e, c in self.arrivals if t <= self.now]
        return seen[-1] if seen else (0, 0)


@pytest.fixture(autouse=True)
def _fresh_applications(monkeypatch):
    monkeypatch.setattr(registration, "_complete", set())


def _wait(cluster, sc, timeout=30.0, slots=None):
    return wait_for_executors(sc, timeout, slots, poll=0, clock=cluster.clock, count=cluster.count, log_every=2.0)


def test_waits_until_every_executor_asked_for_has_registered_and_says_what_it_waits_for(caplog):
    cluster = _Cluster([(0, 0, 0), (3.0, 1, 1), (6.0, 2, 2)])
    with caplog.at_level(logging.INFO, logger="sparkdl_train.driver.registration"):
        got = _wait(cluster, _Context("local-cluster[2,1,1024]"))
    assert (got.executors, got.cores, got.complete) == (2, 2, True) and got.seconds == pytest.approx(6.0)
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting")]
    assert waiting and "0 of the 2 executors asked for (master local-cluster[2,1,1024])" in waiting[0], waiting
    assert "spark.sparkdl_train.executors.registrationTimeout" in waiting[0]
    assert any("1 of the 2 executors" in m for m in waiting), waiting  # it says again while it waits
    assert "registered after 6.0 s" in caplog.records[-1].getMessage()


def test_past_its_timeout_it_trains_on_what_is_there_and_names_the_shortfall(caplog):
    cluster = _Cluster([(0, 1, 4)])  # the second of 2 instances never comes
    sc = _Context("yarn", {"spark.executor.instances": "2", "spark.task.cpus": "2"})
    with caplog.at_level(logging.INFO, logger="sparkdl_train.driver.registration"):
        got = _wait(cluster, sc, timeout=10.0, slots=4)
    assert (got.executors, got.complete) == (1, False) and got.seconds >= 10.0
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    text = warning[0].getMessage()
    assert "only 1 of the 2 executors" in text and "spark.executor.instances=2" in text and "within 10 s" in text, text
    assert "2 task slots" in text and "4 workers need 4 slots" in text, text  # 4 cores / spark.task.cpus=2


def test_a_fit_whose_workers_have_their_slots_does_not_wait_for_the_rest():
    cluster = _Cluster([(0, 1, 4), (20.0, 2, 8)])
    got = _wait(cluster, _Context("spark://m:7077", {"spark.cores.max": "8", "spark.executor.cores": "4"}), slots=3)
    assert (got.executors, got.complete) == (1, False) and cluster.now == 0.5  # one look: 4 slots >= 3
    assert registration._complete == set()


def test_cores_when_spark_knows_only_the_cores():
    cluster = _Cluster([(0, 1, 4), (2.0, 2, 6)])
    got = _wait(cluster, _Context("spark://m:7077", {"spark.cores.max": "6"}))
    assert (got.executors, got.cores, got.complete) == (2, 6, True)


def test_once_complete_a_later_shortfall_is_a_lost_executor_not_waited_for(caplog):
    sc = _Context("local-cluster[2,1,1024]")
    assert _wait(_Cluster([(0, 2, 2)]), sc).complete
    lost = _Cluster([(0, 1, 1), (50.0, 2, 2)])
    with caplog.at_level(logging.INFO, logger="sparkdl_train.driver.registration"):
        got = _wait(lost, sc, timeout=100.0)
    assert (got.executors, got.complete) == (1, False) and lost.calls == 1
    assert "executors were lost" in caplog.records[-1].getMessage()


def test_local_masters_and_silent_applications_are_not_waited_for():
    cluster = _Cluster([(0, 0, 0)])
    assert _wait(cluster, _Context("local[2]")) is None
    assert _wait(cluster, _Context("spark://m:7077")) is None
    assert cluster.calls == 0


@pytest.mark.slow
def test_fits_started_right_after_the_session_wait_for_both_executors():
    """Three fresh local-cluster sessions, each fitting at once with one engine (averaging, the
    asynchronous parameter server, allreduce): every executor JVM starts paused and is released only
    when the fit says it waits for executors, so each fit starts with none registered (a CI run once
    trained on one executor here); the pause makes that certain, so one session per engine is enough."""
    result = run_check_script("registration_check.py", "local-cluster[2,1,1024]", timeout=1500)
    rounds = result["rounds"]
    assert [r["engine"] for r in rounds] == ["averaging", "asynchronous", "allreduce"]
    for r in rounds:
        assert r["executors_at_start"] == 0 and r["asked_to_wait"], r
        assert_ran_on_executors(r["executor_ids"], r["pids"], result["driver_pid"])
        assert r["num_workers"] == 2, r  # the default, taken after the wait
        assert r["registration"]["executors"] == 2 and r["registration"]["complete"], r
        assert r["samples"] == result["rows"], r  # every row once
