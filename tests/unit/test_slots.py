"""A fit whose workers must run at once on a cluster with fewer task slots fails before launch, saying what it
needs, what the cluster offers and, under dynamic allocation, why no executor will come. No Spark: a fake context."""

import pytest

from sparkdl_train.driver.engines.slots import check_barrier_launch, check_concurrent_slots
from sparkdl_train.errors import ConfigError


class FakeContext:
    master = "yarn"
    defaultParallelism = 1  # what barrier_slots falls back to without the JVM's count

    def __init__(self, **conf):
        self.conf = conf

    def getConf(self):
        return self

    def get(self, key, default=None):
        return self.conf.get(key, default)

    def getAll(self):  # noqa: N802 - SparkConf's name
        return list(self.conf.items())


def test_too_few_slots_name_the_need_and_the_offer():
    with pytest.raises(ConfigError) as info:
        check_concurrent_slots(FakeContext(), 2, 0.0, "mode='synchronous' needs its 2 workers running at once")
    assert "needs its 2 workers running at once, but the cluster offers 1" in str(info.value)
    assert "dynamic allocation" not in str(info.value)
    assert check_concurrent_slots(FakeContext(), 1, 0.0, "one worker") == 1


def test_under_dynamic_allocation_the_error_says_no_executor_will_come_for_a_check():
    sc = FakeContext(**{"spark.dynamicAllocation.enabled": "true"})
    with pytest.raises(ConfigError, match="set spark.dynamicAllocation.minExecutors high enough"):
        check_concurrent_slots(sc, 2, 0.0, "mode='synchronous' needs its 2 workers running at once")
    with pytest.raises(ConfigError, match="does not support with spark.dynamicAllocation.enabled=true"):
        check_barrier_launch(sc, 2, 0.0)
