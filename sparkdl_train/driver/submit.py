"""What a job script run by ``spark-submit`` needs on the driver: the session spark-submit configured,
and a record of where its training tasks ran."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

log = logging.getLogger(__name__)


def submitted_session(app_name: str) -> Any:
    """The session spark-submit configured. Its --master, --conf and --properties-file reach the JVM
    that spark-submit started, so nothing here may override them: a SparkConf() read in Python before
    the JVM gateway exists is empty under spark-submit and says nothing about the master. With no master
    anywhere (plain `python jobs/train_ctr.py`), Spark's launcher defaults to local[*]: the embedded default."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    SparkContext._ensure_initialized()  # attach to (or start) the JVM, so SparkConf() reads what it was given
    builder = SparkSession.builder
    if not SparkConf().contains("spark.app.name"):
        builder = builder.appName(app_name)
    return start_session(builder.getOrCreate)


def start_session(start: Callable[[], Any], attempts: int = 2) -> Any:
    """``start()`` (a builder's ``getOrCreate``), started again when it failed in one of Spark's known
    start-up races (:func:`sparkdl_train.failures.start_race`: YARN client mode's web-UI filter), at
    most ``attempts`` times in all; any other failure is raised at once. For notebooks too:
    ``spark = start_session(SparkSession.builder.master("yarn").getOrCreate)``."""
    from ..failures import start_race

    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 - py4j's errors; only the known races are retried
            race = start_race(exc)
            if attempt == attempts or race is None:
                raise
            log.warning("the Spark session failed to start in a known Spark start-up race (%s); starting it again "
                        "(attempt %d of %d)", race, attempt + 1, attempts)
            _forget_failed_start()
    raise AssertionError("unreachable")


def _forget_failed_start() -> None:
    """What a failed start leaves for the next one in this JVM: the YARN proxy base path of the failed
    application, set as a JVM system property that the next SparkConf would read back."""
    from pyspark import SparkContext

    if SparkContext._jvm is not None:
        SparkContext._jvm.java.lang.System.clearProperty("spark.ui.proxyBase")


def start_job(app_name: str, output: str, spark: Any = None) -> tuple[Any, bool, str]:
    """A job script's start: logging, the session (``spark`` when given: tests, notebooks; else the
    submitted one), the executors' environment check before any of our code runs there (a clear
    error, not a ModuleNotFoundError in the first task; run as a DataFrame stage, in the Python
    workers the jobs' DataFrame fits then reuse), and the output folder. Returns
    ``(spark, own_session, absolute output folder)``."""
    import logging

    from ..driver.preflight import check_executors

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    own_session = spark is None
    if own_session:
        spark = submitted_session(app_name)
        spark.sparkContext.setLogLevel("WARN")
    check_executors(spark.sparkContext, session=spark)
    if is_remote(output):  # hdfs://, s3a://...: written through Hadoop's FileSystem (write_output)
        return spark, own_session, output.rstrip("/")
    out_dir = os.path.abspath(output)
    os.makedirs(out_dir, exist_ok=True)
    return spark, own_session, out_dir


def is_remote(path: str) -> bool:
    """A path with a scheme other than ``file:`` (``hdfs://``, ``s3a://``...): read and written through
    Hadoop's FileSystem, not the driver's disk (a YARN cluster-mode driver's disk is its container's)."""
    return "://" in path and not path.startswith("file:")


def output_path(out_dir: str, name: str) -> str:
    from ..fs import join

    return join(out_dir, name) if is_remote(out_dir) else os.path.join(out_dir, name)


def write_output(out_dir: str, name: str, data: bytes) -> str:
    """Write one file of a job's output (a local folder or a Hadoop path); returns its path."""
    path = output_path(out_dir, name)
    if is_remote(out_dir):
        from ..fs import FileSystem

        FileSystem().write_bytes(path, data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def output_exists(path: str) -> bool:
    if is_remote(path):
        from ..fs import FileSystem

        return FileSystem().exists(path)
    return os.path.exists(path)


def save_model(model: Any, out_dir: str, name: str) -> str:
    """``model.save`` into a job's output: a local file, or written locally and copied to a Hadoop path."""
    if not is_remote(out_dir):
        path = os.path.join(out_dir, name)
        model.save(path)
        return path
    from ..model_io import save_archive

    return write_output(out_dir, name, save_archive(model))


def _code_cache(report: dict[str, Any]) -> tuple[str, str | None, str | None, int, int]:
    """(executor, pyspark's file, the store's folder, modules loaded from it, modules compiled) of one probe report."""
    c = report.get("code_cache") or {}
    return str(report.get("executor_id")), report.get("pyspark"), c.get("folder"), c.get("hits", 0), c.get("misses", 0)


def _zygote(report: dict[str, Any]) -> tuple[str, str | None, int | None, int | None, str | None]:
    """(executor, host, the zygote's pid, its JVM's pid, the JVM's backend class) of one probe report."""
    z = report.get("zygote") or {}
    return str(report.get("executor_id")), report.get("host"), z.get("zygote"), z.get("jvm"), z.get("jvm_main")


def where_it_ran(spark: Any, stats: Any) -> dict[str, Any]:
    """Where the training tasks ran: the master, the executor ids Spark recorded for them, the Python
    worker pids beside the driver's, and what the executors' environment check found."""
    from .executors import executor_hosts

    sc = spark.sparkContext
    parts = [i for e in stats.epochs for i in e.partitions.values()]
    env = stats.environment or []
    hosts = executor_hosts(sc)
    return {
        "master": sc.master,
        "deploy_mode": sc.getConf().get("spark.submit.deployMode", "client"),
        "application_id": sc.applicationId,
        "executor_ids": stats.executor_ids(),
        "worker_pids": sorted({i["pid"] for i in parts}),
        "worker_hosts": sorted({i["host"] for i in parts}),
        # the addresses Spark knows the training tasks' executors by (their Workers' or NodeManagers')
        "executor_hosts": {e: hosts.get(e) for e in stats.executor_ids()},
        "driver_pid": os.getpid(),
        # on YARN: the containers the training tasks ran in, their NodeManagers, and the driver's own (cluster mode: the AM's)
        "containers": stats.containers(),
        "nodemanagers": stats.nodemanagers(),
        "driver_container": os.environ.get("CONTAINER_ID"),
        # the GPU addresses Spark gave the training tasks (spark.task.resource.gpu.amount), and how many tasks had one
        "gpu_addresses": sorted({a for i in parts for a in i.get("gpus") or ()}),
        "gpu_tasks": sum(1 for i in parts if i.get("gpus")),
        "tasks": len(parts),
        "executor_environment": sorted(
            {(str(r.get("executor_id")), r["python"], r["modules"]["sparkdl_train"].get("file")) for r in env}
        ),
        # where the executors' pyspark came from and what the worker daemon's store of its compiled code did (per Python worker)
        "executor_code_cache": sorted((_code_cache(r) for r in env), key=repr),
        # per Python worker: the zygote its daemon is (sparkdl_train.jvm's plugin), that zygote's parent (the executor's
        # JVM) and the JVM's backend class; None where the daemon started as usual
        "executor_zygotes": sorted((_zygote(r) for r in env), key=repr),
    }
