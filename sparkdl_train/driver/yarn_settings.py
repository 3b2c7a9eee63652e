"""The Spark settings a YARN session needs before it starts, checked where a person sets them: a notebook
(client mode) or a job's properties file. Pure: a dict of settings and the environment in, findings out; no
Spark, no cluster. ``notebooks/yarn.ipynb`` shows the findings as a table and refuses to start on an error.

What is checked, and why:

* ``HADOOP_CONF_DIR`` (or ``YARN_CONF_DIR``) names a folder with ``yarn-site.xml``: without it the client
  cannot find the ResourceManager and Spark waits on ``0.0.0.0:8032``.
* the deploy mode is client: a notebook's kernel is the driver.
* ``spark.yarn.dist.archives`` ships the executors' environment (``./run pack``) under an alias, and
  ``spark.pyspark.python`` runs the Python inside it (``./environment/bin/python``); a local archive is
  uploaded by every application (a warning: put it on HDFS, where each NodeManager localizes it once).
  ``spark.archives`` (what ``--archives`` sets) works too but is a warning: YARN localizes it, and then every
  Spark 4 executor unpacks it again into a folder of its own before it takes a task (about 20 s of CPU for
  the 1.5 GB environment, per executor; under dynamic allocation an executor can reach its idle timeout,
  and be released, before it has ever been usable).
  ``spark.pyspark.driver.python`` may not point into the archive: in client mode the driver runs here.
  In a notebook pyspark takes the executors' Python from ``PYSPARK_PYTHON`` (``spark.pyspark.python`` is read
  by ``spark-submit`` only, which sets the variable from it): the two must agree, or the executors run
  ``python3`` from the node's ``PATH``, without TensorFlow.
* ``spark.executor.memoryOverhead`` holds TensorFlow's native memory (at least 1 GiB): YARN kills a
  container over ``spark.executor.memory`` + overhead, and Spark's default overhead (10%, at least
  384 MiB) is less than TensorFlow takes on import.
* GPUs: ``spark.executor.resource.gpu.amount`` needs ``spark.task.resource.gpu.amount`` and a
  ``spark.executor.resource.gpu.discoveryScript``; Spark asks YARN for ``yarn.io/gpu``
  (``spark.yarn.resourceGpuDeviceName``), which the cluster must offer as a resource type.
* dynamic allocation: barrier stages (``mode="allreduce"``) refuse it (SPARK-24954).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from .spark_conf import DYNAMIC_ALLOCATION, dynamic_allocation

MIN_OVERHEAD_MIB = 1024

OK, WARNING, ERROR = "ok", "warning", "error"


@dataclass(frozen=True)
class Finding:
    setting: str
    value: str | None
    level: str  # OK, WARNING or ERROR
    message: str


def read_properties(path: str) -> dict[str, str]:
    """A ``spark-defaults.conf``-style file (``key  value`` lines, ``#`` comments) as a dict."""
    settings = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition(" ")
            settings[key] = value.strip()
    return settings


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_MIB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def mebibytes(size: str, default_unit: str = "m") -> float:
    """A Spark size (``1536m``, ``2g``, ``1024``: MiB when no unit) in MiB."""
    m = _SIZE.match(size)
    if not m:
        raise ValueError(f"not a size: {size!r}")
    unit = (m.group(2) or default_unit).lower()
    return int(m.group(1)) * _MIB[unit]


def check(settings: Mapping[str, str], env: Mapping[str, str] | None = None, mode: str | None = None) -> list[Finding]:
    """The findings for a client-mode YARN session started with ``settings`` (``mode``: the engine the fits
    will use, when known)."""
    env = os.environ if env is None else env
    found = [_conf_dir(env), _deploy_mode(settings)]
    found += _environment(settings, env)
    found.append(_overhead(settings))
    found += _gpus(settings)
    found.append(_dynamic_allocation(settings, mode))
    return found


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == ERROR]


def _conf_dir(env: Mapping[str, str]) -> Finding:
    for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR"):
        where = env.get(name)
        if where:
            if os.path.exists(os.path.join(where, "yarn-site.xml")):
                return Finding(name, where, OK, "the client finds the ResourceManager in its yarn-site.xml")
            return Finding(name, where, ERROR, f"{name} has no yarn-site.xml: the client cannot find the ResourceManager")
    return Finding("HADOOP_CONF_DIR", None, ERROR, "set HADOOP_CONF_DIR to the cluster's client configuration (yarn-site.xml, "
                   "core-site.xml) before the session starts; without it Spark looks for a ResourceManager at 0.0.0.0:8032")


def _deploy_mode(settings: Mapping[str, str]) -> Finding:
    mode = settings.get("spark.submit.deployMode", "client")
    if mode != "client":
        return Finding("spark.submit.deployMode", mode, ERROR, "a notebook's kernel is the driver: only client mode "
                       "starts from it (cluster mode is for ./run submit)")
    return Finding("spark.submit.deployMode", mode, OK, "the driver runs in this kernel")


def _environment(settings: Mapping[str, str], env: Mapping[str, str]) -> list[Finding]:
    key = "spark.yarn.dist.archives" if settings.get("spark.yarn.dist.archives") else "spark.archives"
    archives = settings.get(key)
    python = settings.get("spark.pyspark.python") or settings.get("spark.executorEnv.PYSPARK_PYTHON")
    if not archives:
        return [Finding("spark.yarn.dist.archives", None, ERROR, "ship the executors' environment (./run pack's archive) "
                        "with spark.yarn.dist.archives hdfs:///path/sparkdl_env.tar.gz#environment: YARN's nodes have no "
                        "sparkdl_train")]
    aliases = {a.partition("#")[2] for a in archives.split(",") if "#" in a}
    found = []
    local = [a.partition("#")[0] for a in archives.split(",") if "://" not in a or a.startswith("file:")]
    if key == "spark.archives":
        found.append(Finding(key, archives, WARNING, "every executor unpacks a spark.archives archive again before it takes "
                             "a task (YARN has localized it already): set spark.yarn.dist.archives instead"))
    if local:
        found.append(Finding(key, archives, WARNING, f"{local[0]} is a local file: every application uploads it "
                             "again; put it on HDFS, where each NodeManager localizes it once"))
    elif key != "spark.archives":
        found.append(Finding(key, archives, OK, "each NodeManager localizes it once"))
    inside = python and any(python.startswith(f"./{alias}/") or python.startswith(f"{alias}/") for alias in aliases)
    if not inside:
        found.append(Finding("spark.pyspark.python", python, ERROR, "the executors must run the archive's Python: set "
                             f"spark.pyspark.python to ./{next(iter(aliases), 'environment')}/bin/python (the alias after # in "
                             f"{key})"))
    elif env.get("PYSPARK_PYTHON") != python:
        found.append(Finding("PYSPARK_PYTHON", env.get("PYSPARK_PYTHON"), ERROR, "pyspark in a notebook starts the executors' "
                             f"Python from PYSPARK_PYTHON, not spark.pyspark.python: set os.environ['PYSPARK_PYTHON'] = "
                             f"'{python}' before the session starts"))
    else:
        found.append(Finding("spark.pyspark.python", python, OK, "the executors run the archive's Python (PYSPARK_PYTHON too)"))
    driver = settings.get("spark.pyspark.driver.python")
    if driver and any(driver.startswith(f"./{alias}/") for alias in aliases):
        found.append(Finding("spark.pyspark.driver.python", driver, ERROR, "in client mode the driver runs here, where "
                             "the archive is not unpacked: leave spark.pyspark.driver.python unset"))
    return found


def _overhead(settings: Mapping[str, str]) -> Finding:
    key = "spark.executor.memoryOverhead"
    value = settings.get(key)
    if value is None:
        memory = mebibytes(settings.get("spark.executor.memory", "1g"))
        factor = float(settings.get("spark.executor.memoryOverheadFactor", "0.1"))
        overhead = max(384.0, memory * factor)
        shown = f"(default: {overhead:.0f}m)"
    else:
        overhead, shown = mebibytes(value), value
    if overhead < MIN_OVERHEAD_MIB:
        return Finding(key, shown, ERROR, f"TensorFlow's memory is native, outside the JVM heap, and YARN kills a container "
                       f"over spark.executor.memory + {key}: set {key} to at least {MIN_OVERHEAD_MIB}m")
    return Finding(key, shown, OK, "holds TensorFlow's native memory")


def _gpus(settings: Mapping[str, str]) -> list[Finding]:
    key = "spark.executor.resource.gpu.amount"
    amount = settings.get(key)
    if not amount or float(amount) <= 0:
        return [Finding(key, amount, OK, "no GPUs asked for: the executors train on CPU")]
    found = [Finding(key, amount, OK, "Spark asks YARN for " + settings.get("spark.yarn.resourceGpuDeviceName", "yarn.io/gpu")
                     + " (the cluster must offer it as a resource type)")]
    if not settings.get("spark.task.resource.gpu.amount"):
        found.append(Finding("spark.task.resource.gpu.amount", None, ERROR, "set it (1: one GPU per training task) "
                             "or Spark schedules tasks without their GPU"))
    if not settings.get("spark.executor.resource.gpu.discoveryScript"):
        found.append(Finding("spark.executor.resource.gpu.discoveryScript", None, ERROR, "executors find their GPUs' "
                             "addresses with a discovery script on every node (Spark ships getGpusResources.sh)"))
    return found


def _dynamic_allocation(settings: Mapping[str, str], mode: str | None) -> Finding:
    key = DYNAMIC_ALLOCATION
    on = dynamic_allocation(settings)
    if on and mode == "allreduce":
        return Finding(key, "true", ERROR, "barrier stages (mode='allreduce') refuse dynamic allocation (SPARK-24954)")
    if on and mode == "synchronous":
        return Finding(key, "true", WARNING, "synchronous rounds need every worker at once: set "
                       "spark.dynamicAllocation.minExecutors to cover them (executors come only for waiting tasks)")
    if on:
        return Finding(key, "true", WARNING, "a fit starts on the executors there (whether later epochs use those "
                       "that arrive is not yet tested); mode='allreduce' needs it off")
    return Finding(key, settings.get(key, "false"), OK, "a fixed set of executors")
