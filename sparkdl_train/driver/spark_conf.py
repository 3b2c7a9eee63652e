"""Reading a running SparkContext's conf in a few py4j round trips.

``sc.getConf()`` copies every entry of the conf through py4j (two calls per entry: 15 ms on a
session of about 60 entries), and a fit read it four times. These read the context's live conf
(what ``--conf``, ``spark-defaults.conf`` and ``sc._conf.set`` gave it): :func:`settings_conf`
the ``spark.sparkdl_train.*`` entries in one call, :func:`conf_values` each named key in one.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Mapping

from ..config import CONF_PREFIX


def _jconf(sc: Any) -> Any:
    """The JVM conf behind ``sc``, or None for a stand-in context (then the public copy is read)."""
    return getattr(getattr(sc, "_conf", None), "_jconf", None)


def settings_conf(sc: Any) -> dict[str, str]:
    """The context's ``spark.sparkdl_train.*`` entries (what :meth:`EngineConfig.resolve` reads)."""
    jconf = _jconf(sc)
    if jconf is None:
        return {k: v for k, v in sc.getConf().getAll() if k.startswith(CONF_PREFIX)}
    return {CONF_PREFIX + t._1(): t._2() for t in jconf.getAllWithPrefix(CONF_PREFIX)}


def conf_values(sc: Any, keys: Iterable[str]) -> dict[str, str]:
    """Those of ``keys`` that are set in the context's conf."""
    keys = tuple(keys)
    jconf = _jconf(sc)
    if jconf is None:
        return {k: v for k, v in sc.getConf().getAll() if k in keys}
    values = {key: jconf.get(key, None) for key in keys}
    return {k: v for k, v in values.items() if v is not None}


DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"


def dynamic_allocation(conf: Mapping[str, str]) -> bool:
    """Whether ``conf`` (settings as strings) turns Spark's dynamic allocation on."""
    return (conf.get(DYNAMIC_ALLOCATION) or "false").strip().lower() == "true"


LOCALITY_WAIT = "spark.locality.wait"


@contextlib.contextmanager
def no_locality_wait(sc: Any):
    """While a fit runs, the scheduler does not wait for data locality (``spark.locality.wait`` 0 in the
    context's live conf, which every new task set reads; restored after). A fit's training tasks prefer
    the executors that cached their partitions; a DataFrame cached on fewer executors than the fit has
    workers would otherwise run its tasks one after another there (each wait is 3 s, an epoch's task often
    less), not side by side on every executor (seen on YARN: an asynchronous fit of two workers on one
    container of two)."""
    jconf = _jconf(sc)
    if jconf is None:  # a Spark Connect client or a stand-in context: the server's scheduler, not ours
        yield
        return
    before = jconf.getOption(LOCALITY_WAIT)
    jconf.set(LOCALITY_WAIT, "0s")
    try:
        yield
    finally:
        if before.isDefined():
            jconf.set(LOCALITY_WAIT, before.get())
        else:
            jconf.remove(LOCALITY_WAIT)
