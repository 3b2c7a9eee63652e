"""Where tasks ran: the executor ids Spark's scheduler recorded for a fit's tasks.

A task knows its stage and its application-wide task id (``TaskContext``), but not its
executor's id; the driver does. After a stage, :func:`locate` looks the task ids up in
Spark's status store (the data behind the Spark UI and its REST API) and adds
``executor_id`` to each partition's statistics. In local mode that id is ``"driver"``; on a
cluster, the executor's id as the Spark UI shows it. Best effort: the status store is filled
by an asynchronous listener, so a task not found within ``wait`` seconds (or a Spark without
that API) gets ``None`` and a debug log.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

log = logging.getLogger(__name__)


def executor_ids(sc: Any, tasks: Iterable[tuple[int, int]], wait: float = 3.0) -> dict[int, str]:
    """``{task id: executor id}`` for ``tasks``, an iterable of ``(stage id, task id)``."""
    wanted: dict[int, set[int]] = {}
    for stage, task in tasks:
        if stage is not None and task is not None:
            wanted.setdefault(int(stage), set()).add(int(task))
    found: dict[int, str] = {}
    if not wanted:
        return found
    try:
        store = sc._jsc.sc().statusStore()
    except Exception as exc:  # noqa: BLE001 - not a JVM-backed context
        log.debug("no status store to locate tasks: %s", exc)
        return found
    deadline = time.monotonic() + wait
    while True:
        for stage, ids in wanted.items():
            missing = ids - found.keys()
            if missing:
                found.update(_lookup(store, stage, missing))
        if all(ids <= found.keys() for ids in wanted.values()) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    lost = sorted(t for ids in wanted.values() for t in ids - found.keys())
    if lost:
        log.debug("tasks %s are not in Spark's status store yet; their executor is unknown", lost[:10])
    return found


def _lookup(store: Any, stage: int, ids: set[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        last = store.lastStageAttempt(stage).attemptId()
        for attempt in range(last + 1):
            tasks = store.taskList(stage, attempt, 1 << 30)
            for i in range(tasks.size()):
                td = tasks.apply(i)
                if td.taskId() in ids:
                    out[int(td.taskId())] = str(td.executorId())
    except Exception as exc:  # noqa: BLE001 - the stage is not recorded yet, or the API changed
        log.debug("stage %d: cannot read its tasks from the status store: %s", stage, exc)
    return out


def locate(sc: Any, partitions: dict[int, dict[str, Any]]) -> None:
    """Add ``executor_id`` to every partition's statistics that carries a Spark task id: the status
    store's, else the one the task found itself (``executor``: a Spark Connect client has no status
    store; a task not yet recorded)."""
    if sc is None:
        return
    found = executor_ids(sc, ((info.get("stage"), info.get("task")) for info in partitions.values()))
    for info in partitions.values():
        if info.get("task") is not None:
            info["executor_id"] = found.get(int(info["task"])) or info.get("executor")


def removed_executors(sc: Any) -> dict[str, str]:
    """``{executor id: the reason Spark recorded}`` for the executors of this application that are gone
    (killed, lost, released), from the status store; ``{}`` where it cannot be read (no JVM context)."""
    out: dict[str, str] = {}
    try:
        executors = sc._jsc.sc().statusStore().executorList(False)
        for i in range(executors.size()):
            e = executors.apply(i)
            if not e.isActive():
                reason = e.removeReason()
                out[str(e.id())] = str(reason.get()) if reason.isDefined() else ""
    except Exception as exc:  # noqa: BLE001 - a Connect session, a stopped context, or the API changed
        log.debug("cannot read the removed executors from the status store: %s", exc)
    return out


def executor_hosts(sc: Any) -> dict[str, str]:
    """``{executor id: the host Spark knows it by}`` for every executor of this application (the
    address its Worker or NodeManager advertised), from the status store; ``{}`` where it cannot be read."""
    out: dict[str, str] = {}
    try:
        executors = sc._jsc.sc().statusStore().executorList(False)
        for i in range(executors.size()):
            e = executors.apply(i)
            out[str(e.id())] = str(e.hostPort()).rsplit(":", 1)[0]
    except Exception as exc:  # noqa: BLE001 - a Connect session, a stopped context, or the API changed
        log.debug("cannot read the executors' hosts from the status store: %s", exc)
    return out


def memory_kill_since(sc: Any, before: set[str]):
    """The first executor gone since ``before`` (ids :func:`removed_executors` listed then) that its cluster
    manager killed for its memory (:func:`sparkdl_train.failures.memory_kill`); ``None`` when none was."""
    from ..failures import memory_kill

    return memory_kill({k: v for k, v in removed_executors(sc).items() if k not in before})
