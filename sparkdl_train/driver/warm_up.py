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

import logging
import os
import shutil
import tempfile
import threading
from typing import Any

from ..config import EngineConfig
from ..data.sessions import session_context
from ..errors import ConfigError
from .background import SparkCall
from .connect import is_connect
from .preflight import PendingCheck, start_check
from .python_workers import share_python_workers
from .spark_conf import settings_conf

log = logging.getLogger(__name__)

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
    starts; ``spark.sparkdl_train.*`` settings of the session apply as in a fit. On a local
    master, ``"dataframe"`` also warms the JVM's Parquet read path (:func:`_warm_parquet`).

    On the driver it imports Keras (TensorFlow) on a helper thread, then has the garbage collector
    collect once and leave every object alive then out of its later scans (``gc.freeze``, once per
    process, :func:`_freeze_driver_objects`)."""
    from pyspark.sql import SparkSession

    if kind not in KINDS:
        raise ConfigError(f"warm_up(kind={kind!r}): kind is one of {', '.join(KINDS)}")
    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("warm_up() needs a SparkSession: none is active; pass one")
    sc = session_context(spark)
    if kind == "rdd" and is_connect(sc):
        raise ConfigError("warm_up(kind='rdd'): a Spark Connect session has no RDDs; fits on it read DataFrames (kind='dataframe')")
    config = EngineConfig.resolve(settings_conf(sc))
    check = start(sc, config, spark if kind == "dataframe" else None)
    if kind == "dataframe" and sc.master.startswith("local") and not is_connect(sc):  # the server's disk is not ours
        _warm_parquet(spark)
    _freeze_driver_objects()
    return check


_frozen = threading.Lock()
_froze = False


def _freeze_driver_objects() -> None:
    """TensorFlow's import leaves about 400k objects on the driver, and each full collection of
    the garbage collector scans them all: 0.2 s on a small machine, which fell inside a session's
    first fit (its model serialization). They are import-time objects that live as long as the
    process: one collection now, then ``gc.freeze()``, keeps them out of every later scan. On a
    helper thread, after importing Keras, so ``warm_up`` still returns at once. Objects frozen
    here are still freed when their last reference goes; only a reference cycle among them would
    outlive its use."""
    global _froze
    with _frozen:
        if _froze:
            return
        _froze = True

    def run() -> None:
        import gc

        try:
            import keras  # noqa: F401 - its import is what leaves the objects
        except Exception as exc:  # noqa: BLE001 - the fit reports a missing Keras
            log.debug("warm_up: importing keras failed: %s", exc)
        gc.collect()
        gc.freeze()
        log.debug("warm_up: %d driver objects frozen out of the garbage collector's scans", gc.get_freeze_count())

    threading.Thread(target=run, name="sparkdl_train-warm-driver", daemon=True).start()


_parquet_warmed: set[str] = set()


def _warm_parquet(spark: Any) -> None:
    """A session's first Parquet query pays for the JVM's read path: loading and compiling the
    scan, the vectorized reader and the Arrow collect (a fit's first sample job took 0.9 s on two
    cores, later ones 0.2 s). One tiny file written and read back, on a helper thread, pays it
    beside the user's own preparation. Local masters only: the file lives in the driver's temporary
    directory, which executors on other hosts cannot read. Never fails: it is only a warm-up."""
    sc = spark.sparkContext
    if sc.applicationId in _parquet_warmed:
        return
    _parquet_warmed.add(sc.applicationId)

    def run() -> None:
        folder = tempfile.mkdtemp(prefix="sparkdl_train_warm_")
        try:
            path = os.path.join(folder, "warm.parquet")
            spark.range(0, 8, 1, 1).selectExpr("cast(id as double) as d", "array(cast(id as float)) as f",
                                               "array(cast(id as int)) as i", "cast(id as string) as s").write.parquet(path)
            spark.read.parquet(path).limit(8).toArrow()
        except Exception as exc:  # noqa: BLE001 - a warm-up that fails costs the first fit its usual time
            log.debug("warming the Parquet read path failed: %s", exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    SparkCall(sc, run, "sparkdl_train-warm-parquet", "sparkdl_train: warming the Parquet read path")
