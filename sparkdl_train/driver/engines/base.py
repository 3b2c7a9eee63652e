"""The engine contract: what every training engine provides to ``SparkModel.fit``.

An engine decides how one epoch's work runs on the executors and how the workers' updates
merge. ``fit`` drives every engine the same way::

    launch = Engine.plan(config, sc, train)          # before anything starts: slots, partitions
    with Engine(config, model, sc, launch) as engine: # its servers live exactly this long
        for epoch ...:
            logs, stats = engine.train_epoch(EpochContext(...))
            # on a cancelled epoch: engine.stopped(model)
    sm.stats.server = engine.stats()

Override points (each engine module documents its own):

* :meth:`Engine.plan` (classmethod): how many workers, whether the stage is a barrier stage
  (one partition per rank, repartitioned, never coalesced), and every check that must fail
  *before* launch (task slots, dynamic allocation). Default: ``num_workers`` or the
  cluster's default parallelism, no barrier.
* ``__init__`` / ``__enter__`` / ``__exit__``: build and start what the fit needs (a parameter
  server), always released on exit.
* :meth:`Engine.train_epoch`: run the epoch (usually through :func:`run_epoch`) and leave the
  merged state in the driver's model; return the epoch's logs and :class:`EpochStats`.
* :meth:`Engine.stopped`: the epoch was cancelled midway; set the weights the driver keeps.
* :meth:`Engine.stats`: what ``sm.stats.server`` shows.
* :meth:`Engine.steps_per_call` (classmethod): how many batches its workers may run per call of
  their compiled step (``StepSettings.group``), e.g. a divisor of the push interval.
* :meth:`Engine.sparse_tables` (classmethod): the embedding tables whose gradients its fused step
  exchanges by rows (``StepSettings.sparse_tables``).
* :attr:`Engine.step`: the compiled step its workers run (``"train"`` or ``"fused"``), traced
  ahead on the executors by the fit's prepare job.

Engines are registered by mode in :mod:`sparkdl_train.driver.engines`; adding one is a new
module with an :class:`Engine` subclass and a :func:`~sparkdl_train.driver.engines.register` call.
"""

from __future__ import annotations

import logging
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from ...config import EngineConfig
from ...data.adapters import DataAdapter
from ...errors import ConfigError, DataError
from ...merge import Partial
from ...model_io import metrics_result, set_metric_state
from ...net import tls
from ...worker.tasks import EvaluateTask, StepSettings
from ..connect import client_address, is_connect
from ..executors import locate
from ..monitor import FitMonitor
from ..phases import Phases
from ..shared_refs import SharedRefs
from ..spark_conf import conf_values
from ..stats import EpochStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launch:
    """How an engine's epochs are launched: ``workers`` partitions (one task each), as a barrier
    stage or not, and whether the fit's sockets use TLS (decided once per fit, :func:`use_tls`)."""

    workers: int
    barrier: bool = False
    tls: bool = False


@dataclass
class EpochContext:
    """Everything one epoch's work needs from the fit (plain references, no engine state)."""

    model: Any
    train: DataAdapter
    refs: SharedRefs
    settings: StepSettings
    epoch: int
    epochs: int
    monitor: FitMonitor
    phases: Phases = field(default_factory=Phases)  # the driver's time in this epoch, by phase
    # the last epoch a stage that starts at this one may run (allreduce.epochsPerStage): the fit's last,
    # or an earlier one after which a validation job runs
    stage_end: int | None = None
    label: str | None = None  # what the pass is, when not an epoch of a fit (a stream's micro-batch)

    @property
    def description(self) -> str:
        return f"sparkdl_train fit: {self.label or f'epoch {self.epoch + 1}/{self.epochs}'}"


class Engine:
    """Base class of the training engines (see the module docstring for the contract)."""

    name = "engine"
    # the compiled step its workers run, which a prepare task traces before the first epoch
    # (sparkdl_train.driver.prepare): "train" (Keras' train_step) or "fused" (allreduce)
    step = "train"
    # whether its tasks connect to a server of its own in the driver's process (a Spark Connect
    # client checks first that executors can reach it: sparkdl_train.driver.connect)
    serves_workers = False

    def __init__(self, config: EngineConfig, model: Any, sc: Any, launch: Launch):
        self.config = config
        self.workers = launch.workers
        self.launch = launch

    @classmethod
    def plan(cls, config: EngineConfig, sc: Any, train: DataAdapter) -> Launch:
        return Launch(workers=config.num_workers or default_workers(sc, train))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    @classmethod
    def steps_per_call(cls, config: EngineConfig) -> int:
        """How many consecutive batches its workers may run per call of their compiled step
        (``StepSettings.group``; default: ``steps_per_execution``)."""
        return config.core.steps_per_execution

    @classmethod
    def sparse_tables(cls, config: EngineConfig, model: Any, workers: int, batch_size: int) -> tuple[tuple[int, int], ...]:
        """``(position in model.weights, the most rows a batch looks up)`` of the tables whose gradients
        leave by rows (default: none)."""
        return ()

    def train_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        raise NotImplementedError

    def stopped(self, model: Any) -> None:
        """An epoch was cancelled midway (default: the driver keeps the weights it started it with)."""

    def reload(self, model: Any) -> None:
        """The driver's model was changed between passes (a stream's reset rows): weights the engine keeps
        apart from it follow (default: none; each pass starts from the driver's state)."""

    def stats(self) -> dict[str, Any] | None:
        return None


def default_workers(sc: Any, train: DataAdapter) -> int:
    return sc.defaultParallelism if sc is not None else train.num_partitions()


def use_tls(config: EngineConfig, sc: Any) -> bool:
    """Whether this fit's sockets use TLS (``spark.sparkdl_train.network.tls``; ``auto`` follows
    Spark's own encryption and authentication settings)."""
    conf = conf_values(sc, tls.SPARK_SECURITY_KEYS) if sc is not None and config.core.tls == "auto" else {}
    return tls.wanted(config.core.tls, conf)


def driver_host(config: EngineConfig, sc: Any) -> str:
    """The address driver-side servers bind and executors connect to (on a Spark Connect session,
    this client's address on its route to the server: the driver's servers run here)."""
    if config.core.host is None and is_connect(sc):
        return client_address(sc.session)
    return config.core.host or (conf_values(sc, ["spark.driver.host"]).get("spark.driver.host") if sc is not None else None) \
        or socket.gethostname()


def server_host(config: EngineConfig, sc: Any) -> str:
    """:func:`driver_host`, for a server the executors connect to: a loopback address while executors run on
    other hosts fails here, before any training stage, naming the settings (they would time out connecting)."""
    host = driver_host(config, sc)
    if sc is None or not _loopback(host):
        return host
    from ..executors import executor_hosts

    elsewhere = sorted({h for e, h in executor_hosts(sc).items() if e != "driver" and h and not _this_machine(h)})
    if elsewhere:
        setting = ("spark.sparkdl_train.ps.host" if config.core.host else
                   "spark.driver.host (or spark.sparkdl_train.ps.host, for sparkdl_train's servers alone)")
        raise ConfigError(f"the driver's servers would listen on {host}, a loopback address, but executors run on "
                          f"{', '.join(elsewhere)}: set {setting} to an address of this machine they can reach")
    return host


def _this_machine(host: str) -> bool:
    """Whether ``host`` is an address of this machine (an executor there reaches the driver's loopback)."""
    if _loopback(host):
        return True
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host.strip("[]"), 0))  # only this machine's own addresses can be bound
        return True
    except OSError:
        return False


def _loopback(host: str) -> bool:
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


def evaluate_logs(model: Any, adapter: DataAdapter, refs: SharedRefs, settings: StepSettings, description: str) -> dict[str, float]:
    """Globally correct metrics of the driver model's weights over ``adapter``."""
    state = refs.state_ref(adapter, model, include_optimizer=False)
    try:
        task = EvaluateTask(refs.payload_ref(adapter), state, settings)
        partial = adapter.map_reduce(task, description)
    finally:
        adapter.unshare(state)
    if partial.samples == 0 or partial.metrics is None:
        raise DataError(f"{description}: no samples to evaluate")
    set_metric_state(model, partial.metrics)
    return metrics_result(model)


_WARNED_IDLE_GPUS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # fits (their monitors) told about idle GPUs


def idle_gpus(partitions: dict[int, dict[str, Any]]) -> dict[int, list[str]]:
    """The tasks Spark gave more than one GPU (partition -> its GPU addresses): each trains on the
    first (sparkdl_train.worker.gpu), so the others sit idle."""
    return {p: list(i["gpus"]) for p, i in sorted(partitions.items()) if len(i.get("gpus") or ()) > 1}


def warn_idle_gpus(fit: Any, partitions: dict[int, dict[str, Any]]) -> None:
    """Warn, once per ``fit`` (its monitor), when tasks were given GPUs they leave idle."""
    several = idle_gpus(partitions)
    if not several or fit in _WARNED_IDLE_GPUS:
        return
    _WARNED_IDLE_GPUS.add(fit)
    p, gpus = next(iter(several.items()))
    log.warning("%d task(s) were given several GPUs (partition %d: %s) but a task trains on one, so %d GPU(s) sat idle: "
                "set spark.task.resource.gpu.amount=1 (and spark.executor.resource.gpu.amount to the GPUs per executor) "
                "so that every GPU runs a task of its own", len(several), p, gpus, sum(len(g) - 1 for g in several.values()))


def run_epoch(
    ctx: EpochContext,
    make_task: Callable[[Any, Any, Any], Any],
    launch: Callable[[Any, str], Partial] | None = None,
    abort: Callable[[], BaseException | None] | None = None,
) -> tuple[Partial, EpochStats]:
    """Broadcast the driver's state, run ``make_task(payload_ref, state_ref, report_settings)``
    on every partition (through ``launch``, default ``train.map_reduce``, driven by the
    fit's monitor), record where each task ran, merge. ``abort()``: the epoch's error once the driver's
    side knows it failed (a server's timeout), which ends it at once (:meth:`FitMonitor.run`)."""
    model, train, refs, epoch = ctx.model, ctx.train, ctx.refs, ctx.epoch
    start = time.perf_counter()
    with ctx.phases("broadcast"):
        payload = refs.payload_ref(train)  # once per fit (released by refs)
        state = refs.state_ref(train, model, include_optimizer=True)
    launch = launch or train.map_reduce
    try:
        task = make_task(payload, state, ctx.monitor.report_settings(epoch))
        with ctx.phases("job"):
            partial: Partial = ctx.monitor.run(epoch, lambda: launch(task, ctx.description), abort=abort)
    finally:
        train.unshare(state)
    locate(train.spark_context(), partial.partitions)
    warn_idle_gpus(ctx.monitor, partial.partitions)
    n_parts = train.num_partitions()
    empty = sorted(set(range(n_parts)) - {p for p, i in partial.partitions.items() if i.get("samples", 0) > 0})
    if partial.samples == 0:
        raise DataError(f"epoch {epoch + 1}: none of the {n_parts} partitions holds a training sample")
    if empty:
        log.warning(
            "epoch %d: %d of %d partitions were empty (%s); they did not take part in the average",
            epoch + 1, len(empty), n_parts, empty[:10],
        )
    stats = EpochStats(
        epoch=epoch,
        samples=partial.samples,
        batches=partial.batches,
        seconds=time.perf_counter() - start,
        partitions=dict(sorted(partial.partitions.items())),
        empty_partitions=empty,
    )
    return partial, stats
