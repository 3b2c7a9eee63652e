"""Executor side of the allreduce engine: one rank of a barrier stage.

Per epoch (one Spark barrier stage, rank = partition id):

1. rebuild (or reuse) the model and apply the driver's state;
2. rendezvous: bind a listening socket, publish ``host:port`` through
   ``allGather``, connect and authenticate the ring;
3. broadcast rank 0's weights and optimizer state (Horovod semantics);
4. every step: fused weighted gradient -> ring allreduce (sum) -> apply the
   global mean. A rank whose partition is exhausted contributes zeros with
   weight 0; when the summed weight is 0 every rank has finished, so all ranks
   run the same number of allreduces and nobody waits at the end of an epoch;
5. average the non-trainable state (e.g. BatchNorm statistics) so that every
   rank ends with identical weights, and report a digest of them.

A stage may run several epochs (``epochs``, ``spark.sparkdl_train.allreduce.epochsPerStage``): the
first reads the partition from Spark and keeps it in a local file (:mod:`.replay`), the later ones
read it back; the ring and the model stay. Between two epochs each rank hands the driver its
epoch's partial (rank 0's with the state) and waits for its answer (:meth:`DriverGroup.epoch_end`):
go on, or end the stage (the fit stopped, or a callback changed the driver's state).

A failing rank tells the ring (an abort frame naming it, with its traceback)
before it raises, so every rank's error names the rank that failed first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import traceback
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .. import _compat
from ..allreduce import ring, row_gather
from ..allreduce.barrier import BarrierGroup, DriverGroup, RendezvousSettings, SingleGroup
from ..allreduce.buckets import BucketRing
from ..allreduce.transport import Group, PeerAborted, rendezvous
from ..data.batching import Batch, num_rows
from ..errors import RankError, SparkDLError  # RankError: also this module's name for it
from ..halfwidth import BF16
from ..merge import Partial, WeightedMean
from ..model_io import assign, get_metric_state, get_state, set_state, variable_roles
from ..net.tls import TlsIdentity
from ..roles import is_numeric_mergeable, merged
from . import gpu
from .fused_step import cached_fused_step
from .replay import Replay
from .report import ReportSettings
from .row_sync import SparseTable, TouchCounts
from .tasks import PartitionPass, Ref, StepSettings, on_task_device


@dataclass(frozen=True)
class RingSettings:
    secret: bytes
    timeout: float = 600.0
    connect_timeout: float = 30.0
    compression: str | None = None
    lr_scaling: str = "none"
    host: str | None = None  # None: the executor address Spark reports for this task
    tls: TlsIdentity | None = None  # the fit's ring identity (key included: every rank accepts one peer)
    rendezvous: RendezvousSettings | None = None  # the driver's rendezvous server; None: Spark's allGather
    ports: tuple[int, int] | None = None  # network.ports: where a rank's listener (or XLA coordinator) binds
    # "gradients": every step (Horovod); "state": each rank trains its partition, the model's state is averaged at the end
    average: str = "gradients"
    state_sums: str = "float64"  # average="state": the type the weighted state is summed in on the ring
    # average="state": embedding tables whose rows (and optimizer slots) are weighted by the ranks' lookups
    tables: tuple[SparseTable, ...] = ()
    # "ring": this project's ring over sockets; "xla": each rank a process of one JAX job, the gradients
    # summed by XLA's collectives inside the compiled step (sparkdl_train.worker.xla_task)
    collectives: str = "ring"


@dataclass(frozen=True)
class AllreduceTrainTask:
    payload: Ref
    state: Ref
    epoch: int
    settings: StepSettings
    ring: RingSettings
    report: ReportSettings | None = None
    epochs: int = 1  # epochs this stage runs, from ``epoch`` (more than one: through the driver's rendezvous server)

    @on_task_device
    def __call__(self, partition: int, chunks: Iterable[Batch], barrier: Any = None, *, device: str | None = None) -> Partial:
        """One rank: ``barrier`` is the task's BarrierTaskContext (rank = partition id); ``None``
        runs a ring of one (in-process arrays)."""
        if self.ring.collectives == "xla":
            from .xla_task import run_rank

            return run_rank(self, partition, chunks, barrier, device)
        group, host = self.group(barrier)
        rank, size = group.rank, group.size
        link = None
        try:
            run = PartitionPass(self.payload, self.state, self.settings, partition, device=device, epoch=self.epoch, report=self.report)
            t0 = time.perf_counter()
            link = rendezvous(group, self.ring.host or host, self.ring.secret, self.ring.timeout, self.ring.connect_timeout,
                              tls=self.ring.tls, ports=self.ring.ports)
            run.startup["rendezvous"] = time.perf_counter() - t0
            if self.epochs == 1:
                return self._train(run, chunks, link, rank, size)
            return self._epochs(run, chunks, link, group)
        except PeerAborted as exc:
            if link is not None and exc.origin != rank:
                link.abort(exc.origin, exc.detail)  # pass it on round the ring
            raise RankError(f"allreduce rank {rank} of {size} stopped because rank {exc.origin} failed:\n{exc.detail}") from None
        except BaseException as exc:
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if link is not None:
                link.abort(rank, detail)
            if isinstance(exc, SparkDLError):
                raise
            raise RankError(f"allreduce rank {rank} of {size} failed: {type(exc).__name__}: {exc}\n{detail}") from exc
        finally:
            if link is not None:
                link.close()

    def group(self, barrier: Any) -> tuple[Group, str]:
        """The ring's membership and this rank's address, from the barrier stage (Spark's
        ``allGather``, bounded by the ring's timeout)."""
        if barrier is None:
            return SingleGroup(), "127.0.0.1"
        if self.ring.rendezvous is not None:
            group = DriverGroup(barrier, self.ring.timeout, self.ring.rendezvous, self.ring.connect_timeout)
        else:
            group = BarrierGroup(barrier, self.ring.timeout)
        return group, group.address()

    def _epochs(self, run: PartitionPass, chunks: Iterable[Batch], link: Any, group: Any) -> Partial:
        """This stage's epochs on one ring: the partition kept locally after the first."""
        if not hasattr(group, "epoch_end"):
            raise RankError("a stage of several epochs meets through the driver's rendezvous server "
                            "(spark.sparkdl_train.allreduce.rendezvous=driver)")
        replay = Replay()
        place = gpu.placement()  # what on_task_device records on the last epoch's partial, for the others too
        try:
            for k in range(self.epochs):
                epoch = self.epoch + k
                if k:
                    run.next_epoch(epoch, dataclasses.replace(self.report, epoch=epoch) if self.report is not None else None)
                data = replay.first(chunks) if k == 0 else replay.again()
                partial = self._train(run, data, link, group.rank, group.size, broadcast=k == 0)
                partial.partitions[run.partition]["stage_epochs"] = {"index": k, "of": self.epochs,
                                                                     "kept_bytes": replay.bytes, "kept_in": replay.directory}
                partial.partitions[run.partition].update(place)
                if k == self.epochs - 1 or not group.epoch_end(epoch, partial.to_bytes()):
                    return partial
            raise AssertionError("unreachable")
        finally:
            replay.close()

    def _train(self, run: PartitionPass, chunks: Iterable[Batch], link: Any, rank: int, size: int,
               broadcast: bool = True) -> Partial:
        s, r, model = self.settings, self.ring, run.model
        if r.average == "state":
            return self._train_local(run, chunks, link, rank, size, broadcast)
        base_lr = _scale_lr(model, lr_factor(r.lr_scaling, size))
        wire = {"fp16": np.float16, "bf16": BF16}.get(r.compression)

        sent = _link_bytes(link)  # this epoch's bytes are counted from here
        comm = _start_from_rank_0(run, link, rank, size, broadcast)

        step = cached_fused_step(model, s.batch_size, s.bucket_bytes, s.sparse_tables)
        buf = np.empty(step.size, np.float32)
        touched_rows = 0  # rows of sparse tables this rank sent (allreduce.sparseGradients)

        def reduce(view: np.ndarray) -> None:
            if link is not None:
                ring.allreduce_sum(view, link, rank, size, wire_dtype=wire)

        # overlap (allreduce.bucketBytes): the buckets are reduced on a thread as the backward pass hands them over
        buckets = BucketRing(buf, [(lo, hi) for _, _, lo, hi in step.bucket_bounds], reduce, r.timeout,
                             name=f"sparkdl-buckets-{rank}") if step.bucket_bounds else None
        batches = (b for b in run.batches(chunks) if num_rows(b))  # an exhausted generator keeps returning None below
        samples = local_steps = global_steps = 0
        try:
            while True:
                batch = next(batches, None)
                if buckets is not None:
                    buckets.start_step()
                if batch is not None:
                    t1 = time.perf_counter()
                    if local_steps == 0:
                        _compat.symbolic_build(model, batch)
                        run.startup["traced"] = step.trace(batch)
                    samples += step.gradients(batch, buf, buckets.ready if buckets is not None else None)
                    if local_steps == 0:
                        run.startup["first_step"] = time.perf_counter() - t1  # tracing the fused step, when new
                    local_steps += 1
                else:
                    buf.fill(0.0)
                    if buckets is not None:
                        buckets.ready_all()
                t0 = time.perf_counter()
                if buckets is not None:
                    buckets.wait()
                else:
                    reduce(buf)
                if buf[-1] == 0.0:  # every rank is out of data
                    comm += time.perf_counter() - t0
                    break
                tables = ()
                if step.tables:  # every rank's touched rows, after the vector (the buckets' thread is done with the link)
                    mine = step.touched if batch is not None else step.untouched()  # out of data: no rows
                    touched_rows += sum(len(ids) for ids, _ in mine)
                    tables = row_gather.exchange(step.tables, mine, link, rank, size, wire)
                comm += time.perf_counter() - t0
                step.apply(buf, tables)
                global_steps += 1
                if batch is not None:
                    run.reporter(local_steps, samples, model)
        finally:
            if buckets is not None:
                buckets.close()
        overlap = {} if buckets is None else {
            "buckets": len(step.bucket_bounds), "bucket_exchange_seconds": round(buckets.exchange_s, 4),
            "bucket_wait_seconds": round(buckets.exposed_s, 4)}
        if step.tables:
            overlap.update(sparse_tables=len(step.tables), sparse_rows_sent=touched_rows)

        t0 = time.perf_counter()
        _sync_non_trainable(model, link, rank, size, samples)
        comm += time.perf_counter() - t0
        _scale_lr(model, 1.0, base_lr)
        run.finish(local_steps, samples)
        return _rank_partial(run, link, rank, size, samples, local_steps, global_steps, comm, sent, **overlap)


    def _train_local(self, run: PartitionPass, chunks: Iterable[Batch], link: Any, rank: int, size: int,
                     broadcast: bool) -> Partial:
        """Model averaging through the ring: Keras' train step over the whole partition, then the
        sample-weighted mean of the state (integer counters: their maximum) on every rank."""
        model = run.model
        sent = _link_bytes(link)
        comm = _start_from_rank_0(run, link, rank, size, broadcast)
        counts = TouchCounts(self.ring.tables) if self.ring.tables else None
        samples, steps = run.run(chunks, tap=counts.track if counts is not None else None)
        t0 = time.perf_counter()
        if link is not None:
            rows = counts.state_rows(model) if counts is not None else ()
            set_state(model, _average_state(get_state(model), link, rank, size, samples, np.dtype(self.ring.state_sums), rows))
        comm += time.perf_counter() - t0
        return _rank_partial(run, link, rank, size, samples, steps, steps, comm, sent)


def _link_bytes(link: Any) -> tuple[int, int]:
    return getattr(link, "bytes_sent", 0), getattr(link, "bytes_received", 0)


def _start_from_rank_0(run: PartitionPass, link: Any, rank: int, size: int, broadcast: bool) -> float:
    """Horovod semantics: a stage starts from rank 0's weights and optimizer state on every rank
    (``broadcast``: its first epoch). Returns the seconds it took."""
    t0 = time.perf_counter()
    if link is not None and broadcast:
        state = _broadcast_arrays(get_state(run.model), link, rank, size)
        if rank != 0:
            set_state(run.model, state)
    run.startup["ring_broadcast"] = time.perf_counter() - t0
    return time.perf_counter() - t0


def _rank_partial(run: PartitionPass, link: Any, rank: int, size: int, samples: int, steps: int, global_steps: int,
                  comm: float, sent: tuple[int, int], **extra: Any) -> Partial:
    """A rank's epoch: its statistics (bytes since ``sent``, a digest of its weights) and, from rank 0
    only (every rank holds the same state), the state."""
    model = run.model
    weights = [np.asarray(v.numpy()) for v in model.weights]
    now = _link_bytes(link)
    info = run.info(
        samples, steps, rank=rank, world_size=size, global_steps=global_steps, comm_seconds=round(comm, 4),
        bytes_sent=now[0] - sent[0], bytes_received=now[1] - sent[1],
        weights_sha256=hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest(),
        **extra,
    )
    return Partial(samples=samples, batches=steps,
                   model=WeightedMean.of(get_state(model), 1.0) if rank == 0 else WeightedMean(),
                   metrics=get_metric_state(model) if samples else None, partitions={run.partition: info})


# a row no rank looked up is averaged by samples: each rank's weight for it is its samples times this,
# too small to move a row some rank did look up (a count of at least 1)
_UNTOUCHED = 2.0**-40


def _average_state(arrays: list[np.ndarray], link: Any, rank: int, size: int, samples: int,
                   sums: np.dtype = np.dtype(np.float64),
                   rows: Sequence[tuple[Sequence[int], np.ndarray]] = ()) -> list[np.ndarray]:
    """The ranks' sample-weighted mean of the float ``arrays`` (sums in ``sums``: float64 as
    :class:`~sparkdl_train.merge.WeightedMean` adds them, or float32 for half the bytes) and the
    maximum of the others, on every rank; a rank without samples contributes nothing. Unchanged if
    no rank had a sample.

    ``rows``: (positions in ``arrays``, this rank's count per row) for each embedding table: those
    arrays are averaged row by row, each rank weighted by how often it looked the row up (rows no
    rank looked up: by samples); the summed weights travel in the same ring."""
    floats = [i for i, a in enumerate(arrays) if is_numeric_mergeable(a.dtype)]
    others = [i for i, a in enumerate(arrays) if not is_numeric_mergeable(a.dtype)]
    weights: list[np.ndarray] = []
    row_weight: dict[int, int] = {}  # position in arrays -> its entry in weights
    for positions, counts in rows:
        weights.append((np.asarray(counts, np.float64) + _UNTOUCHED * samples) if samples else np.zeros(len(counts)))
        row_weight.update({i: len(weights) - 1 for i in positions})

    def weighted(i: int) -> np.ndarray:
        a = np.asarray(arrays[i], sums)
        if i in row_weight:
            return (a * weights[row_weight[i]].astype(sums).reshape(-1, *(1,) * (a.ndim - 1))).ravel()
        return a.ravel() * sums.type(samples)

    buf = np.concatenate([*(weighted(i) for i in floats), *(w.astype(sums) for w in weights), [sums.type(samples)]])
    ring.allreduce_sum(buf, link, rank, size)
    total = float(buf[-1])
    if total <= 0:
        return arrays
    summed, pos = [], buf.size - 1 - sum(len(w) for w in weights)
    for w in weights:
        summed.append(buf[pos : pos + len(w)])
        pos += len(w)
    out = list(arrays)
    pos = 0
    for i in floats:
        a = arrays[i]
        part = buf[pos : pos + a.size].reshape(a.shape)
        if i in row_weight:
            out[i] = np.asarray(part / summed[row_weight[i]].reshape(-1, *(1,) * (a.ndim - 1)), dtype=a.dtype)
        else:
            out[i] = np.asarray(part / total, dtype=a.dtype)
        pos += a.size
    if others:  # each rank's integers in a slot of its own, summed: every rank sees all of them
        flat = np.concatenate([np.asarray(arrays[i], np.float64).ravel() for i in others])
        table = np.zeros((size, flat.size), np.float64)
        if samples:
            table[rank] = flat
        else:
            table[rank] = -np.inf  # no samples: no say in the maximum
        ring.allreduce_sum(table.ravel(), link, rank, size)
        best = table.max(axis=0)
        pos = 0
        for i in others:
            a = arrays[i]
            out[i] = best[pos : pos + a.size].reshape(a.shape).astype(a.dtype)
            pos += a.size
    return out


def _broadcast_arrays(arrays: list[np.ndarray], link: Any, rank: int, size: int) -> list[np.ndarray]:
    """Rank 0's ``arrays`` on every rank: packed into one byte buffer, broadcast, unpacked."""
    blob = np.frombuffer(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays), np.uint8).copy()
    ring.broadcast(blob, link, rank, size)
    out, pos = [], 0
    for a in arrays:
        out.append(blob[pos : pos + a.nbytes].view(a.dtype).reshape(a.shape).copy())
        pos += a.nbytes
    return out


def lr_factor(lr_scaling: str, size: int) -> float:
    """What ``allreduce.lrScaling`` multiplies a constant learning rate by with ``size`` ranks."""
    return {"none": 1.0, "linear": float(size), "sqrt": math.sqrt(size)}[lr_scaling]


def _scale_lr(model: Any, factor: float, base: float | None = None) -> float | None:
    """Multiply a constant learning rate by ``factor`` (or restore ``base``); returns the old value."""
    opt = model.optimizer
    if factor == 1.0 and base is None:
        return None
    current = float(np.asarray(opt.learning_rate))
    opt.learning_rate = base if base is not None else current * factor
    return current


def _sync_non_trainable(model: Any, link: Any, rank: int, size: int, samples: int) -> None:
    """Make non-trainable state identical on every rank: float variables (e.g. BatchNorm
    moving statistics) become their sample-weighted mean, the others (seed counters) rank 0's."""
    if link is None:
        return
    statistic = [merged(r) for r in variable_roles(model.non_trainable_weights)]  # sparkdl_train.roles
    floats = [v for v, m in zip(model.non_trainable_weights, statistic) if m]
    others = [v for v, m in zip(model.non_trainable_weights, statistic) if not m]
    if floats:
        arrays = [np.asarray(v.numpy(), np.float64).ravel() for v in floats]
        buf = np.concatenate([*(a * samples for a in arrays), [float(samples)]])
        ring.allreduce_sum(buf, link, rank, size)
        if buf[-1] > 0:
            means, pos = [], 0
            for v, a in zip(floats, arrays):
                means.append((buf[pos : pos + a.size] / buf[-1]).reshape(v.shape).astype(np.dtype(v.dtype)))
                pos += a.size
            assign(floats, means, "non-trainable state")
    if others:
        assign(others, _broadcast_arrays([np.asarray(v.numpy()) for v in others], link, rank, size), "non-trainable state")
