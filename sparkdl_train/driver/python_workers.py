"""One pool of Python workers for a fit's RDD tasks and its DataFrame (Arrow) tasks.

Spark keys its Python worker daemons by interpreter, daemon module and the environment the
task's function carries. SQL's Python runners (``mapInArrow``, used for DataFrames) add
``SPARK_SIMPLIFIED_TRACEBACK=1`` to that environment when
``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` is on (the default); RDD
functions (model merges, the preflight, RDD data) do not. So each executor starts two daemons,
and two sets of workers: with :mod:`sparkdl_train.worker.daemon` each daemon imports TensorFlow
(5 to 10 s), and a model rebuilt and traced in one set is rebuilt and traced again in the other.

:func:`share_python_workers` gives the RDD side the same variable, through the SparkContext's
``environment`` (what pyspark attaches to every RDD function it ships), so both kinds of task
fork from one daemon and reuse the same workers. The only effect on a task is that Python
tracebacks from RDD tasks are shortened as SQL's already are.
"""

from __future__ import annotations

import logging
from typing import Any

from .spark_conf import conf_values

log = logging.getLogger(__name__)

VARIABLE = "SPARK_SIMPLIFIED_TRACEBACK"
SQL_SETTING = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


def sql_environment(conf: dict[str, str]) -> dict[str, str]:
    """What SQL's Python runners add to a task's environment under ``conf`` (pure)."""
    return {VARIABLE: "1"} if conf.get(SQL_SETTING, "true").strip().lower() == "true" else {}


def share_python_workers(sc: Any) -> bool:
    """Make RDD tasks' environment match SQL's (idempotent); returns whether it changed it."""
    env = getattr(sc, "environment", None)
    if env is None:
        return False
    wanted = sql_environment(conf_values(sc, [SQL_SETTING]))
    missing = {k: v for k, v in wanted.items() if env.get(k) != v}
    if not missing:
        return False
    env.update(missing)
    log.debug("Python workers shared by RDD and Arrow tasks (%s)", missing)
    return True
