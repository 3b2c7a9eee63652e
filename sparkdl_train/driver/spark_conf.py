"""Reading a running SparkContext's conf in a few py4j round trips.

``sc.getConf()`` copies every entry of the conf through py4j (two calls per entry: 0.01-0.02 s on a
session of about 60 entries), and a fit read it four times. :func:`conf_values` reads the
``spark.sparkdl_train.*`` entries with one call and each other wanted key with one more, from the
context's live conf (what ``--conf``, ``spark-defaults.conf`` and ``sc._conf.set`` gave it).
"""

from __future__ import annotations

from typing import Any, Iterable

PREFIX = "spark.sparkdl_train."


def conf_values(sc: Any, keys: Iterable[str] = ()) -> dict[str, str]:
    """The context's ``spark.sparkdl_train.*`` entries and those of ``keys`` that are set."""
    keys = tuple(keys)
    jconf = getattr(getattr(sc, "_conf", None), "_jconf", None)
    if jconf is None:  # no JVM conf behind it (a stand-in context): the public copy
        return {k: v for k, v in sc.getConf().getAll() if k.startswith(PREFIX) or k in keys}
    out = {PREFIX + t._1(): t._2() for t in jconf.getAllWithPrefix(PREFIX)}
    for key in keys:
        value = jconf.get(key, None)
        if value is not None:
            out[key] = value
    return out
