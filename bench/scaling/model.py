"""A calibrated scaling model: samples/s and scaling efficiency of each engine for N workers.

Pure arithmetic (no Spark, no TensorFlow, no sparkdl_train): ``bench/scaling/measure.py`` measures the
constants on this machine, this module projects them to N = 1 ... 256 workers on a described
network. Everything is per worker unless said otherwise; times in seconds, sizes in bytes.

The engines and what each pays per unit of work (k = steps between pushes):

* ``averaging`` (synchronous model averaging, one Spark stage per epoch): the epoch's compute,
  the slowest of N workers (stragglers), plus the stage: launch, the state broadcast, the merge
  of N partials on the driver.
* ``ps`` synchronous: every k steps all N workers push and wait for the round; the driver's
  server handles the N requests one after another (lock and interpreter), and every byte crosses
  the driver's NIC, so a round costs ``k·c·straggler + N·s + N·bytes/B_driver``.
* ``ps`` asynchronous / hogwild: each worker cycles ``k·c`` of compute plus its own round trip;
  the server and the driver's NIC are queues shared by all N (M/D/1 waiting time); throughput
  is capped by the server's capacity (1/s requests per second for the locked part; hogwild
  applies deltas without the lock, so only the per-request interpreter work is serial).
* ``allreduce``: per step ``c·straggler + 2(N-1)/N·G/B + 2(N-1)·(latency + per-hop cost) +
  per-call cost``: the ring bound of Patarasuk and Yuan, plus the latency and software terms
  that dominate at large N; G is the gradient bytes (halved for fp16). The barrier stage and its
  rendezvous once per stage: a stage of K epochs (``epochs_per_stage``) pays them once for K, and
  between two of its epochs rank 0's state (weights and optimizer slots) goes to the driver.
  ``average="state"`` (``mode='allreduce', frequency='epoch'``): no exchange per step; per epoch
  the epoch's compute, its stragglers, and one ring allreduce of the state in float64 (or float32:
  ``state_bytes=4``); ``touches`` adds one summed weight per table row (the lookup counts, taken
  on the prefetch thread, cost no step time).

Efficiency is ``samples/s(N) / (N · batch / c)``: the fraction of N independent single-worker
steps the engine delivers (weak scaling: each worker keeps its batch size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GBPS = 1e9 / 8  # bytes per second in one Gb/s


@dataclass(frozen=True)
class Network:
    """Every host's NIC (full duplex) and one-way latency; the driver's NIC may differ."""

    nic_gbps: float
    latency_s: float = 50e-6
    driver_nic_gbps: float | None = None

    @property
    def bandwidth(self) -> float:
        return self.nic_gbps * GBPS

    @property
    def driver_bandwidth(self) -> float:
        return (self.driver_nic_gbps or self.nic_gbps) * GBPS


@dataclass(frozen=True)
class Workload:
    """A model and its data, as one worker sees them."""

    name: str
    compute_s: float  # seconds per training step of one worker (forward, backward, apply)
    batch: int
    dense_bytes: float  # fp32 bytes of the variables that are not embedding tables
    table_bytes: float = 0.0  # fp32 bytes of the embedding tables
    rows_per_batch: float = 0.0  # distinct table rows one batch touches
    row_bytes: float = 0.0  # bytes of one table row
    id_bytes: float = 4.0  # bytes of ids sent with one touched row (one int32 per table: 8 for DeepFM's two)
    table_rows: float = 0.0  # rows of all tables together
    steps_per_epoch: int = 1000  # per worker (weak scaling: fixed per worker)
    step_cv: float = 0.05  # coefficient of variation of a step's time (stragglers)
    push_fixed_s: float = 0.0  # the worker's own work per push (delta, applying the pulled weights)
    push_byte_s: float = 0.0  # ... and per byte it sends and receives
    # measured instead of uniform draws (a skewed id stream repeats ids): distinct rows one step
    # touches, growing as steps ** touch_exponent (0: the uniform formula)
    touched_rows_1: float = 0.0
    touch_exponent: float = 1.0
    state_factor: float = 3.0  # the state (weights and optimizer slots) over the weights: 3 for Adam
    # a call of the compiled step costs this beyond its steps (the call, its batch's hand-over): spread
    # over the steps of a call (worker.stepsPerExecution groups them; a push every k steps allows
    # k), and paid every step by allreduce's fused step, whose two calls and copies cost fused_call_s
    call_s: float = 0.0
    fused_call_s: float = 0.0

    @property
    def model_bytes(self) -> float:
        return self.dense_bytes + self.table_bytes

    def touched_bytes(self, steps: int) -> float:
        """Table bytes that ``steps`` batches touch (rows drawn with repetition: 1 - e^{-x})."""
        if self.table_rows <= 0:
            return self.table_bytes
        if self.touched_rows_1 > 0:
            return min(self.table_bytes, self.touched_rows_1 * steps ** self.touch_exponent * self.row_bytes)
        draws = self.rows_per_batch * steps
        rows = self.table_rows * (1.0 - math.exp(-draws / self.table_rows))
        return min(self.table_bytes, rows * self.row_bytes)


@dataclass(frozen=True)
class Server:
    """The driver-hosted parameter server, as measured with many light clients."""

    request_s: float  # serial cost of one request: interpreter, framing, bookkeeping
    serial_bytes_per_s: float  # bytes per second of the work done under the lock (apply, copy)
    driver_cores: int = 8  # cores the lock-free (hogwild) applies can spread over
    row_s: float = 0.0  # per table row in a request (ids checked, rows added and gathered)


@dataclass(frozen=True)
class Ring:
    call_s: float  # per allreduce call: Python, flattening, framing
    hop_s: float  # per ring hop beyond the network latency


@dataclass(frozen=True)
class SparkCosts:
    stage_s: float  # launching one stage and collecting its results (fixed)
    task_s: float  # the driver's serial work per task (scheduling, serializing it, its result)
    rendezvous_s: float = 0.0  # what a barrier stage and its allGather add to a stage
    merge_bytes_per_s: float = 1e9  # the driver adding partials (numpy)
    python_task_s: float = 0.0  # a Python task's own start and end on its executor (in parallel: once per stage)


@dataclass(frozen=True)
class Engine:
    kind: str  # "averaging", "ps" or "allreduce"
    mode: str = "synchronous"  # ps: "synchronous", "asynchronous", "hogwild"
    every: int | None = 1  # ps: steps between pushes; None: once per epoch
    sparse: bool = True  # ps: tables pushed and pulled as touched rows
    precision: int = 4  # allreduce: bytes per gradient value (4: fp32, 2: fp16)
    epochs_per_stage: int = 1  # allreduce: epochs one barrier stage runs
    average: str = "gradients"  # allreduce: "gradients" every step, or the model's "state" once per epoch
    state_bytes: int = 8  # allreduce, average="state": bytes per summed value (8: float64, 4: float32)
    touches: bool = False  # allreduce, average="state": table rows weighted by lookups (one summed weight per row)
    # allreduce of gradients: the tables' gradients as the rows one step touched, gathered from every
    # rank (allreduce.sparseGradients) instead of in the dense ring
    sparse_rows: bool = False
    # allreduce of gradients, designs not built here (what the goals would need; docs/scaling.md):
    overlap: float = 0.0  # the share of a step's compute the exchange can hide behind (buckets sent during backward)
    # overlap's bucket size (allreduce.bucketBytes): the last bucket (the first layers) leaves when the
    # backward pass ends, so at least its share of the exchange stays exposed; 0: no such floor
    bucket_bytes: int = 0
    hop_s: float | None = None  # a collective library's own cost per hop in place of this project's ring's
    gpus_per_node: int = 1  # hierarchical: reduced within a node for free (NVLink), the ring runs across nodes
    ps_wire: str | None = None  # ps: deltas and replies as "fp16" / "bf16" (ps.compression); the server adds float32

    @property
    def label(self) -> str:
        if self.kind == "averaging":
            return "averaging/epoch"
        if self.kind == "allreduce":
            what = (f"allreduce state/epoch{', float32 sums' if self.state_bytes == 4 else ''}"
                    f"{', touches' if self.touches else ''}" if self.average == "state"
                    else f"allreduce fp{self.precision * 8}{', sparse rows' if self.sparse_rows else ''}")
            extra = ((f", overlap {self.overlap:.2f}" if self.overlap else "")
                     + (f", {self.bucket_bytes / 2**20:g} MiB buckets" if self.overlap and self.bucket_bytes else "")
                     + (f", hop {self.hop_s * 1e6:g} us" if self.hop_s is not None else "")
                     + (f", {self.gpus_per_node} GPUs/node" if self.gpus_per_node > 1 else ""))
            return what + extra + (f", {self.epochs_per_stage} epochs/stage" if self.epochs_per_stage > 1 else "")
        every = "epoch" if self.every is None else "batch" if self.every == 1 else str(self.every)
        return f"{self.mode} PS/{every}{'' if self.sparse else ' dense'}{f', {self.ps_wire} wire' if self.ps_wire else ''}"


@dataclass(frozen=True)
class Prediction:
    workers: int
    samples_per_s: float
    efficiency: float
    bottleneck: str
    parts: dict = field(default_factory=dict)  # seconds per unit of work, by cause


def straggler(n: int, cv: float) -> float:
    """Expected slowest of n step times over their mean (normal approximation, sqrt(2 ln n));
    ``cv`` is the spread of what the n workers wait for each other over (a step, a round of k
    steps: cv/sqrt(k), an epoch)."""
    return 1.0 + cv * math.sqrt(2.0 * math.log(n)) if n > 1 else 1.0


def allgather_seconds(n: int, block_bytes: float, net: Network, ring: Ring) -> dict[str, float]:
    """A ring allgather of every rank's ``block_bytes`` (variable length: its lengths travel first, one
    more round of n - 1 hops), as the sparse gradients of allreduce.sparseGradients travel."""
    if n == 1:
        return {}
    return {"rows_bandwidth": (n - 1) * block_bytes / net.bandwidth,
            "rows_latency": 2.0 * (n - 1) * (net.latency_s + ring.hop_s)}


def ring_seconds(n: int, grad_bytes: float, net: Network, ring: Ring) -> dict[str, float]:
    """One ring allreduce (reduce-scatter + allgather) of ``grad_bytes`` among n ranks."""
    if n == 1:
        return {"software": ring.call_s}
    return {
        "bandwidth": 2.0 * (n - 1) / n * grad_bytes / net.bandwidth,
        "latency": 2.0 * (n - 1) * (net.latency_s + ring.hop_s),
        "software": ring.call_s,
    }


def broadcast_seconds(n: int, nbytes: float, net: Network) -> float:
    """Spark's torrent broadcast: pieces spread from the driver and then between executors,
    about log2(N+1) waves of the whole state, each at the slower of the driver's NIC and the hosts'
    links (every piece reaches an executor over its host's link)."""
    return nbytes / min(net.driver_bandwidth, net.bandwidth) * math.ceil(math.log2(n + 1))


def merge_seconds(n: int, nbytes: float, net: Network, spark: SparkCosts) -> float:
    """N partials to the driver (up to 16 partitions: collected; wider: a two-level tree). Each partial
    also leaves its host over that host's link: where the driver's NIC is faster than the hosts', the
    hosts' links (all at once) bound the collection."""
    arriving = n if n <= 16 else math.ceil(math.sqrt(n))
    transfer = max(arriving * nbytes / net.driver_bandwidth, nbytes / net.bandwidth) + (0.0 if n <= 16 else nbytes / net.bandwidth)
    return transfer + n * nbytes / spark.merge_bytes_per_s


def state_bytes(w: Workload) -> float:
    """What a stage's broadcast and model averaging's partials carry: the weights and the optimizer's
    slots (every engine's epoch starts from the driver's state, optimizer included)."""
    return w.model_bytes * w.state_factor


def _stage(n: int, w: Workload, net: Network, spark: SparkCosts) -> float:
    return spark.stage_s + spark.python_task_s + spark.task_s * n + broadcast_seconds(n, state_bytes(w), net)


def _mdl_wait(rho: float, service: float) -> float:
    """M/D/1 mean wait in queue; infinite at or beyond saturation."""
    return math.inf if rho >= 1.0 else rho * service / (2.0 * (1.0 - rho))


STEPS_PER_EXECUTION = 16  # worker.stepsPerExecution's default


def steps_per_call(engine: Engine) -> int:
    """Steps one call of a worker's compiled step runs: the engine's group (as the engines choose it)."""
    if engine.kind == "allreduce" and engine.average == "gradients":
        return 1
    if engine.kind == "ps" and engine.every is not None:  # the largest divisor of the push interval up to the group
        return max(d for d in range(1, min(engine.every, STEPS_PER_EXECUTION) + 1) if engine.every % d == 0)
    return STEPS_PER_EXECUTION


def compute_per_step(engine: Engine, w: Workload) -> float:
    """A worker's seconds per step under ``engine``: compute plus its share of the per-call cost."""
    if engine.kind == "allreduce" and engine.average == "gradients":
        return w.compute_s + w.fused_call_s
    return w.compute_s + w.call_s / steps_per_call(engine)


def predict(engine: Engine, w: Workload, n: int, net: Network, server: Server, ring: Ring,
            spark: SparkCosts) -> Prediction:
    ideal = n * w.batch / (w.compute_s + w.call_s / STEPS_PER_EXECUTION)  # the best a worker does alone
    w = replace(w, compute_s=compute_per_step(engine, w), call_s=0.0, fused_call_s=0.0)
    slow = straggler(n, w.step_cv)
    if engine.kind == "averaging":
        steps = w.steps_per_epoch
        # the epoch is a sum of steps: its spread is the step's over sqrt(steps)
        slow = straggler(n, w.step_cv / math.sqrt(steps))
        parts = {"compute": steps * w.compute_s, "stragglers": steps * w.compute_s * (slow - 1.0),
                 "spark": _stage(n, w, net, spark), "merge": merge_seconds(n, state_bytes(w), net, spark)}
        rate = n * steps * w.batch / sum(parts.values())
        return _done(n, rate, ideal, parts)
    if engine.kind == "allreduce":
        rendezvous = spark.rendezvous_s if n > 1 else 0.0  # one allGather through the barrier coordinator
        per_epoch = (_stage(n, w, net, spark) + rendezvous) / engine.epochs_per_stage
        if engine.epochs_per_stage > 1:  # rank 0's state to the driver between two epochs, and its answer
            per_epoch += state_bytes(w) / net.driver_bandwidth + 2.0 * net.latency_s
        if engine.average == "state":
            steps = w.steps_per_epoch
            slow = straggler(n, w.step_cv / math.sqrt(steps))
            parts = {"compute": steps * w.compute_s, "stragglers": steps * w.compute_s * (slow - 1.0),
                     **ring_seconds(n, state_bytes(w) * engine.state_bytes / 4.0
                                    + (w.table_rows * engine.state_bytes if engine.touches else 0.0), net, ring),
                     "spark": per_epoch}
            return _done(n, n * steps * w.batch / sum(parts.values()), ideal, parts)
        grad = (w.dense_bytes if engine.sparse_rows else w.model_bytes) * engine.precision / 4.0
        nodes = max(1, math.ceil(n / engine.gpus_per_node))
        hops = ring if engine.hop_s is None else replace(ring, hop_s=engine.hop_s)
        comm = ring_seconds(nodes, grad, net, hops)
        if engine.overlap > 0:  # what runs while the backward pass still computes is hidden
            total = sum(comm.values())
            last = min(1.0, engine.bucket_bytes / grad) if engine.bucket_bytes else 0.0
            exposed = max(total * last, total - engine.overlap * w.compute_s)
            comm = {k: v * exposed / total for k, v in comm.items()} if total > 0 else comm
        if engine.sparse_rows and w.row_bytes:  # after the vector, not hidden
            rows = w.touched_bytes(1) / w.row_bytes * engine.gpus_per_node  # distinct rows one step (one node) touches
            comm.update(allgather_seconds(nodes, rows * (w.row_bytes * engine.precision / 4.0 + w.id_bytes), net, hops))
        step = {"compute": w.compute_s, "stragglers": w.compute_s * (slow - 1.0), **comm}
        step["spark"] = per_epoch / w.steps_per_epoch
        return _done(n, n * w.batch / sum(step.values()), ideal, step)
    if engine.kind == "ps":
        return _ps(engine, w, n, net, server, spark, ideal, slow)
    raise ValueError(f"unknown engine kind {engine.kind!r}")


# ps.compression: seconds per float32 value narrowed to the wire's type and widened back (numpy on
# this project's CI VM, 117k values: fp16 483 / 194 us, bf16 100 / 26 us; tests/unit/test_ps_wire.py)
WIRE_CONVERT_S = {"fp16": (4.1e-9, 1.65e-9), "bf16": (0.85e-9, 0.22e-9)}


def _ps(engine: Engine, w: Workload, n: int, net: Network, server: Server, spark: SparkCosts,
        ideal: float, slow: float) -> Prediction:
    k = w.steps_per_epoch if engine.every is None else engine.every
    table = w.touched_bytes(k) if engine.sparse else w.table_bytes
    one_way = w.dense_bytes + table  # a push, and the pull that answers it
    applied_bytes = 2.0 * one_way  # what the server adds and copies: float32 whatever the wire
    wire, convert = applied_bytes, 0.0
    if engine.ps_wire:  # half the bytes on the wire; each side narrows what it sends and widens what it gets
        wire = applied_bytes / 2.0
        convert = one_way / 4.0 * sum(WIRE_CONVERT_S[engine.ps_wire])
    rows = table / w.row_bytes if w.row_bytes else 0.0
    applied = applied_bytes / server.serial_bytes_per_s + rows * server.row_s  # the bytes and rows of a request
    service = server.request_s + (applied if engine.mode != "hogwild" else 0.0)  # serial, per request
    # hogwild applies without the lock; the server's conversions run outside it, in the connection's thread
    parallel = (applied if engine.mode == "hogwild" else 0.0) + convert
    nic = wire / net.driver_bandwidth  # the driver's NIC, per request
    epoch_share = _stage(n, w, net, spark) * k / w.steps_per_epoch
    compute = k * w.compute_s
    worker = w.push_fixed_s + wire * w.push_byte_s + convert
    if engine.mode == "synchronous":
        slow = straggler(n, w.step_cv / math.sqrt(k))  # a round waits for the slowest k-step sum
        parts = {"compute": compute, "stragglers": compute * (slow - 1.0), "worker_sync": worker,
                 "server": n * service + parallel, "driver_nic": n * nic,
                 "network": wire / net.bandwidth + 2.0 * net.latency_s, "spark": epoch_share}
        # the NIC and the server overlap: one request is on the wire while another is applied
        overlap = min(parts["server"], parts["driver_nic"])
        parts["overlap"] = -overlap
        return _done(n, n * k * w.batch / sum(parts.values()), ideal, parts)
    # asynchronous / hogwild: a closed system of n workers around two queues (server, driver NIC)
    base = compute + worker + service + parallel + nic + wire / net.bandwidth + 2.0 * net.latency_s + epoch_share
    # requests per second the driver sustains: its lock, its NIC, and the work outside the lock (lock-free
    # applies, the wire's conversions) spread over its cores
    capacity = 1.0 / max(service, nic, parallel / max(1, server.driver_cores))
    cycle = _closed_cycle(n, base, service, nic, capacity)
    rate_requests = min(n / cycle, capacity)
    parts = {"compute": compute, "worker_sync": worker, "server": service + parallel, "driver_nic": nic,
             "network": wire / net.bandwidth + 2.0 * net.latency_s, "spark": epoch_share,
             "queueing": max(0.0, cycle - base)}
    limit = None
    if parts["queueing"] > 0.1 * compute or rate_requests >= 0.9 * capacity:  # a queue at the driver decides
        limit = "driver_nic" if nic >= service else "server"
    return _done(n, rate_requests * k * w.batch, ideal, parts, limit)


def _closed_cycle(n: int, base: float, service: float, nic: float, capacity: float) -> float:
    """A worker's cycle time with n workers: base plus the queueing it meets (fixed point, by
    bisection on the cycle; at saturation the cycle stretches to n / capacity)."""
    floor = max(base, n / capacity)

    def excess(cycle: float) -> float:
        lam = n / cycle  # requests per second offered
        wait = _mdl_wait(lam * service, service) + _mdl_wait(lam * nic, nic)
        return base + wait - cycle

    lo, hi = floor, floor * 2.0 + 1.0
    if excess(lo) <= 0:
        return lo
    while excess(hi) > 0:
        hi *= 2.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def _done(n: int, rate: float, ideal: float, parts: dict, bottleneck: str | None = None) -> Prediction:
    """The largest cost beside compute names the bottleneck, once it exceeds 10% of compute."""
    if bottleneck is None:
        work = {k: v for k, v in parts.items() if k not in ("compute", "overlap", "queueing") and v > 0}
        top = max(work, key=work.get) if work else None
        bottleneck = top if top is not None and work[top] > 0.1 * parts.get("compute", 0.0) else "compute"
    return Prediction(n, rate, rate / ideal, bottleneck, parts)


def sweep(engines: list[Engine], w: Workload, net: Network, server: Server, ring: Ring, spark: SparkCosts,
          workers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> dict[str, list[Prediction]]:
    return {e.label: [predict(e, w, n, net, server, ring, spark) for n in workers] for e in engines}


def with_network(net: Network, gbps: float) -> Network:
    return replace(net, nic_gbps=gbps, driver_nic_gbps=None)


ENGINES = [
    Engine("averaging"),
    Engine("ps", "synchronous", 1), Engine("ps", "synchronous", 4), Engine("ps", "synchronous", None),
    Engine("ps", "asynchronous", 1), Engine("ps", "asynchronous", 4), Engine("ps", "asynchronous", None),
    Engine("ps", "synchronous", 4, sparse=False), Engine("ps", "asynchronous", 4, sparse=False),
    Engine("ps", "hogwild", 1), Engine("ps", "hogwild", 4), Engine("ps", "hogwild", None),
    Engine("ps", "hogwild", 4, sparse=False),
    Engine("allreduce", precision=4), Engine("allreduce", precision=2), Engine("allreduce", precision=4, sparse_rows=True),
    Engine("allreduce", average="state"), Engine("allreduce", average="state", epochs_per_stage=8),
]
