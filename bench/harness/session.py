"""A Spark session for benchmarks, with the tests' settings: executors on this Python, the worker daemon,
sockets on loopback; a local-cluster's executors get the checkout."""

from __future__ import annotations

import os
import sys

from .results import ROOT

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def session(master: str, conf: dict[str, str] | None = None):
    """A SparkSession on ``master`` (and ``conf``); a local-cluster waits for all its executors and gives them the checkout."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
               .config("spark.python.daemon.module", "sparkdl_train.worker.daemon")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
    if master.startswith("local-cluster"):
        builder = (builder.config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
                   .config("spark.executorEnv.PYTHONPATH", ROOT))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
