"""The driver-hosted parameter server engine: every mode and frequency but synchronous/epoch.

A parameter server runs in the driver for the whole fit; workers pull weights, train, and push
weight deltas every N steps (or once per partition); the server merges them by the mode's rule
(:mod:`sparkdl_train.ps.state`). Embedding tables fed by a model input travel by rows: a worker
pushes the rows its batches touched and pulls the rows its next batches look up
(:mod:`sparkdl_train.worker.row_sync`).
"""

from __future__ import annotations

import logging
from typing import Any

from ...config import EngineConfig
from ...data.adapters import DataAdapter
from ...errors import WorkerError
from ...failures import Cause
from ...model_io import assign, exchanged_positions, metrics_result, set_metric_state, set_optimizer_state
from ...net import new_identity, new_secret
from ...ps.protocol import dense_exchange_bytes
from ...ps.server import ParameterServer
from ...ps.state import ServerState, straggler
from ...worker.ps_task import PSSettings, PSTrainTask, local_weights
from ...worker.steps import largest_divisor
from ..executors import executor_hosts
from ..sparse_tables import find_tables
from ..stats import EpochStats
from .base import Engine, EpochContext, Launch, run_epoch, server_host
from .slots import check_concurrent_slots

log = logging.getLogger(__name__)


class ParameterServerEngine(Engine):
    """A driver-hosted parameter server for the duration of one fit."""

    name = "parameter_server"
    serves_workers = True

    @classmethod
    def plan(cls, config: EngineConfig, sc: Any, train: DataAdapter) -> Launch:
        launch = super().plan(config, sc, train)
        if config.mode == "synchronous" and sc is not None:
            # every round waits for all workers: one without a slot would stall each round
            check_concurrent_slots(
                sc, launch.workers, config.core.connect_timeout,
                f"mode='synchronous' with frequency={config.frequency!r} needs its {launch.workers} workers running "
                "at once (each round waits for all of them)",
            )
        return launch

    def __init__(self, config: EngineConfig, model: Any, sc: Any, launch: Launch):
        super().__init__(config, model, sc, launch)
        self.sc = sc
        self.stragglers: list[dict[str, Any]] = []
        workers = self.workers
        host = server_host(config, sc)
        self.secret = new_secret()
        self.tables = find_tables(model) if config.ps.sparse_embeddings is not False else ()
        self.wire = config.ps.compression if config.ps.compression not in (None, "none") else None  # ps.compression
        if config.ps.sparse_embeddings and not self.tables:
            log.warning("sparse_embeddings=True, but no embedding table reads its ids from a model input: all weights travel whole")
        # the server holds the floating weights and statistics (sparkdl_train.roles); integer and boolean state
        # (lookup layers' counts, counters) stays with the workers, from the driver's broadcast
        self.exchanged = tuple(exchanged_positions(model))
        at = {i: k for k, i in enumerate(self.exchanged)}
        weights = [model.weights[i].numpy() for i in self.exchanged]
        self.state = ServerState(
            weights,
            config.mode,
            staleness_bound=config.ps.staleness_bound,
            round_timeout=config.ps.round_timeout,
            join_timeout=config.ps.join_timeout,
            sparse=[at[t.index] for t in self.tables],
            shards=config.ps.table_shards,
        )
        self.dense_bytes_per_push = dense_exchange_bytes(weights)
        self.tls = new_identity("sparkdl_train parameter server") if launch.tls else None
        self.server = ParameterServer(self.state, host, self.secret, port=config.ps.port, idle_timeout=config.ps.idle_timeout, tls=self.tls,
                                      ports=config.core.port_range)  # ps.port, when set, lies in it (EngineConfig)
        self.every = push_interval(config)
        # Applied one by one, K full deltas move the model K times as far as one worker would:
        # by default scale them by 1/K so each update counts as one K-th of an averaged step.
        if config.mode in ("asynchronous", "hogwild"):
            self.scale = config.ps.delta_scale if config.ps.delta_scale is not None else 1.0 / workers
        else:
            self.scale = 1.0

    @classmethod
    def steps_per_call(cls, config: EngineConfig) -> int:
        """The largest divisor of the push interval up to ``steps_per_execution``: a worker pushes
        between calls, after the same steps as one step per call would."""
        return group_within(config.core.steps_per_execution, push_interval(config))

    def __enter__(self) -> "ParameterServerEngine":
        self.server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()

    def stats(self) -> dict[str, Any]:
        st = self.state.stats.as_dict()
        per_push = (st["bytes_in"] + st["bytes_out"]) / st["updates"] if st["updates"] else None
        return {
            **st,
            "address": list(self.server.address),
            "peers": sorted(self.server.peers),  # where the workers connected from
            "stragglers": self.stragglers,  # synchronous epochs one worker held (_report_straggler)
            "delta_scale": self.scale,
            "sparse_tables": [t.name for t in self.tables],
            "table_shards": self.state.shards,
            "wire": self.wire or "float32",
            # everything on the wire (handshakes and pulls included) per push ...
            "bytes_per_push": per_push,
            # ... against one dense push and its reply, framing included
            "dense_bytes_per_push": self.dense_bytes_per_push,
            "dense_to_actual_bytes": self.dense_bytes_per_push / per_push if per_push else None,
        }

    def _epoch_failed(self, ctx: EpochContext) -> WorkerError | None:
        """The epoch's error once a synchronous round or a staleness wait of it timed out at the server: its
        workers' pushes all fail from then on, so the fit ends now rather than after Spark's task retries."""
        what = self.state.timed_out()
        if what is None:
            return None
        return WorkerError(f"{ctx.description} failed: {what}", cause=Cause.TIMEOUT.value)

    def _report_straggler(self, before: dict[str, Any], after: dict[str, Any], epoch: EpochStats) -> None:
        """Warn about (and keep, in ``stats()["stragglers"]``) the worker whose pushes the epoch's
        synchronous rounds waited for, naming its executor and host."""
        last = {w: n - before["last_in_round"].get(w, 0) for w, n in after["last_in_round"].items()}
        held = {w: s - before["held_seconds"].get(w, 0.0) for w, s in after["held_seconds"].items()}
        span = after["round_span_seconds"] - before["round_span_seconds"]
        found = straggler(last, held, after["rounds"] - before["rounds"], span)
        if found is None:
            return
        worker, rounds, waited = found
        info = epoch.partitions.get(worker, {})
        executor = info.get("executor_id")
        host = self.executor_hosts.get(str(executor)) if executor is not None else None
        record = {"epoch": epoch.epoch, "worker": worker, "executor_id": executor, "host": host, "last_in_rounds": rounds,
                  "rounds": after["rounds"] - before["rounds"], "others_waited_s": round(waited, 3), "rounds_s": round(span, 3),
                  "epoch_s": round(epoch.seconds, 3)}
        self.stragglers.append(record)
        log.warning("synchronous PS, epoch %d: worker %d (executor %s on %s) came last in %d of %d rounds; the others waited "
                    "%.1f s of the %.1f s its rounds took for it (a slow host, link or partition: the asynchronous modes do not wait)",
                    epoch.epoch + 1, worker, executor, host or "?", rounds, record["rounds"], waited, span)

    @property
    def executor_hosts(self) -> dict[str, str]:
        return executor_hosts(self.sc) if self.sc is not None else {}

    def stopped(self, model: Any) -> None:
        """An epoch was cancelled midway: take the server's weights, the latest there are."""
        self._take_server_weights(model)

    def reload(self, model: Any) -> None:
        """The server's weights become the driver's (between passes: no worker is connected)."""
        self.state.assign([model.weights[i].numpy() for i in self.exchanged])

    def _take_server_weights(self, model: Any) -> None:
        assign([model.weights[i] for i in self.exchanged], self.state.snapshot(), "the server's weights")

    def train_epoch(self, ctx: EpochContext) -> tuple[dict[str, Any], EpochStats]:
        model, settings, epoch = ctx.model, ctx.settings, ctx.epoch
        host, port = self.server.address
        ps = PSSettings(
            host, port, self.secret, self.every, scale=self.scale,
            timeout=self.config.ps.round_timeout + 60, connect_timeout=self.config.core.connect_timeout, tables=self.tables,
            tls=self.tls.for_clients() if self.tls is not None else None,
            wire=self.wire,
            exchanged=None if len(self.exchanged) == len(model.weights) else self.exchanged,
        )
        self.state.begin_epoch(self.workers)
        before = self.state.stats.as_dict()
        partial, stats = run_epoch(ctx, lambda p, s, r: PSTrainTask(p, s, epoch, settings, ps, r),
                                   abort=lambda: self._epoch_failed(ctx))
        if self.config.mode == "synchronous":
            self._report_straggler(before, self.state.stats.as_dict(), stats)
        self._take_server_weights(model)
        if partial.model.sums is not None:
            kept = partial.model.result()  # the optimizer's state, then the weights the server does not hold
            slots = len(model.optimizer.variables)
            set_optimizer_state(model, kept[:slots])
            if ps.exchanged is not None:
                assign(local_weights(model, ps.exchanged), kept[slots:], "the workers' integer state")
        set_metric_state(model, partial.metrics)
        return metrics_result(model), stats


def push_interval(config: EngineConfig) -> int | None:
    """Steps between a worker's pushes (``None``: once, at the end of its partition)."""
    freq = config.frequency
    return None if freq == "epoch" else 1 if freq == "batch" else int(freq)


def group_within(group: int, every: int | None) -> int:
    """The largest divisor of ``every`` not above ``group`` (``group`` itself when ``every`` is ``None``)."""
    return group if every is None else largest_divisor(every, group)
