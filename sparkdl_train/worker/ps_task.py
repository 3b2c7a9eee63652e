"""Executor side of the parameter-server engine: train a partition, pushing deltas.

Dense weights travel whole; embedding tables named in :class:`PSSettings`
travel by rows (:mod:`sparkdl_train.worker.row_sync`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..data.batching import Batch
from ..merge import Partial, WeightedMean
from ..model_io import get_metric_state
from ..net.tls import TlsIdentity
from ..ps.client import PSClient
from .report import ReportSettings
from .row_sync import Lookahead, SparseTable, TableSync
from .steps import run_steps
from .tasks import PartitionPass, Ref, StepSettings, on_task_device

MAX_LOOKAHEAD = 256  # batches read ahead to know which table rows a window needs


@dataclass(frozen=True)
class PSSettings:
    """Where the server is and how often to push (plain data)."""

    host: str
    port: int
    secret: bytes
    every: int | None  # push every N steps; None: once, at the end of the partition
    scale: float = 1.0  # multiplies each delta before it is pushed
    timeout: float = 660.0
    connect_timeout: float = 30.0
    tables: tuple[SparseTable, ...] = ()  # embedding tables pushed and pulled by rows
    tls: TlsIdentity | None = None  # the server's pinned certificate (no key), when the fit uses TLS
    wire: str | None = None  # ps.compression: deltas and replies as float16 / bfloat16 ("fp16", "bf16")
    # the positions in model.weights the server holds, in its order (sparkdl_train.roles: floating weights and
    # statistics); None: every weight. The others (integer state) keep the driver's values and come back merged.
    exchanged: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PSTrainTask:
    payload: Ref
    state: Ref
    epoch: int
    settings: StepSettings
    ps: PSSettings
    report: ReportSettings | None = None

    @on_task_device
    def __call__(self, partition: int, chunks: Iterable[Batch], *, device: str | None = None) -> Partial:
        run = PartitionPass(self.payload, self.state, self.settings, partition, device=device, epoch=self.epoch, report=self.report)
        model, ps = run.model, self.ps  # optimizer slots from the driver's broadcast
        ahead = Lookahead(run.batches(chunks))
        sync = TableSync(model, ps.tables, exchanged=ps.exchanged)  # with no tables every weight travels whole
        # with tables, read the next window ahead so that only its rows are pulled
        window = ps.every if ps.tables and ps.every is not None and ps.every <= MAX_LOOKAHEAD else None

        def want() -> dict[int, np.ndarray] | None:
            return sync.want(ahead.peek(window)) if window else None

        with PSClient(ps.host, ps.port, ps.secret, partition, ps.timeout, ps.connect_timeout, tls=ps.tls,
                      wire=ps.wire) as client:
            t0 = time.perf_counter()
            wanted = want()
            version, fresh = client.pull(wanted)
            sync.receive(fresh, wanted)
            run.startup["first_pull"] = time.perf_counter() - t0  # connect, handshake, first weights
            mark = {"version": version, "steps": 0, "samples": 0, "pushes": 0}
            spent = {"sync": 0.0, "round_trip": 0.0}  # this worker's share of a push, and the server's

            def push(steps: int, samples: int) -> None:
                t0 = time.perf_counter()
                delta = sync.delta(ps.scale)
                wanted = want()
                t1 = time.perf_counter()
                version, fresh = client.push(delta, mark["version"], samples - mark["samples"], wanted)
                t2 = time.perf_counter()
                sync.receive(fresh, wanted)
                spent["sync"] += (t1 - t0) + (time.perf_counter() - t2)
                spent["round_trip"] += t2 - t1
                mark.update(version=version, steps=steps, samples=samples, pushes=mark["pushes"] + 1)

            def on_batch(steps: int, samples: int) -> None:
                if ps.every is not None and steps - mark["steps"] >= ps.every:
                    push(steps, samples)
                run.reporter(steps, samples, model)

            # settings.group divides ps.every (ParameterServerEngine.steps_per_call): pushes fall between groups
            samples, steps = run_steps(model, sync.track(ahead), training=True, on_batch=on_batch, startup=run.startup,
                                       group=self.settings.group, tally=run.tally)
            if steps > mark["steps"]:
                push(steps, samples)
            client.done()
            run.finish(steps, samples)
            info = run.info(samples, steps, pushes=mark["pushes"], bytes_sent=client.bytes_sent,
                            bytes_received=client.bytes_received, push_sync_seconds=round(spent["sync"], 4),
                            push_round_trip_seconds=round(spent["round_trip"], 4))
        if samples == 0:
            return Partial(partitions={partition: info})
        # the optimizer's state, then the weights the server does not hold (integer state: merged by maximum)
        kept = [np.asarray(v.numpy()) for v in [*model.optimizer.variables, *local_weights(model, ps.exchanged)]]
        return Partial(
            samples=samples,
            batches=steps,
            model=WeightedMean.of(kept, samples),
            metrics=get_metric_state(model),
            partitions={partition: info},
        )


def local_weights(model, exchanged: tuple[int, ...] | None) -> list:
    """The variables of ``model.weights`` the parameter server does not hold (none when ``exchanged`` is None)."""
    if exchanged is None:
        return []
    held = set(exchanged)
    return [w for i, w in enumerate(model.weights) if i not in held]
