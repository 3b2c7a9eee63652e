"""Preflight: can the executors run sparkdl_train at all?

A cluster whose executors run a Python without sparkdl_train (or with another version of it, or
of Keras) fails deep inside the first training stage with a ``ModuleNotFoundError`` wrapped in a
Py4J trace, or worse, trains with mismatched code. Before a fit's first stage,
:func:`check_executors` runs one tiny job, one task per default-parallelism slot: each task
imports sparkdl_train, keras and tensorflow and reports what it found (versions, module files,
its interpreter). The probe function is shipped *by value* (it is compiled into a module that
exists only on the driver), so it runs even where sparkdl_train cannot be imported. The result
is compared with the driver's (:func:`problems`, pure) and a missing or mismatched environment
fails in seconds with a :class:`~sparkdl_train.errors.ConfigError` naming the executor, what it
found, and the fix. A success is cached per SparkContext (its application id) and kind of stage
(RDD or DataFrame), so the check costs one job per application and kind; its tasks also import
TensorFlow into the Python workers that Spark then reuses for training. A fit starts it on a
helper thread (:func:`start_check`) and waits for it only before its first stage, so the
executors' imports overlap the driver's own preparation; :func:`sparkdl_train.warm_up` starts it
as soon as a session exists.

``spark.sparkdl_train.preflight=false`` skips it; ``spark.sparkdl_train.preflight.timeout``
(seconds, default 300) bounds the wait for executors, e.g. while they unpack a large archive.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from typing import Any

from ..backend import capabilities
from ..errors import ConfigError
from ..worker.identity import find_executor_id
from .background import SparkCall

log = logging.getLogger(__name__)


def modules_for(keras_backend: str) -> tuple[str, ...]:
    """What the probe imports: sparkdl_train, Keras and the backend's framework."""
    return ("sparkdl_train", "keras", capabilities(keras_backend).framework)


ALSO = {"sparkdl_train": ("sparkdl_train.worker.tasks",)}
FIX = (
    "Ship the driver's environment to the executors: build it with `./run pack` (sparkdl_env.tar.gz, a regular "
    "install of sparkdl_train and its dependencies) and submit with --archives sparkdl_env.tar.gz#environment "
    "--conf spark.pyspark.python=./environment/bin/python (README, 'Clusters'), or install the same sparkdl_train "
    "and Keras versions into the executors' Python. spark.sparkdl_train.preflight=false skips this check."
)

# Compiled into a module of its own that exists only on the driver, so cloudpickle ships the
# function by value: it needs nothing but the standard library (and pyspark) on the executor.
_PROBE_SOURCE = '''
def probe(index, _rows):
    import importlib, json, os, socket, sys
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
    except Exception:
        ctx = None
    out = {
        "partition": index, "host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
        "python": sys.executable, "python_version": "%d.%d.%d" % tuple(sys.version_info[:3]),
        "stage": ctx.stageId() if ctx else None, "task": ctx.taskAttemptId() if ctx else None,
        "executor": find_executor_id(),
        "modules": {},
    }
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
            if name == "keras":
                out["keras_backend"] = mod.backend.backend()
            for part in ALSO.get(name, ()):  # the package itself loads lazily: import what tasks run
                importlib.import_module(part)
            out["modules"][name] = {"version": str(getattr(mod, "__version__", "")), "file": getattr(mod, "__file__", None)}
        except BaseException as exc:
            out["modules"][name] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    # where pyspark came from (Spark's pyspark.zip on executors), and the worker daemon's store of its compiled code
    out["pyspark"] = getattr(sys.modules.get("pyspark"), "__file__", None)
    cache = sys.modules.get("sparkdl_train.worker.code_cache")
    store = getattr(getattr(cache, "CachingZipImporter", None), "store", None)
    out["code_cache"] = {"folder": store.folder, "hits": cache.hits, "misses": cache.misses} if store is not None else None
    # the executor's zygote this worker's daemon is (sparkdl_train.jvm's plugin; where one served, sparkdl_train is there)
    out["zygote"] = None
    if os.environ.get("SPARKDL_TRAIN_ZYGOTE_DAEMON"):
        try:
            from sparkdl_train.worker.zygote import served_by
            out["zygote"] = served_by()
        except Exception:
            pass
    yield json.dumps(out)


def probe_arrow(batches):
    # the same probe as a DataFrame (mapInArrow) stage: it runs in the Python workers that DataFrame
    # stages use, which Spark keeps apart from RDD tasks' (another daemon: another TensorFlow import)
    import pyarrow
    from pyspark import TaskContext
    for _ in batches:
        pass
    ctx = TaskContext.get()
    yield pyarrow.RecordBatch.from_pydict({"report": list(probe(ctx.partitionId() if ctx else 0, None))})
'''

_checked: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
_pending: dict[tuple[str, str, str], "PendingCheck"] = {}
_lock = threading.Lock()


def _probe_function(name: str = "probe", keras_backend: str = "tensorflow") -> Any:
    namespace: dict[str, Any] = {"__name__": "sparkdl_train_executor_probe", "MODULES": modules_for(keras_backend), "ALSO": ALSO}
    source = _PROBE_SOURCE + "\n\n" + inspect.getsource(find_executor_id)  # by value, as the probe itself
    exec(compile(source, "<sparkdl_train executor probe>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace[name]


def _key(sc: Any, session: Any, keras_backend: str = "tensorflow") -> tuple[str, str, str]:
    return (sc.applicationId, "rdd" if session is None else "arrow", keras_backend)


def driver_versions() -> dict[str, str]:
    import keras

    from .. import __version__

    return {"sparkdl_train": __version__, "keras": keras.__version__, "keras_backend": keras.backend.backend()}


def _minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def problems(driver: dict[str, str], report: dict[str, Any]) -> list[str]:
    """What stops one executor's environment from running the driver's sparkdl_train (pure)."""
    mods = report.get("modules", {})
    out = []
    wanted = driver.get("keras_backend", "tensorflow")
    for name in modules_for(wanted):
        got = mods.get(name) or {"error": "not reported"}
        if "error" in got:
            out.append(f"cannot import {name} ({got['error']})")
    sdt = mods.get("sparkdl_train", {})
    if "version" in sdt and sdt["version"] != driver["sparkdl_train"]:
        out.append(f"sparkdl_train {sdt['version']} from {sdt.get('file')}, but the driver runs {driver['sparkdl_train']}")
    ks = mods.get("keras", {})
    if "version" in ks and _minor(ks["version"]) != _minor(driver["keras"]):
        out.append(f"keras {ks['version']}, but the driver runs keras {driver['keras']} (major.minor must match)")
    got = report.get("keras_backend")
    if got is not None and got != wanted:
        out.append(f"Keras runs on the {got!r} backend there, but the driver's model on {wanted!r} (set "
                   f"spark.executorEnv.KERAS_BACKEND={wanted}; sparkdl_train sets it for its own stages unless the "
                   f"application's spark.executorEnv.KERAS_BACKEND says otherwise)")
    return out


def describe(report: dict[str, Any]) -> str:
    executor = report.get("executor_id") or "?"
    return (f"executor {executor} (host {report.get('host')}, pid {report.get('pid')}, "
            f"python {report.get('python')} {report.get('python_version')})")


def check_executors(sc: Any, timeout: float | None = None, force: bool = False, session: Any = None) -> list[dict[str, Any]]:
    """Run the environment check on ``sc``'s executors (once per application unless ``force``);
    returns one report per probe task, each with the ``executor_id`` that ran it. Raises
    :class:`ConfigError` when an executor cannot run the driver's sparkdl_train.

    With a SparkSession ``session`` the probe runs as a DataFrame (``mapInArrow``) stage, in the
    Python workers DataFrame training uses; without, as an RDD stage (the workers RDD training
    uses). Spark starts separate worker daemons for the two unless
    ``spark.sparkdl_train.worker.shareDaemon`` joins them, and each imports TensorFlow once:
    checking through the kind of stage the fit will run pays that import where it is reused.

    With ``timeout=None`` the ``spark.sparkdl_train.preflight*`` keys decide (``preflight=false``:
    nothing is checked and ``[]`` is returned)."""
    from ..config import EngineConfig
    from .backend_env import executor_backend
    from .executors import executor_ids
    from .registration import wait_for_executors
    from .spark_conf import settings_conf

    cfg = EngineConfig.resolve(settings_conf(sc))
    if timeout is None:
        if not cfg.core.preflight:
            return []
        timeout = cfg.core.preflight_timeout
    # the probe's workers run the driver's backend, as a fit's would (KERAS_BACKEND for the stages: a job that
    # checks its executors before its first fit, sparkdl_train.driver.submit.start_job, has made no fit yet)
    keras_backend = executor_backend(sc)
    key = _key(sc, session, keras_backend)
    with _lock:
        if key in _checked and not force:
            return _checked[key]
    # every executor the application asked for is checked (and starts its Python workers), not the first to register
    wait_for_executors(sc, cfg.core.registration_timeout)
    n = max(1, int(sc.defaultParallelism))
    if session is None:
        rows = _collect_with_timeout(sc, sc.parallelize(range(n), n).mapPartitionsWithIndex(_probe_function(keras_backend=keras_backend)), timeout)
    else:
        frame = session.range(0, n, 1, n).mapInArrow(_probe_function("probe_arrow", keras_backend), "report string")
        rows = [r[0] for r in _collect_with_timeout(sc, frame, timeout)]
    reports = [json.loads(r) for r in rows]
    found = executor_ids(sc, ((r.get("stage"), r.get("task")) for r in reports))
    for r in reports:
        r["executor_id"] = (found.get(r["task"]) if r.get("task") is not None else None) or r.get("executor")
    driver = driver_versions()
    bad = [(r, p) for r in reports for p in [problems(driver, r)] if p]
    if bad:
        seen: set[tuple] = set()
        lines = []
        for r, p in bad:
            k = (r.get("executor_id"), r.get("host"), r.get("python"), tuple(p))
            if k not in seen:
                seen.add(k)
                lines.append(f"  {describe(r)}: " + "; ".join(p))
        raise ConfigError(
            f"the executors' Python environment cannot run this driver's sparkdl_train {driver['sparkdl_train']} "
            f"(keras {driver['keras']}):\n" + "\n".join(lines) + "\n" + FIX
        )
    with _lock:
        _checked[key] = reports
    log.info("preflight: %d executor task(s) on %s import sparkdl_train %s", len(reports),
             sorted({str(r.get("executor_id")) for r in reports}), driver["sparkdl_train"])
    return reports


def forget(sc: Any) -> None:
    """Drop the cached results for ``sc`` (the next fit checks again)."""
    with _lock:
        for key in [k for k in _checked if k[0] == sc.applicationId]:
            _checked.pop(key, None)


def cached(sc: Any) -> list[dict[str, Any]] | None:
    with _lock:
        return _checked.get((sc.applicationId, "rdd")) or _checked.get((sc.applicationId, "arrow"))


class PendingCheck:
    """An environment check running on a helper thread (:func:`start_check`): the driver goes on
    preparing a fit (serializing the model, sampling the data, tracing its own test step) while the
    executors start their Python workers and import TensorFlow. :meth:`result` waits for it."""

    def __init__(self, run: Any, timeout: float):
        self._timeout = timeout
        self._box: dict[str, Any] = {}
        self._done = threading.Event()

        def target() -> None:
            try:
                self._box["reports"] = run()
            except BaseException as exc:  # noqa: BLE001 - raised by result()
                self._box["error"] = exc
            finally:
                self._done.set()

        self._thread = threading.Thread(target=target, name="sparkdl_train-preflight-start", daemon=True)

    @classmethod
    def finished(cls, reports: list[dict[str, Any]]) -> "PendingCheck":
        done = cls(lambda: reports, 0.0)
        done._box["reports"] = reports
        done._done.set()
        return done

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the check has ended (passed or failed), after waiting up to ``timeout`` seconds."""
        return self._done.wait(timeout)

    def result(self) -> list[dict[str, Any]]:
        """The reports, or the check's :class:`ConfigError`. The check cancels its own job after its
        timeout; this wait adds a margin for the cancellation and never blocks forever."""
        if not self._done.wait(self._timeout + 60.0):
            raise ConfigError(f"the executors' environment check did not end within {self._timeout + 60:g} s")
        if "error" in self._box:
            raise self._box["error"]
        return self._box["reports"]


def start_check(sc: Any, timeout: float, session: Any = None) -> PendingCheck:
    """:func:`check_executors` on a helper thread; a check already cached or under way for this
    application (and kind of stage, and Keras backend) is shared, not run twice."""
    key = _key(sc, session, driver_versions()["keras_backend"])
    with _lock:
        if key in _checked:
            return PendingCheck.finished(_checked[key])
        running = _pending.get(key)
        if running is not None and not running.done():
            return running

        def run() -> list[dict[str, Any]]:
            try:
                return check_executors(sc, timeout=timeout, session=session)
            finally:
                with _lock:
                    if _pending.get(key) is pending:
                        del _pending[key]

        pending = PendingCheck(run, timeout)
        _pending[key] = pending
    pending._thread.start()
    return pending


def _collect_with_timeout(sc: Any, rdd: Any, timeout: float) -> list[Any]:
    """``rdd.collect()`` (an RDD's or a DataFrame's) on a helper thread, cancelled after ``timeout`` seconds (executors that never
    start, or a cluster with no free slots, must not hang the fit)."""
    call = SparkCall(sc, rdd.collect, "sparkdl_train-preflight", "sparkdl_train: executor environment check")
    if not call.wait(timeout):
        call.cancel(30)
        raise ConfigError(
            f"no executor ran sparkdl_train's environment check within {timeout:g} s: are executors starting and "
            "is there a free task slot? (spark.sparkdl_train.preflight.timeout sets this wait)\n" + FIX
        )
    try:
        return call.result()
    except BaseException as exc:  # noqa: BLE001 - reported as the environment's problem
        from ..failures import Cause, classify

        failure = classify(exc)
        if failure is not None and failure.cause is Cause.CONTAINER_MEMORY:  # importing TensorFlow went over the limit
            raise ConfigError(f"the executors could not run sparkdl_train's environment check: {failure.summary}") from exc
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ConfigError(
            f"the executors could not run sparkdl_train's environment check (their Python did not start or "
            f"crashed): {type(exc).__name__}: {first[:500]}\n{FIX}"
        ) from exc
