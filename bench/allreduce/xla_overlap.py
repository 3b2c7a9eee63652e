"""How much of a gradient exchange XLA's own collectives hide behind the backward pass (issue 37's
overlap lever, measured on this machine's CPU with Keras 3 on JAX).

Two processes form one JAX job (``keras.distribution.initialize``: ``jax.distributed`` with Gloo on
CPU) and train one model data-parallel (``keras.distribution.DataParallel``): each feeds its own
batch, XLA inserts the gradients' all-reduce into the compiled train step and schedules it. Three
timings, each with two processes running at once so that they share the cores the same way:

* ``compute``: the train step alone, each process on its own (no distribution);
* ``exchange``: one jitted all-reduce of a buffer the size of the gradients between the two
  processes, nothing else;
* ``data parallel``: the distributed train step (compute plus its exchange, as XLA schedules it).

hidden = (compute + exchange - data parallel) / exchange: 1 when the exchange ran entirely under
the backward pass, 0 when it ran after it. Printed as one ``RESULT`` JSON line.

    KERAS_BACKEND=jax python -m bench.allreduce.xla_overlap [--width 1024] [--layers 4] [--batch 256] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(args):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((args.width,))
    h = inputs
    for _ in range(args.layers):
        h = keras.layers.Dense(args.width, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(keras.optimizers.SGD(0.001), "mse")
    return model


def _timed(fn, steps: int) -> float:
    fn()
    fn()  # compiled and warm
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def child(args) -> None:
    """One process of one measurement: ``args.what`` in compute / exchange / dp."""
    import jax
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras

    rng = np.random.default_rng(args.rank)
    x = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    y = rng.standard_normal((args.batch, 1)).astype(np.float32)
    if args.what != "compute":
        keras.distribution.initialize(f"127.0.0.1:{args.port}", num_processes=2, process_id=args.rank)
    out: dict = {"rank": args.rank, "what": args.what, "devices": len(jax.devices())}
    if args.what == "exchange":
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        model = _model(args)
        n = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        mesh = Mesh(np.array(jax.devices()), ("d",))
        local = np.ones((1, n), np.float32)
        arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
        total = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P()))
        out["seconds"] = _timed(lambda: total(arr).block_until_ready(), args.steps)
        out["bytes"] = 4 * n
    else:
        if args.what == "dp":
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices(), auto_shard_dataset=False))
        model = _model(args)

        def step():
            model.train_on_batch(x, y)
            jax.block_until_ready([v.value for v in model.trainable_variables])

        out["seconds"] = _timed(step, args.steps)
        out["loss"] = float(model.evaluate(x, y, verbose=0))
    if args.what != "compute":
        jax.distributed.shutdown()
    print("CHILD " + json.dumps(out), flush=True)


def _pair(what: str, args) -> list[dict]:
    port = _free_port()
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           # one compute thread per process: two processes on two cores, as two ranks with a core each
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
    procs = [subprocess.Popen([sys.executable, "-m", "bench.allreduce.xla_overlap", "--child", what, "--rank", str(r), "--port", str(port),
                               "--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
                               "--steps", str(args.steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        lines = [line for line in stdout.splitlines() if line.startswith("CHILD ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"{what} process failed (exit {p.returncode}):\n{stderr[-3000:]}")
        out.append(json.loads(lines[-1][6:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--child")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.child:
        args.what = args.child
        return child(args)
    runs = {what: _pair(what, args) for what in ("compute", "exchange", "dp")}
    sec = {what: max(r["seconds"] for r in rs) for what, rs in runs.items()}  # a step ends when its slower rank does
    hidden = (sec["compute"] + sec["exchange"] - sec["dp"]) / sec["exchange"]
    result = {"width": args.width, "layers": args.layers, "batch_per_process": args.batch,
              "gradient_bytes": runs["exchange"][0]["bytes"], "devices": runs["dp"][0]["devices"],
              "compute_s": sec["compute"], "exchange_s": sec["exchange"], "data_parallel_s": sec["dp"],
              "hidden_fraction": hidden,
              "dp_losses_equal": runs["dp"][0]["loss"] == runs["dp"][1]["loss"]}
    print(f"model: {args.layers} x Dense({args.width}), {result['gradient_bytes'] / 1e6:.1f} MB of gradients, "
          f"batch {args.batch} per process, 2 processes on {os.cpu_count()} cores")
    print(f"  compute alone        {sec['compute'] * 1e3:8.2f} ms per step")
    print(f"  exchange alone       {sec['exchange'] * 1e3:8.2f} ms (XLA all-reduce over Gloo)")
    print(f"  data-parallel step   {sec['dp'] * 1e3:8.2f} ms")
    print(f"  hidden behind the step: {hidden:.0%} of the exchange")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
