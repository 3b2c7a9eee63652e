"""Waiting for the executors an application asked for, so that no fit runs narrower than its cluster.

YARN and Kubernetes hold a new application's first job until 80% of its executors have registered
(``spark.scheduler.minRegisteredResourcesRatio``); standalone and ``local-cluster`` hold it for
none. A fit started right after its session then plans on whatever executor registered first:
``num_workers`` defaults to the parallelism of that moment and every task of the first stages
lands on it. :func:`wait_for_executors` runs before a fit plans its workers (and before the
environment check that ``warm_up`` starts): it returns once the executors the application asked
for have registered, or once the task slots the fit's workers need are there, or after
``spark.sparkdl_train.executors.registrationTimeout`` seconds, with a warning naming the shortfall.

How many to expect is read from Spark's own settings (:func:`expected_executors`, pure):
``local-cluster[N, ...]``'s N, ``spark.executor.instances``, ``spark.cores.max`` over
``spark.executor.cores`` (or ``spark.cores.max`` cores, when executors take every core of a
Worker), ``spark.dynamicAllocation.minExecutors`` under dynamic allocation. Local masters and
applications that say nothing are not waited for. Once an application has had every executor it
asked for, a later shortfall is a lost executor, not a slow start: it is logged and not waited for.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .spark_conf import DYNAMIC_ALLOCATION, dynamic_allocation

log = logging.getLogger(__name__)

SETTING = "spark.sparkdl_train.executors.registrationTimeout"
_KEYS = ("spark.executor.instances", "spark.executor.cores", "spark.cores.max", "spark.task.cpus",
         DYNAMIC_ALLOCATION, "spark.dynamicAllocation.minExecutors")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,")


@dataclass(frozen=True)
class Expected:
    """What the application asked for: ``executors`` (or, when only a core count is known,
    ``cores``), and the setting that says so."""

    executors: int | None
    cores: int | None
    source: str

    def met(self, executors: int, cores: int) -> bool:
        return (self.executors is None or executors >= self.executors) and (self.cores is None or cores >= self.cores)

    def describe(self) -> str:
        return f"{self.executors} executors" if self.executors is not None else f"{self.cores} cores"


@dataclass(frozen=True)
class Registered:
    """The executors (and their cores) registered when the wait ended, and how long it took."""

    executors: int
    cores: int
    expected: Expected | None
    seconds: float = 0.0
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        exp = self.expected
        return {"executors": self.executors, "cores": self.cores, "seconds": round(self.seconds, 3), "complete": self.complete,
                "expected": None if exp is None else {"executors": exp.executors, "cores": exp.cores, "source": exp.source}}


def _int(conf: dict[str, str], key: str) -> int | None:
    value = (conf.get(key) or "").strip()
    return int(value) if value.isdigit() else None


def expected_executors(master: str, conf: dict[str, str]) -> Expected | None:
    """How many executors (or cores) ``master`` with ``conf`` asks for; None where Spark does not say
    (local masters, a standalone application with neither ``spark.cores.max`` nor an instance count)."""
    m = _LOCAL_CLUSTER.match(master or "")
    if m:
        return Expected(int(m.group(1)), None, f"master {master}")
    if not master or master.startswith("local"):
        return None
    if dynamic_allocation(conf):
        low = _int(conf, "spark.dynamicAllocation.minExecutors")
        return Expected(low, None, f"spark.dynamicAllocation.minExecutors={low}") if low else None
    instances = _int(conf, "spark.executor.instances")
    if instances:
        return Expected(instances, None, f"spark.executor.instances={instances}")
    cores_max, executor_cores = _int(conf, "spark.cores.max"), _int(conf, "spark.executor.cores")
    if cores_max and executor_cores:
        return Expected(max(1, cores_max // executor_cores), None,
                        f"spark.cores.max={cores_max} / spark.executor.cores={executor_cores}")
    if cores_max:
        return Expected(None, cores_max, f"spark.cores.max={cores_max}")
    return None


def on_cluster(sc: Any) -> bool:
    """Whether ``sc`` runs executors apart from the driver (``local-cluster`` included), not ``local[*]``."""
    master = getattr(sc, "master", None) or ""
    return bool(master) and (not master.startswith("local") or master.startswith("local-cluster"))


def registered(sc: Any, task_cpus: int = 1) -> tuple[int, int]:
    """(executors, cores) registered with the scheduler now (cores: concurrent task slots x
    ``spark.task.cpus``)."""
    from .engines.slots import barrier_slots

    jsc = sc._jsc.sc()
    return int(jsc.getExecutorIds().size()), barrier_slots(sc) * max(1, task_cpus)


_lock = threading.Lock()
_complete: set[str] = set()  # applications that have had every executor they asked for


def wait_for_executors(sc: Any, timeout: float, slots_needed: int | None = None, *, poll: float = 0.1,
                       clock: Callable[[], float] = time.monotonic, count: Callable[..., tuple[int, int]] | None = None,
                       log_every: float = 5.0) -> Registered | None:
    """Block until ``sc``'s application has the executors it asked for, or ``slots_needed`` task
    slots, or ``timeout`` seconds have passed (then warn, naming the shortfall, and return).
    None where nothing is expected (local masters, no count in the conf)."""
    from .connect import is_connect
    from .spark_conf import conf_values

    if not on_cluster(sc) or is_connect(sc):
        # a Spark Connect client sees no executor list: the server's own scheduler waits for them
        # (spark.scheduler.minRegisteredResourcesRatio, docs/connect.md)
        return None
    conf = conf_values(sc, _KEYS)
    expected = expected_executors(sc.master, conf)
    if expected is None:
        return None
    count = count or registered
    task_cpus = _int(conf, "spark.task.cpus") or 1
    app = sc.applicationId
    started = clock()
    with _lock:  # one waiter per process: a fit and the environment check started beside it share the wait
        executors, cores = count(sc, task_cpus)
        if app in _complete:
            if not expected.met(executors, cores):
                log.warning("%d executors (%d cores) registered, fewer than the %s the application asked for (%s): "
                            "executors were lost; training on those left", executors, cores, expected.describe(), expected.source)
            return Registered(executors, cores, expected, clock() - started, expected.met(executors, cores))
        told = None
        while not expected.met(executors, cores) and not (slots_needed and cores // task_cpus >= slots_needed):
            now = clock()
            if now - started >= timeout:
                log.warning(
                    "only %d of the %s the application asked for (%s) registered within %g s (%s): training on %d "
                    "executors (%d task slots)%s", executors, expected.describe(), expected.source, timeout, SETTING,
                    executors, cores // task_cpus,
                    f"; {slots_needed} workers need {slots_needed} slots" if slots_needed else "")
                return Registered(executors, cores, expected, now - started, False)
            if told is None or now - told >= log_every:
                log.info("waiting for executors to register: %d of the %s asked for (%s), up to %.0f s more (%s)",
                         executors, expected.describe(), expected.source, timeout - (now - started), SETTING)
                told = now
            time.sleep(poll)
            executors, cores = count(sc, task_cpus)
        complete = expected.met(executors, cores)
        if complete:
            _complete.add(app)
        seconds = clock() - started
        if told is not None:
            log.info("%d executors (%d cores) registered after %.1f s", executors, cores, seconds)
        return Registered(executors, cores, expected, seconds, complete)
