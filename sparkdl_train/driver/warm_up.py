"""Warm-up: have the executors' Python workers ready before the first fit needs them.

The largest fixed cost of a session's first fit is on the executors: each starts a Python worker
daemon that imports TensorFlow (5 to 10 s on small machines). The executor environment check
(:mod:`sparkdl_train.driver.preflight`) pays it, and Spark reuses those workers for training.
:func:`warm_up` starts that check on a helper thread and returns at once, so the imports run while
the driver reads data and builds the model; a fit waits for the same check (never runs it twice)
only before its first stage. Every fit does the same for itself: it starts the check first and
prepares meanwhile (``FitStats.phases``: ``preflight`` is the wait that was left).
"""

from __future__ import annotations

from typing import Any

from ..config import EngineConfig
from ..errors import ConfigError
from .preflight import PendingCheck, start_check
from .python_workers import share_python_workers

KINDS = ("dataframe", "rdd")


def start(sc: Any, config: EngineConfig, session: Any = None) -> PendingCheck:
    """The check a fit with ``config`` waits for, started (or joined) now. Worker sharing, when
    configured, is set first: it must precede the application's first Python job."""
    if config.core.share_daemon:
        share_python_workers(sc)
    if not config.core.preflight:
        return PendingCheck.finished(None)
    return start_check(sc, config.core.preflight_timeout, session)


def warm_up(spark: Any = None, kind: str = "dataframe") -> PendingCheck:
    """Start the executors' environment check (and with it their Python workers and TensorFlow
    imports) for fits on ``kind`` data (``"dataframe"`` or ``"rdd"``), on a helper thread; returns
    a handle whose ``result()`` waits for the reports and raises the check's ``ConfigError``.
    ``spark`` is a SparkSession (the active one when ``None``). Call it right after the session
    starts; ``spark.sparkdl_train.*`` settings of the session apply as in a fit."""
    from pyspark.sql import SparkSession

    if kind not in KINDS:
        raise ConfigError(f"warm_up(kind={kind!r}): kind is one of {', '.join(KINDS)}")
    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("warm_up() needs a SparkSession: none is active; pass one")
    sc = spark.sparkContext
    config = EngineConfig.resolve(dict(sc.getConf().getAll()))
    return start(sc, config, spark if kind == "dataframe" else None)
