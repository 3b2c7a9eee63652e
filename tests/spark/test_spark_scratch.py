"""The tests' Spark scratch stays under this run's pytest directory (conftest ``_spark_scratch``)."""

import os


def test_spark_scratch_is_under_this_runs_pytest_directory(sc, _spark_scratch):
    from pyspark import StorageLevel

    rdd = sc.parallelize(range(1000), 2).persist(StorageLevel.DISK_ONLY)
    try:
        assert rdd.count() == 1000
        blocks = [f for root, _, files in os.walk(_spark_scratch) for f in files if f.startswith(f"rdd_{rdd.id()}_")]
        assert sorted(blocks) == [f"rdd_{rdd.id()}_0", f"rdd_{rdd.id()}_1"], blocks  # both partitions' blocks there
    finally:
        rdd.unpersist()
