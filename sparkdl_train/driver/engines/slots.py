"""Task slots: fail before launch, not after minutes of Spark retries, when a stage that needs all
of its tasks running at once (a barrier stage, synchronous parameter-server rounds) cannot get them."""

from __future__ import annotations

import time
from typing import Any

from ...errors import ConfigError
from ..spark_conf import DYNAMIC_ALLOCATION, conf_values, dynamic_allocation


def barrier_slots(sc: Any) -> int:
    """Tasks the cluster can run at once for the default resource profile."""
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # noqa: BLE001 - internal API missing: fall back to the public estimate
        return int(sc.defaultParallelism)


def check_barrier_launch(sc: Any, ranks: int, wait: float) -> int:
    """Fail before launch (not after Spark's minutes of retries) when a barrier stage of
    ``ranks`` tasks cannot be scheduled. Returns the slot count."""
    if _dynamic_allocation(sc):
        raise ConfigError(
            "mode='allreduce' runs as a Spark barrier stage, which Spark does not support with "
            "spark.dynamicAllocation.enabled=true; disable dynamic allocation or use a parameter-server mode"
        )
    return check_concurrent_slots(
        sc, ranks, wait,
        f"mode='allreduce' needs {ranks} task slots at once (one per rank, all in one barrier stage)",
    )


def check_concurrent_slots(sc: Any, ranks: int, wait: float, need: str) -> int:
    """Raise ConfigError (``need`` says why) unless ``ranks`` tasks can run at once; on a cluster,
    wait up to ``wait`` seconds for executors to register first. Returns the slot count."""
    slots = barrier_slots(sc)
    local = sc.master.startswith("local") and not sc.master.startswith("local-cluster")
    if slots < ranks and not local:
        deadline = time.monotonic() + wait  # executors may still be registering
        while slots < ranks and time.monotonic() < deadline:
            time.sleep(0.5)
            slots = barrier_slots(sc)
    if slots < ranks:
        dynamic = _dynamic_allocation(sc)
        raise ConfigError(
            f"{need}, "
            f"but the cluster offers {slots} (executors x cores / spark.task.cpus); lower num_workers "
            "(spark.sparkdl_train.numWorkers) or add executors"
            + ("; under dynamic allocation Spark asks for executors only for tasks already waiting, so set "
               "spark.dynamicAllocation.minExecutors high enough for them, or use mode='asynchronous'" if dynamic else "")
        )
    return slots


def _dynamic_allocation(sc: Any) -> bool:
    return dynamic_allocation(conf_values(sc, [DYNAMIC_ALLOCATION]))
