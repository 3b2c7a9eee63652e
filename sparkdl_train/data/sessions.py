"""Spark Connect sessions: the part of a SparkContext the driver uses, over a Connect client.

A Spark Connect client (Spark 4's ``SparkSession.builder.remote(...)``, Databricks serverless and
shared clusters) has no SparkContext, no RDDs and no broadcasts: ``spark.sparkContext`` raises
and ``df.rdd`` is not implemented. What it keeps is enough for every engine: DataFrame stages
(``mapInArrow``, with ``barrier=True`` for the allreduce ring, whose ranks meet through
``BarrierTaskContext.allGather`` as on a classic session), the session's conf, and operation tags
for cancellation. :class:`ConnectContext` maps the driver's uses of a SparkContext onto those:

=============================  ======================================================================
SparkContext use               on a Connect session
=============================  ======================================================================
``master``, ``getConf()``      the session's conf (``spark.conf``): the server's ``--conf`` entries
                               and the session's own ``spark.conf.set``
``defaultParallelism``         ``spark.default.parallelism``, else the partitions of a ``range``
                               (one JVM-only query, asked once per session)
``broadcast(value)``           :class:`LocalRef`: the value travels in
                               the stage's function, within Connect's message limit (a model larger
                               than ``spark.connect.grpc.maxInboundMessageSize`` is refused)
job groups, job tags, cancel   operation tags (``addTag`` / ``removeTag`` / ``interruptTag``),
                               carried to helper threads by :meth:`ConnectContext.thread`
job descriptions               not shown (Connect has none); kept per thread for symmetry
``environment``                none: executors get ``KERAS_BACKEND`` from the server's
                               ``spark.executorEnv.KERAS_BACKEND`` (the preflight compares)
status store, executor list    none: tasks name their executor themselves
                               (:func:`sparkdl_train.worker.tasks.task_identity`); the server's
                               ``spark.scheduler.minRegisteredResourcesRatio`` makes it wait for
                               its executors
=============================  ======================================================================

The servers a fit runs on the driver (the parameter server, the live-report server) are in the
client's process here: executors must be able to connect to it, which
:func:`sparkdl_train.driver.connect.check_reachable` finds out in seconds, before any training stage
(docs/connect.md).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError

# Connect's default limit for one message from the client (spark.connect.grpc.maxInboundMessageSize):
# a stage's plan, with the functions and the values they carry, must fit in it
DEFAULT_MESSAGE_LIMIT = 128 << 20
# what a plan may carry besides the values a fit puts in its functions
_PLAN_MARGIN = 8 << 20


@dataclass
class LocalRef:
    """A shared value that travels with the task's function (in-process arrays; a Spark Connect
    stage's plan), in place of a broadcast."""

    value: Any

    def unpersist(self) -> None:
        self.value = None


def is_connect_session(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client session (no JVM in this process)."""
    return session is not None and type(session).__module__.startswith("pyspark.sql.connect")


def is_connect(sc: Any) -> bool:
    """Whether ``sc`` is a Connect session's stand-in for a SparkContext."""
    return isinstance(sc, ConnectContext)


def session_context(session: Any) -> Any:
    """A session's SparkContext, or for a Spark Connect session its stand-in."""
    return context_of(session) if is_connect_session(session) else session.sparkContext


def active_connect_session() -> Any:
    """The active Spark Connect session of this process (``None``: none, or a classic process)."""
    if not os.environ.get("SPARK_CONNECT_MODE_ENABLED"):  # set by pyspark when a Connect session is made
        return None
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    return session if is_connect_session(session) else None


_contexts: "weakref.WeakKeyDictionary[Any, ConnectContext]" = weakref.WeakKeyDictionary()
_contexts_lock = threading.Lock()


def context_of(session: Any) -> "ConnectContext":
    """The one :class:`ConnectContext` of a Connect session (what it learns is asked once)."""
    with _contexts_lock:
        ctx = _contexts.get(session)
        if ctx is None:
            ctx = _contexts[session] = ConnectContext(session)
        return ctx


class _Conf:
    def __init__(self, values: dict[str, str]):
        self._values = values

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self._values.items())

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)


class ConnectContext:
    """What the driver's code asks of a SparkContext, answered over a Spark Connect session (the
    module's table). Executors get plain data only, as with a SparkContext."""

    environment = None  # no driver-side environment reaches a Connect server's Python workers

    def __init__(self, session: Any):
        self.session = session
        self._master: str | None = None
        self._parallelism: int | None = None
        self._local = threading.local()
        self.reachable: dict[str, str | None] = {}  # driver address -> None (reached) or why not

    # -- identity and conf ----------------------------------------------------------------
    @property
    def master(self) -> str:
        if self._master is None:
            self._master = self.session.conf.get("spark.master", None) or "connect"
        return self._master

    @property
    def applicationId(self) -> str:  # noqa: N802 - SparkContext's name
        return self.session.conf.get("spark.app.id", None) or f"connect-{self.session.session_id}"

    def getConf(self) -> _Conf:  # noqa: N802 - SparkContext's name
        return _Conf(dict(self.session.conf.getAll))

    @property
    def defaultParallelism(self) -> int:  # noqa: N802 - SparkContext's name
        """``spark.default.parallelism``, else the partition count Spark gives a ``range`` (its
        leaf nodes' default parallelism: the executors' cores), from one query with no Python."""
        if self._parallelism is None:
            given = self.session.conf.get("spark.default.parallelism", None)
            if given:
                self._parallelism = int(given)
            else:
                from pyspark.sql import functions as F

                ids = self.session.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
                row = ids.agg(F.max("p").alias("p")).collect()[0]
                self._parallelism = int(row["p"]) + 1
        return self._parallelism

    @property
    def message_limit(self) -> int:
        """The server's ``spark.connect.grpc.maxInboundMessageSize`` in bytes (Spark's size syntax)."""
        value = self.session.conf.get("spark.connect.grpc.maxInboundMessageSize", None)
        m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", str(value or ""), re.IGNORECASE)
        if not m:
            return DEFAULT_MESSAGE_LIMIT
        return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))

    # -- job descriptions, groups and tags --------------------------------------------
    def _props(self) -> dict[str, str | None]:
        props = getattr(self._local, "props", None)
        if props is None:
            props = self._local.props = {}
        return props

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802
        return self._props().get(key)

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802
        self._props()[key] = value

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool = False) -> None:  # noqa: N802, N803
        self._props()["spark.jobGroup.id"] = group
        self.session.addTag(group)

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        self.session.interruptTag(group)

    def addJobTag(self, tag: str) -> None:  # noqa: N802
        self.session.addTag(tag)

    def removeJobTag(self, tag: str) -> None:  # noqa: N802
        self.session.removeTag(tag)

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802
        self.session.interruptTag(tag)

    def thread(self, target: Callable[..., Any], args: tuple = (), name: str | None = None) -> threading.Thread:
        """A helper thread whose queries carry this thread's tags (Connect's tags are per thread)."""
        session, tags = self.session, set(self.session.getTags())
        group = self._props().get("spark.jobGroup.id")

        def run(*a: Any) -> Any:
            for tag in tags:
                session.addTag(tag)
            if group is not None:
                self._props()["spark.jobGroup.id"] = group
            try:
                return target(*a)
            finally:
                for tag in tags:
                    session.removeTag(tag)

        return threading.Thread(target=run, args=args, name=name, daemon=True)

    # -- shared values ---------------------------------------------------------------
    def broadcast(self, value: Any) -> LocalRef:
        return LocalRef(value)

    def check_size(self, what: str, nbytes: int, others: int = 0) -> None:
        """Refuse a value when it and ``others`` bytes shared beside it (a stage carries the model's
        archive and its state together) exceed what a stage's plan can carry, naming the limit and
        what to do."""
        limit = self.message_limit
        if nbytes + others + _PLAN_MARGIN > limit:
            also = f" (with {others / 2**20:.1f} MiB shared beside it)" if others else ""
            raise ConfigError(
                f"{what} is {nbytes / 2**20:.1f} MiB{also}; on a Spark Connect session it travels inside the stage's "
                f"plan, which the server takes up to spark.connect.grpc.maxInboundMessageSize={limit / 2**20:.0f} MiB "
                f"(less {_PLAN_MARGIN >> 20} MiB for the plan itself): raise that limit on the server, or train from a "
                "classic SparkSession, where the model is broadcast"
            )
