"""Scaling: measure the constants of bench/scaling/model.py on this machine, then project.

Measured here, in one run:

1. **Parameter-server service time**: a ``ParameterServer`` (asynchronous, the driver's own
   code) in this process, and 1, 2, 4, ... client *processes* that push and pull as fast as they
   can without training (``--client``: numpy and ``sparkdl_train.ps.client`` only). Three
   request shapes: a small dense model (per-request cost), a large dense one (per-byte cost) and
   a CTR-like push of sparse table rows plus the dense layers (per-row cost). The constants come
   from the server's own CPU seconds per request (this process runs nothing but the server
   meanwhile), not from the requests/s, because on a 2-core machine the clients take the cores
   the server would use; every run's requests/s is then predicted from the fitted server, the
   clients' CPU per request and the cores, and printed beside its measurement (a fourth shape,
   ``ctr sparse/4``, is not used to fit).
2. **Compute seconds per batch** of the flagship CTR model (DeepFM) and of a dense model of
   about 25M parameters, single process, CPU (``train_on_batch`` after warm-up).
3. **Ring software costs**: ``bench/allreduce/ring.py``'s process ring on a 4 KB buffer with 2 and 3
   ranks: the time beyond bandwidth per call and per hop (loopback latency included in the hop).
4. **Spark's per-stage costs** on ``local[2]``: a no-op Python job of one and of 16 waves of
   tasks (stage, a Python task's own cost, paid in parallel), JVM-only jobs of 2 and 400 tasks
   (the driver's serial cost per task, an upper bound), a barrier stage with one ``allGather``
   (rendezvous), and numpy's add rate (the driver's merge).

The network is described, not measured (10 and 25 Gb/s, 50 us one way). Prints the constants,
then efficiency for N = 1 ... 256 per engine and the bottleneck at 64 workers.

    python -m bench.scaling.measure [--clients 1 2 4 8 16] [--seconds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from bench.scaling import model as sm

SECRET_ENV = "SPARKDL_BENCH_SECRET"
CTR_BATCH, CTR_FIELDS = 512, 26
CTR_ROW_BYTES = (8 + 1) * 4  # DeepFM: an 8-wide field embedding and a 1-wide linear one per id
# request shapes: (dense bytes, table rows, row width, rows per push); "ctr sparse" is set from
# the measured CTR model (its dense layers, one push's distinct rows) before the server runs
SHAPES = {
    "small dense": (64 * 1024, 0, 0, 0),
    "large dense": (8 * 1024 * 1024, 0, 0, 0),
    "ctr sparse": (16 * 1024, 1 << 20, 9, 8192),
    "ctr sparse/4": (16 * 1024, 1 << 20, 9, 2048),
}


def _weights(shape: tuple) -> tuple[list[np.ndarray], tuple[int, ...]]:
    dense, rows, width, _ = shape
    arrays = [np.zeros(dense // 4, np.float32)]
    sparse: tuple[int, ...] = ()
    if rows:
        arrays.append(np.zeros((rows, width), np.float32))
        sparse = (1,)
    return arrays, sparse


def client_main(cfg: dict) -> None:
    """One light client: push and pull for ``seconds``, print how many round trips it made."""
    from sparkdl_train.ps.client import PSClient
    from sparkdl_train.ps.state import SparseRows

    shape = SHAPES[cfg["shape"]]
    arrays, sparse = _weights(shape)
    rng = np.random.default_rng(cfg["worker"])
    if cfg["shape"].startswith("ctr sparse"):  # sized from the measured model by the parent
        shape = tuple(cfg["ctr"])
        arrays, sparse = _weights(shape)
    client = PSClient(cfg["host"], cfg["port"], os.environ[SECRET_ENV].encode(), worker=cfg["worker"])
    version, _ = client.pull()
    delta: list = [np.full_like(arrays[0], 1e-6)]
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    stop = start + cfg["seconds"]
    while time.perf_counter() < stop:
        want = None
        if sparse:
            ids = np.unique(rng.integers(0, shape[1], shape[3]))
            delta = [delta[0], SparseRows(ids, np.full((len(ids), shape[2]), 1e-6, np.float32))]
            want = {1: ids}
        version, _ = client.push(delta, version, 1, want)
        count += 1
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    sent, received = client.bytes_sent, client.bytes_received
    client.done()
    client.close()
    print(json.dumps({"requests": count, "seconds": elapsed, "cpu": cpu, "sent": sent, "received": received}), flush=True)


def saturation(shape_name: str, clients: int, seconds: float) -> dict:
    """Requests/s and bytes/s the server sustains with ``clients`` client processes, and the CPU
    seconds per request of the server (this process runs nothing else meanwhile) and of a client."""
    from sparkdl_train.ps.server import ParameterServer
    from sparkdl_train.ps.state import ServerState

    arrays, sparse = _weights(SHAPES[shape_name])
    secret = os.urandom(32).hex()
    server = ParameterServer(ServerState(arrays, "asynchronous", sparse=sparse), "127.0.0.1", secret.encode()).start()
    try:
        host, port = server.address
        env = {**os.environ, SECRET_ENV: secret}
        cpu = time.process_time()
        procs = [subprocess.Popen([sys.executable, "-m", "bench.scaling.measure", "--client", json.dumps(
            {"host": host, "port": port, "worker": i, "shape": shape_name, "seconds": seconds,
             "ctr": SHAPES[shape_name]})],
            stdout=subprocess.PIPE, text=True, env=env) for i in range(clients)]
        out = []
        for p in procs:
            text, _ = p.communicate(timeout=seconds + 120)
            if p.returncode != 0:
                raise SystemExit(f"client failed (exit {p.returncode})")
            out.append(json.loads(text.strip().splitlines()[-1]))
        cpu = time.process_time() - cpu
    finally:
        server.stop()
    span = max(o["seconds"] for o in out)
    requests = sum(o["requests"] for o in out)
    wire = sum(o["sent"] + o["received"] for o in out)
    return {"clients": clients, "requests_per_s": requests / span, "bytes_per_request": wire / max(1, requests),
            "mean_latency_s": sum(o["seconds"] for o in out) / max(1, requests),
            "server_cpu_s": cpu / max(1, requests), "client_cpu_s": sum(o["cpu"] for o in out) / max(1, requests)}


def fit_server(rows: dict[str, list[dict]]) -> sm.Server:
    """Service time per request = request_s + bytes / serial_bytes_per_s + rows * row_s, fitted to
    the server's own CPU seconds per request (median over the client counts) of the small dense, the
    large dense and the larger CTR shape; the smaller CTR shape is left to check it. All of the
    server's CPU counts as serial (one interpreter; its numpy copies release the lock, so this is
    pessimistic for a driver with free cores). Measuring the server's CPU rather than the clients'
    throughput keeps the clients, which share this machine's cores, out of the constants."""
    def cpu(name: str) -> tuple[float, float]:
        med = sorted(rows[name], key=lambda r: r["server_cpu_s"])[len(rows[name]) // 2]
        return med["server_cpu_s"], med["bytes_per_request"]

    (s_small, b_small), (s_large, b_large) = cpu("small dense"), cpu("large dense")
    per_byte = max(1e-15, (s_large - s_small) / (b_large - b_small))
    request_s = max(1e-7, s_small - b_small * per_byte)
    s_ctr, b_ctr = cpu("ctr sparse")
    row_s = max(0.0, (s_ctr - request_s - b_ctr * per_byte) / SHAPES["ctr sparse"][3])
    return sm.Server(request_s=request_s, serial_bytes_per_s=1.0 / per_byte, driver_cores=os.cpu_count() or 1,
                     row_s=row_s)


def saturation_prediction(server: sm.Server, shape: str, row: dict, cores: int) -> float:
    """Requests/s the fitted server predicts for one saturation run: ``clients`` closed loops of a
    client's CPU plus the server's service, capped by the server (serial) and by this machine's
    cores, which the clients and the server share."""
    service = server.request_s + row["bytes_per_request"] / server.serial_bytes_per_s + SHAPES[shape][3] * server.row_s
    demand = service + row["client_cpu_s"]
    return min(row["clients"] / demand, 1.0 / service, cores / demand)


def compute_seconds(kind: str, batch: int, reps: int = 20) -> tuple[float, float, float, float]:
    """(seconds per train step, its robust coefficient of variation, parameter bytes, embedding
    table bytes) of a fresh model, one process on this machine's CPU."""
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if kind == "ctr":
        from bench.e2e import ctr as e2e_ctr

        model = e2e_ctr.build_model(100_000)
        x = {"numeric": rng.random((batch, 13), np.float32), "categorical": rng.integers(0, 100_000, (batch, 26))}
    else:  # about 25M parameters: 4 dense layers of 2500 units
        model = keras.Sequential([keras.Input((2500,))] + [keras.layers.Dense(2500, activation="relu") for _ in range(4)]
                                 + [keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy")
        x = rng.random((batch, 2500), np.float32)
    y = rng.integers(0, 2, batch).astype(np.float32)
    for _ in range(3):
        model.train_on_batch(x, y)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    q25, q75 = np.percentile(times, [25, 75])
    cv = float((q75 - q25) / 1.349 / median)  # robust: another process stealing a core is not a straggler model
    tables = float(sum(np.prod(w.shape) * 4 for w in model.trainable_weights if "embedding" in w.path))
    return median, cv, float(sum(np.prod(w.shape) * 4 for w in model.trainable_weights)), tables


def ring_constants(repeats: int = 100) -> tuple[sm.Ring, float]:
    """The ring's software costs, and the loopback bandwidth of one link (Gb/s) for validation.

    Two ranks (two processes, one core each here): an allreduce of 4 KB is the call's own cost and
    two hops, each a framed exchange through the loopback (whose latency is inside it: an upper
    bound of the software's share). Three ranks on two cores, which this once used ((t3 - t2) / 2:
    149 us per hop), timed a process waiting for a core as much as the hop."""
    from bench.allreduce import ring as ring_bench

    tiny = ring_bench.run(2, [0.004, 0.0004], repeats, False)
    t2 = min(r["allreduce_s"] for r in tiny)
    bandwidth = ring_bench.run(2, [8.0], max(3, repeats // 20), False)[0]["B_pair_GBps"] * 8
    return sm.Ring(call_s=1e-6, hop_s=max(1e-6, (t2 - 1e-6) / 2.0)), bandwidth


def _median_seconds(fn, reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def spark_constants() -> sm.SparkCosts:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparkdl_train import net
    from sparkdl_train.allreduce.barrier import RendezvousSettings
    from sparkdl_train.driver.rendezvous import RendezvousServer

    secret = net.new_secret()
    spark = (SparkSession.builder.master("local[2]").appName("sparkdl_train scaling constants")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    sc = spark.sparkContext
    try:
        def job(n: int) -> None:
            sc.parallelize(range(n), n).mapPartitions(lambda it: [sum(1 for _ in it)]).collect()

        def barrier_job() -> None:  # the rendezvous through Spark (allreduce.rendezvous=spark)
            def gather(it):
                from pyspark import BarrierTaskContext

                yield len(BarrierTaskContext.get().allGather("x"))
            sc.parallelize(range(2), 2).barrier().mapPartitions(gather).collect()

        rounds = itertools.count()

        def driver_barrier_job() -> None:  # the engine's default: the driver's rendezvous server
            settings = RendezvousSettings("127.0.0.1", server.port, secret, f"bench-{next(rounds)}")

            def gather(it):
                from pyspark import BarrierTaskContext

                from sparkdl_train.allreduce.barrier import DriverGroup

                yield len(DriverGroup(BarrierTaskContext.get(), 60.0, settings).all_gather("x"))
            sc.parallelize(range(2), 2).barrier().mapPartitions(gather).collect()

        slots = sc.defaultParallelism
        t2, t32 = _median_seconds(lambda: job(slots)), _median_seconds(lambda: job(16 * slots))
        python_task = max(0.0, (t32 - t2) / 15.0)  # one more wave of Python tasks on every slot
        # the driver's serial share per task, bounded above by JVM-only tasks (no Python worker)
        j2 = _median_seconds(lambda: spark.range(0, slots, 1, slots).count())
        j200 = _median_seconds(lambda: spark.range(0, 200 * slots, 1, 200 * slots).count())
        task = max(0.0, (j200 - j2) / (199 * slots))
        spark_rendezvous = max(0.0, _median_seconds(barrier_job) - t2)
        with RendezvousServer("127.0.0.1", secret, 60.0) as server:
            rendezvous = max(0.0, _median_seconds(driver_barrier_job) - t2)
        print(f"  rendezvous: the driver's server {rendezvous * 1e3:.0f} ms, Spark's allGather {spark_rendezvous * 1e3:.0f} ms "
              "(per barrier stage beyond a plain one)", flush=True)
    finally:
        spark.stop()
    a, b = np.ones(25_000_000, np.float32), np.ones(25_000_000, np.float32)
    add = _median_seconds(lambda: np.add(a, b, out=a), reps=5)
    return sm.SparkCosts(stage_s=max(0.0, t2 - python_task - slots * task), task_s=task, rendezvous_s=rendezvous,
                         merge_bytes_per_s=a.nbytes / add, python_task_s=python_task)


# what is validated on local[2]: (model engine, SparkModel settings)
VALIDATED = [
    (sm.Engine("averaging"), {"mode": "synchronous", "frequency": "epoch"}),
    (sm.Engine("ps", "synchronous", 4), {"mode": "synchronous", "frequency": 4}),
    (sm.Engine("ps", "asynchronous", 1), {"mode": "asynchronous", "frequency": "batch"}),
    (sm.Engine("ps", "asynchronous", 4), {"mode": "asynchronous", "frequency": 4}),
    (sm.Engine("ps", "hogwild", 1), {"mode": "hogwild", "frequency": "batch"}),
    (sm.Engine("allreduce"), {"mode": "allreduce", "sparse_gradients": False}),
    (sm.Engine("allreduce", sparse_rows=True), {"mode": "allreduce", "sparse_gradients": True}),
    (sm.Engine("allreduce", average="state"), {"mode": "allreduce", "frequency": "epoch"}),
]
VALIDATION_BATCH = 256
VALIDATION_EPOCHS = 4  # the first warms the fit (model, traces); the median of the others is timed


def validation_child(cfg: dict) -> None:
    """Fits of the CTR bench model on ``cfg["master"]`` (``local[2]`` or ``local-cluster[2,1,2048]``):
    per engine and worker count, the samples/s of the median epoch after the first, the per-step
    seconds of its partitions (compute and data path), and which Python worker daemons ran them (not
    the driver's process). One epoch of a few seconds on this shared 2-core VM moved by 20-30%
    between runs of the same fit; the median of three is what the model is compared with."""
    from bench.e2e import ctr as e2e_ctr
    from sparkdl_train import SparkModel

    meta = e2e_ctr.prepare(cfg["rows"], cfg["work"])
    master = cfg.get("label", cfg["master"])  # what the rows call it (bench.net.links: a cluster and its links' rate)
    spark = e2e_ctr.spark_session(cfg["master"], 1, "sparkdl_train scaling validation",
                                  {"spark.python.daemon.module": "sparkdl_train.worker.daemon",
                                   "spark.executor.memory": "1600m", **cfg.get("conf", {})})
    out = []
    try:
        train = spark.read.parquet(os.path.join(meta["path"], "train"))
        columns = {"feature_cols": {"numeric": "numeric", "categorical": "categorical"}, "label_col": "label"}
        # warm both executors first (a fresh local-cluster's first fit pays its executors' start)
        SparkModel(e2e_ctr.build_model(meta["vocab_size"]), num_workers=2, seed=e2e_ctr.SEED, worker_threads=1,
                   mode="synchronous", frequency="epoch").fit(train, epochs=1, batch_size=VALIDATION_BATCH, verbose=0,
                                                              **columns)
        rounds = [(r, engine, settings, workers) for r in range(cfg.get("repeats", 1)) for engine, settings in VALIDATED
                  for workers in cfg.get("workers", (1, 2)) if engine.label in cfg.get("engines", [engine.label])]
        for repeat, engine, settings, workers in rounds:  # every fit once per round: a slow spell hits all alike
            model = e2e_ctr.build_model(meta["vocab_size"])
            smodel = SparkModel(model, num_workers=workers, seed=e2e_ctr.SEED, worker_threads=1, **settings)
            smodel.fit(train, epochs=VALIDATION_EPOCHS, batch_size=VALIDATION_BATCH, verbose=0, **columns)
            timed = sorted(smodel.stats.epochs[1:], key=lambda e: e.seconds)
            epoch = timed[len(timed) // 2]
            parts = list(epoch.partitions.values())
            samples = sum(p["samples"] for p in parts)
            daemons = sorted({p["daemon_pid"] for p in parts})
            if os.getpid() in daemons or os.getpid() in {p["pid"] for p in parts}:
                raise SystemExit(f"{master}: a task ran in the driver's process")
            out.append({"master": master, "repeat": repeat, "daemons": daemons, "engine": engine.label, "workers": workers,
                        "samples": samples,
                        "samples_per_s": samples / epoch.seconds,
                        "step_s": sum(p["seconds"] for p in parts) / sum(p["batches"] for p in parts),
                        "steps": max(p["batches"] for p in parts),
                        "table_bytes": float(sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights
                                                 if "embedding" in w.path)),
                        "model_bytes": float(sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)),
                        "vocab": meta["vocab_size"],
                        "pushes": sum(p.get("pushes", 0) for p in parts),
                        "push_sync_s": sum(p.get("push_sync_seconds", 0.0) for p in parts),
                        "push_bytes": sum(p.get("bytes_sent", 0) + p.get("bytes_received", 0) for p in parts)})
            print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    finally:
        spark.stop()
    with open(cfg["result"], "w") as f:
        json.dump(out, f)


def validate(rows: int, server: sm.Server, ring: sm.Ring, spark_costs: sm.SparkCosts, loopback_gbps: float,
             masters: list[str], repeats: int = 1) -> list[dict]:
    """Measured (1 and 2 workers on each master) beside predicted. The model's compute per step is
    calibrated once, from averaging with 1 worker on the first master (the fit with the least
    communication), and a worker's own push cost from its asynchronous fits with 1 worker; every
    other row, every row of the other masters included, is a prediction from the constants."""
    measured = []
    for master in masters:
        measured += validation_fits({"rows": rows, "master": master, "repeats": repeats})
    return compare(measured, server, ring, spark_costs, loopback_gbps)


def validation_fits(cfg: dict) -> list[dict]:
    """:func:`validation_child` in a process of its own (``cfg``: its ``rows``, ``master``, ``repeats`` and
    optionally ``label``, ``conf``, ``engines``, ``workers``); returns its measured rows."""
    import tempfile

    work = os.path.join(tempfile.gettempdir(), "sparkdl_train_bench")
    result = os.path.join(work, "scaling_validation.json")
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-m", "bench.scaling.measure", "--validation-child",
                           json.dumps({"work": work, "result": result, **cfg})], env=env, timeout=3000)
    if proc.returncode != 0:
        raise SystemExit(f"validation fits on {cfg.get('label', cfg['master'])} failed (exit {proc.returncode})")
    with open(result) as f:
        return json.load(f)


MEASURED_KEYS = ("master", "daemons", "engine", "workers", "samples", "samples_per_s", "step_s", "steps", "table_bytes",
                 "model_bytes", "vocab", "pushes", "push_sync_s", "push_bytes")


def compare(measured: list[dict], server: sm.Server, ring: sm.Ring, spark_costs: sm.SparkCosts,
            loopback_gbps: float, networks: dict[str, sm.Network] | None = None) -> list[dict]:
    """Each measured fit beside the model's prediction (the first master's 1-worker fits calibrate).
    ``networks``: the links of a master (by its rows' name) where they are not the loopback's."""
    measured = [{**{k: m[k] for k in MEASURED_KEYS}, "repeats": m["repeats"]} for m in median_fits(measured)]
    first = [m for m in measured if m["master"] == measured[0]["master"]]
    calib = next(m for m in first if m["engine"] == "averaging/epoch" and m["workers"] == 1)
    push_fixed, push_byte, push_calib = worker_push_constants(first)
    # a fit's epoch costs more outside its tasks than a no-op stage does (planning the DataFrame
    # query, the Arrow stage's set-up, the state's broadcast, collecting and merging): the
    # calibration fit's epoch time not spent in its task, in place of the no-op stage's cost
    outside = calib["samples"] / calib["samples_per_s"] - calib["step_s"] * calib["steps"]
    spark_costs = dataclasses.replace(spark_costs, stage_s=max(
        spark_costs.stage_s, outside - spark_costs.python_task_s - spark_costs.task_s))
    net = sm.Network(loopback_gbps, latency_s=20e-6)
    # the bench data's ids are skewed: the distinct rows a push carries, measured by the two
    # calibration fits (asynchronous, 1 worker, every step and every 4 steps), as rows(k) = r1 * k^b
    (r1, r4) = [((m["push_bytes"] / m["pushes"]) / 2.0 - (m["model_bytes"] - m["table_bytes"])) / CTR_ROW_BYTES
                for m in push_calib]
    exponent = math.log(max(r4, 1.0) / max(r1, 1.0)) / math.log(4.0)
    compute, call, fused, call_calib = call_constants(first)
    # the validation's workers share one 2-core host with Spark's JVMs and the driver: a worker's own
    # work is slower when two run (the projections give each worker a host of its own). The factor
    # is the grouped step's slowdown from 1 to 2 workers, averaging on the first master.
    avg = {m["workers"]: m for m in first if m["engine"] == "averaging/epoch"}
    shared = avg[2]["step_s"] / avg[1]["step_s"] if 2 in avg and CONTENDED else 1.0
    out = []
    for m in measured:
        k = shared if m["workers"] == 2 else 1.0
        w = sm.Workload("CTR bench", compute * k, VALIDATION_BATCH, dense_bytes=m["model_bytes"] - m["table_bytes"],
                        table_bytes=m["table_bytes"], rows_per_batch=VALIDATION_BATCH * CTR_FIELDS,
                        row_bytes=CTR_ROW_BYTES, table_rows=m["vocab"], steps_per_epoch=m["steps"], step_cv=0.0,
                        push_fixed_s=push_fixed * k, push_byte_s=push_byte * k,
                        touched_rows_1=r1, touch_exponent=exponent, call_s=call * k, fused_call_s=fused * k)
        engine = next(e for e, _ in VALIDATED if e.label == m["engine"])
        p = sm.predict(engine, w, m["workers"], (networks or {}).get(m["master"], net), server, ring, spark_costs)
        # the model's rate counts full batches of every worker; the fit's epoch has what the data has
        predicted = p.samples_per_s
        extra = {}
        if m["pushes"]:
            steps = w.steps_per_epoch if engine.every is None else engine.every  # a push's steps
            extra = {"push_bytes_predicted": 2.0 * (w.dense_bytes + w.touched_bytes(steps)),
                     "push_bytes_measured": m["push_bytes"] / m["pushes"], "touch_exponent": exponent}
        out.append({**m, **extra, "predicted": predicted, "ratio": predicted / m["samples_per_s"], "bottleneck": p.bottleneck,
                    "calibration": m is calib or any(m is c for c in push_calib + call_calib) or (k != 1.0 and m is avg[2]),
                    "host_share": k,
                    "push_fixed_s": push_fixed, "push_byte_s": push_byte, "stage_s": spark_costs.stage_s,
                    "compute_s": compute, "call_s": call, "fused_call_s": fused})
    return out


def call_constants(measured: list[dict]) -> tuple[float, float, float, list[dict]]:
    """A worker's compute per step and the cost of one call of its compiled step, from the 1-worker
    fits: averaging runs 16 steps per call (worker.stepsPerExecution), asynchronous PS/batch one
    (its push's own seconds taken out); allreduce's fused step (two calls and the gradient's copies
    every step) from allreduce fp32. Returns (compute, per call, fused per step, the fits used)."""
    one = {m["engine"]: m for m in measured if m["workers"] == 1}
    grouped, single, fused = one["averaging/epoch"], one["asynchronous PS/batch"], one["allreduce fp32"]
    g = sm.STEPS_PER_EXECUTION
    s1 = single["step_s"] - single["push_sync_s"] / single["steps"]
    call = max(0.0, (s1 - grouped["step_s"]) / (1.0 - 1.0 / g))
    compute = max(1e-6, grouped["step_s"] - call / g)
    return compute, call, max(0.0, fused["step_s"] - compute), [fused]


CONTENDED = os.environ.get("SCALING_NO_HOST_SHARE") is None  # set it to compare without the factor


def median_fits(measured: list[dict]) -> list[dict]:
    """One fit per (master, engine, workers): with repeated rounds, the one of median samples/s."""
    groups: dict[tuple, list[dict]] = {}
    for m in measured:
        groups.setdefault((m["master"], m["engine"], m["workers"]), []).append(m)
    out = []
    for fits in groups.values():
        fits = sorted(fits, key=lambda m: m["samples_per_s"])
        out.append({**fits[len(fits) // 2], "repeats": [x for f in fits for x in f.get("repeats", [f["samples_per_s"]])]})
    return out


def worker_push_constants(measured: list[dict]) -> tuple[float, float, list[dict]]:
    """A worker's own seconds per push (the delta, applying what it pulled): fixed + per byte, from
    the asynchronous fits with one worker pushing every step and every 4 steps (what the tasks
    report as ``push_sync_seconds``)."""
    one = [m for m in measured if m["workers"] == 1 and m["engine"].startswith("asynchronous PS/") and m["pushes"]]
    a = next(m for m in one if m["engine"] == "asynchronous PS/batch")
    b = next(m for m in one if m["engine"] == "asynchronous PS/4")
    (sa, ba), (sb, bb) = [(m["push_sync_s"] / m["pushes"], m["push_bytes"] / m["pushes"]) for m in (a, b)]
    per_byte = max(0.0, (sb - sa) / (bb - ba)) if bb != ba else 0.0
    return max(0.0, sa - ba * per_byte), per_byte, [a, b]


def plot(projections: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True, sharey=True)
    for ax, (title, table) in zip(axes.flat, projections.items()):
        for i, (label, preds) in enumerate(table.items()):
            style = "-" if "PS" not in label else "--" if "asynchronous" in label or "hogwild" in label else ":"
            ax.plot([p["workers"] for p in preds], [p["efficiency"] for p in preds], style, marker=".", label=label,
                    color=plt.cm.tab20(i % 20))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.axhline(0.85, color="grey", linewidth=0.5)
        ax.set_title(title)
        ax.set_xlabel("workers")
        ax.set_ylabel("scaling efficiency")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("sparkdl_train: projected scaling efficiency (bench/scaling/measure.py, constants measured on this machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def project(ctr: sm.Workload, dense: sm.Workload, server: sm.Server, ring: sm.Ring, spark: sm.SparkCosts,
            plot_path: str | None = None) -> dict:
    """Efficiency for N = 1 ... 256 per engine, both models, 10 and 25 Gb/s: printed, and plotted."""
    projections = {}
    for gbps in (10, 25):
        net = sm.Network(gbps)
        for w in (ctr, dense):
            table = sm.sweep(sm.ENGINES, w, net, server, ring, spark)
            projections[f"{w.name} @ {gbps} Gb/s"] = {k: [vars(x) for x in v] for k, v in table.items()}
            print(f"\n{w.name} at {gbps} Gb/s: efficiency (bottleneck at 64 workers)")
            print(f"  {'engine':<40}" + "".join(f"{n:>7}" for n in (1, 2, 4, 8, 16, 32, 64, 128, 256)))
            for label, preds in table.items():
                print(f"  {label:<40}" + "".join(f"{x.efficiency:>7.2f}" for x in preds) + f"   {preds[6].bottleneck}")
    if plot_path:
        plot(projections, plot_path)
    return projections


def print_checks(checks: list[dict]) -> None:
    c0 = checks[0]
    print(f"\nvalidation (calibration rows, on {c0['master']}: compute per step and per call of the compiled step from "
          "averaging (16 steps a call) and asynchronous PS/batch (one), the fused step from allreduce fp32, a "
          "worker's own push cost and the rows a push carries from asynchronous PS/batch and PS/4, all with 1 "
          f"worker): compute {c0['compute_s'] * 1e3:.2f} ms a step, {c0['call_s'] * 1e3:.2f} ms a call, fused step "
          f"{c0['fused_call_s'] * 1e3:.2f} ms beyond the compute")
    print(f"  {'master':<24}{'engine':<40}{'N':>3}{'daemons':>8}{'measured/s':>12}{'predicted/s':>13}{'ratio':>7}"
          f"{'kB/push meas.':>15}{'pred.':>8}  bottleneck")
    for c in checks:
        kb = (f"{c['push_bytes_measured'] / 1e3:>15.0f}{c['push_bytes_predicted'] / 1e3:>8.0f}"
              if "push_bytes_measured" in c else f"{'':>23}")
        spread = c.get("repeats", [])
        rounds = f"  (rounds: {min(spread):.0f}-{max(spread):.0f})" if len(spread) > 1 else ""
        print(f"  {c['master']:<24}{c['engine']:<40}{c['workers']:>3}{len(c['daemons']):>8}{c['samples_per_s']:>12.0f}"
              f"{c['predicted']:>13.0f}{c['ratio']:>7.2f}{kb}  {c['bottleneck']}"
              f"{'  (calibration)' if c['calibration'] else ''}{rounds}", flush=True)
    ratios = [c["ratio"] for c in checks if not c["calibration"]]
    inside = sum(0.8 <= r <= 1.2 for r in ratios)
    print(f"  predictions within 20%: {inside} of {len(ratios)} (ratios {min(ratios):.2f} to {max(ratios):.2f})", flush=True)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--client")
    p.add_argument("--validation-child")
    p.add_argument("--validate-rows", type=int, default=0,
                   help="also fit the CTR bench model on local[2] (1 and 2 workers) with this many rows and "
                        "print each engine's measured samples/s beside the model's")
    p.add_argument("--validate-repeats", type=int, default=1,
                   help="rounds of the validation fits (every fit once per round); each row is the median round's")
    p.add_argument("--validate-masters", nargs="+", default=["local[2]"],
                   help="masters to validate on; the first calibrates (e.g. local[2] local-cluster[2,1,2048])")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--ctr-vocab", type=int, default=1_000_000,
                   help="embedding rows of the projected CTR model (Criteo Kaggle with a minimum count of 10: about 1M)")
    p.add_argument("--json", help="write every measurement and projection here")
    p.add_argument("--plot", help="write the efficiency curves here (PNG, matplotlib)")
    p.add_argument("--from-json", help="print (and plot) the projections from the constants a --json run saved "
                                       "(with --validate-rows: fit again and compare with those constants)")
    p.add_argument("--write", action="store_true", help="with --from-json (no --validate-rows): store the model's predictions "
                                                         "of the saved fits and its projections in bench/results/scaling.json")
    args = p.parse_args(argv)
    if args.client:
        return client_main(json.loads(args.client))
    if args.validation_child:
        return validation_child(json.loads(args.validation_child))
    if args.from_json:  # the projections again from a run's measured constants (no measuring)
        with open(args.from_json) as f:
            saved = json.load(f)
        if args.validate_rows:  # new fits against the saved constants
            saved["validation"] = validate(args.validate_rows, sm.Server(**saved["server"]), sm.Ring(**saved["ring"]),
                                           sm.SparkCosts(**saved["spark"]), saved["loopback_gbps"], args.validate_masters,
                                           args.validate_repeats)
            saved["ctr"].update(push_fixed_s=saved["validation"][0]["push_fixed_s"],
                                push_byte_s=saved["validation"][0]["push_byte_s"])
            saved["spark"]["stage_s"] = saved["validation"][0]["stage_s"]
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(saved, f, indent=1, default=float)
        checks = None
        if saved.get("validation"):  # the saved fits against the model as it is now
            checks = compare(saved["validation"], sm.Server(**saved["server"]), sm.Ring(**saved["ring"]),
                             sm.SparkCosts(**saved["spark"]), saved["loopback_gbps"])
            print_checks(checks)
        projections = project(sm.Workload(**saved["ctr"]), sm.Workload(**saved["dense"]), sm.Server(**saved["server"]),
                              sm.Ring(**saved["ring"]), sm.SparkCosts(**saved["spark"]), args.plot)
        if args.write and not args.validate_rows:
            from bench.harness import results

            update = {"projections": projections, **({"validation": checks} if checks else {})}
            print("wrote", results.rederive("scaling", json.loads(json.dumps(update, default=float))))
        return projections

    print(f"bench/scaling/measure.py  cpus={os.cpu_count()}  (clients share these cores with the server)", flush=True)
    ctr_c, ctr_cv, ctr_bytes, ctr_tables = compute_seconds("ctr", CTR_BATCH)
    dense_c, dense_cv, dense_bytes, _ = compute_seconds("dense", 64, reps=8)
    print(f"  compute: CTR DeepFM batch {CTR_BATCH} {ctr_c * 1e3:.1f} ms/step (cv {ctr_cv:.2f}); "
          f"dense {dense_bytes / 4e6:.1f}M params batch 64 {dense_c * 1e3:.1f} ms/step (cv {dense_cv:.2f})", flush=True)
    ctr = sm.Workload("CTR (DeepFM)", ctr_c, CTR_BATCH, dense_bytes=ctr_bytes - ctr_tables,
                      table_bytes=args.ctr_vocab * CTR_ROW_BYTES, rows_per_batch=CTR_BATCH * CTR_FIELDS,
                      row_bytes=CTR_ROW_BYTES, table_rows=args.ctr_vocab, step_cv=ctr_cv)
    dense = sm.Workload("dense 25M", dense_c, 64, dense_bytes=dense_bytes, step_cv=dense_cv)
    rows_per_push = int(round(ctr.touched_bytes(1) / CTR_ROW_BYTES))
    SHAPES["ctr sparse"] = (int(ctr.dense_bytes), args.ctr_vocab, CTR_ROW_BYTES // 4, rows_per_push)
    SHAPES["ctr sparse/4"] = (int(ctr.dense_bytes), args.ctr_vocab, CTR_ROW_BYTES // 4, rows_per_push // 4)

    rows: dict[str, list[dict]] = {}
    for shape in SHAPES:
        rows[shape] = []
        for n in args.clients:
            r = saturation(shape, n, args.seconds)
            rows[shape].append(r)
            print(f"  server, {shape:<12} {n:>3} clients: {r['requests_per_s']:>8.0f} req/s, "
                  f"{r['requests_per_s'] * r['bytes_per_request'] / 1e6:>8.1f} MB/s, "
                  f"{r['bytes_per_request'] / 1e3:>8.1f} kB/request", flush=True)
    server = fit_server(rows)
    print(f"  -> request_s {server.request_s * 1e6:.0f} us, serial {server.serial_bytes_per_s / 1e9:.2f} GB/s", flush=True)
    print(f"  -> per table row {server.row_s * 1e9:.0f} ns (from the {rows_per_push}-row shape)", flush=True)
    print("  check, every saturation run (req/s; the 'ctr sparse/4' shape was not used to fit):", flush=True)
    for shape, runs in rows.items():
        for r in runs:
            r["predicted_requests_per_s"] = saturation_prediction(server, shape, r, os.cpu_count() or 1)
            print(f"    {shape:<12} {r['clients']:>3} clients: measured {r['requests_per_s']:>7.0f}, predicted "
                  f"{r['predicted_requests_per_s']:>7.0f} ({r['predicted_requests_per_s'] / r['requests_per_s']:.2f}x); "
                  f"CPU per request: server {r['server_cpu_s'] * 1e3:.2f} ms, clients {r['client_cpu_s'] * 1e3:.2f} ms",
                  flush=True)
    print("  saturation throughput (the best run of each shape): " + "; ".join(
        f"{shape} measured {max(r['requests_per_s'] for r in runs):.0f}, predicted "
        f"{max(r['predicted_requests_per_s'] for r in runs):.0f} req/s" for shape, runs in rows.items()), flush=True)
    ring, loopback_gbps = ring_constants()
    print(f"  ring: {ring.call_s * 1e6:.0f} us per call, {ring.hop_s * 1e6:.0f} us per hop", flush=True)
    spark = spark_constants()
    print(f"  spark: stage {spark.stage_s * 1e3:.0f} ms, Python task {spark.python_task_s * 1e3:.0f} ms, driver "
          f"{spark.task_s * 1e3:.2f} ms per task, rendezvous "
          f"{spark.rendezvous_s * 1e3:.0f} ms, driver merge {spark.merge_bytes_per_s / 1e9:.1f} GB/s", flush=True)
    checks = []
    if args.validate_rows:
        checks = validate(args.validate_rows, server, ring, spark, loopback_gbps, args.validate_masters,
                          args.validate_repeats)
        print_checks(checks)
    if checks:
        ctr = dataclasses.replace(ctr, push_fixed_s=checks[0]["push_fixed_s"], push_byte_s=checks[0]["push_byte_s"])
        spark = dataclasses.replace(spark, stage_s=checks[0]["stage_s"])
        print(f"  a fit's stage: {spark.stage_s * 1e3:.0f} ms outside its tasks per epoch (the no-op stage's "
              "cost replaced by the calibration fit's)", flush=True)
        print(f"  worker per push: {ctr.push_fixed_s * 1e3:.2f} ms + {ctr.push_byte_s * 1e9:.2f} ns/byte "
              "(from the 1-worker asynchronous fits)", flush=True)
    projections = project(ctr, dense, server, ring, spark, args.plot)
    out = {"server_rows": rows, "server": vars(server), "ctr": vars(ctr), "dense": vars(dense), "ring": vars(ring),
           "spark": vars(spark), "loopback_gbps": loopback_gbps, "validation": checks, "projections": projections}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    if checks:  # a full run (constants, validation, projections) is what docs/scaling.md shows
        from bench.harness import results

        print("wrote", results.write("scaling", json.loads(json.dumps(out, default=float))))


if __name__ == "__main__":
    main(sys.argv[1:])
