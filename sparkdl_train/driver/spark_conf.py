"""Reading a running SparkContext's conf in a few py4j round trips.

``sc.getConf()`` copies every entry of the conf through py4j (two calls per entry: 15 ms on a
session of about 60 entries), and a fit read it four times. These read the context's live conf
(what ``--conf``, ``spark-defaults.conf`` and ``sc._conf.set`` gave it): :func:`settings_conf`
the ``spark.sparkdl_train.*`` entries in one call, :func:`conf_values` each named key in one.
"""

from __future__ import annotations

from typing import Any, Iterable

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
