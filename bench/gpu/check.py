"""The executor's own code path on one GPU, with Keras on JAX, and no JVM.

What a Spark task of a fit runs, driven here without Spark: the driver's model serialized
(:func:`sparkdl_train.model_io.serialize_model`) and its state encoded, as broadcast; the task's
partition pass (:class:`sparkdl_train.worker.tasks.TrainEpochTask`: the model rebuilt and cached
in this process on JAX's default device, the GPU when there is one; Arrow record batches of
Criteo-shaped CTR columns through the column mapping, re-batching and the prefetch thread; grouped
compiled steps; metric state); a parameter-server worker (:class:`sparkdl_train.worker.ps_task.PSTrainTask`)
pushing and pulling against a :class:`sparkdl_train.ps.server.ParameterServer` in this process
(sparse embedding rows, every 16 steps); the allreduce's fused gradient step. It prints one JSON
object:

* ``pass``: samples/s of the partition pass (model cached, second epoch) against
  ``keras.Model.fit`` of the same model, data (as numpy) and batch on the same device, with
  ``steps_per_execution`` equal to the pass's group; ``ratio`` = pass / fit;
* ``pinned_reads``: the pass at the largest batch with the returned state read through pinned host
  memory (the JAX backend's default on an accelerator) and through pageable memory, alternating;
* ``placement``: the device of every variable after the pass, and of the step's outputs;
* ``cpu_equality``: the same pass from the same state on the CPU, max abs difference of every
  weight after it (GPU float arithmetic differs in the last bits);
* ``push``: one push and pull from the worker's model on the device: device-to-host and
  host-to-device seconds and bytes (dense weights and the touched embedding rows), and the
  parameter-server task's samples/s;
* ``fused``: the fused step's gradient (forward, backward, flattening into one vector, copy to
  the host) and apply (copy to the device, split, optimizer) against one plain train step; and
  (``sparse_rows``) the same with the tables' gradients handed over as the rows the step touched
  (``allreduce.sparseGradients``: what reaches the host, and the time); and the step through XLA's
  collectives (``allreduce.collectives='xla'``, one rank: gradients, sum and update in one program on
  the device, ``collective_over_plain``);
* ``state_transfer``: the whole state read to the host and written back, per variable against
  batched transfers and pinned host memory;
* ``prepare_ahead``: the prepare job's task on a fresh worker, then the first pass: whether it
  found its steps compiled, and its seconds against a second pass;
* ``resnet`` (``--resnet-batch`` above 0): ResNet-50 in mixed bfloat16, the allreduce's fused step
  against the plain compiled train step at that batch: what staging a 25M-parameter gradient
  through host memory costs on the device (pageable copies, and the vector read through pinned
  host memory), the figure the GPU projection of ``docs/scaling.md`` leaves out; and the step
  through XLA's collectives, which stages nothing.

Without a GPU it runs on the CPU (the default suite runs it small: ``tests/spark/test_jax_backend.py``).

    KERAS_BACKEND=jax python -m bench.gpu.check --rows 2000000 --batch 512 4096 --resnet-batch 256

(what ran on the H200 on 2026-11-27, 143 s in one ``device`` call; ``--sections`` picks sections;
``--sections pass --repeats 5`` gave the medians in docs/performance.md, 66 s.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402


def ctr_record_batches(rows: int, vocab: int, chunk: int, seed: int = 42) -> tuple[list, dict, np.ndarray]:
    """Criteo-shaped columns (13 float, 26 int ids below ``vocab``, a label from the planted model)
    as Arrow record batches of ``chunk`` rows, and the same as numpy for ``Model.fit``."""
    import pyarrow as pa

    from sparkdl_train.datasets.ctr import CAT_COLS, DENSE_COLS, CTRSpec, PlantedModel, sample_features

    spec = CTRSpec(rows=rows, seed=seed)
    planted = PlantedModel.make(spec)
    rng = np.random.default_rng([seed, 3])
    dense, cats = sample_features(spec, rng, rows)
    label = (rng.random(rows) < planted.probability(dense, cats)).astype(np.float32)
    numeric = np.log1p(dense).astype(np.float32)
    ids = (cats % vocab).astype(np.int64)
    batches = []
    for start in range(0, rows, chunk):
        end = min(rows, start + chunk)
        cols = [pa.array(numeric[start:end, i]) for i in range(len(DENSE_COLS))]
        cols += [pa.array(ids[start:end, i]) for i in range(len(CAT_COLS))]
        cols.append(pa.array(label[start:end]))
        batches.append(pa.RecordBatch.from_arrays(cols, [*DENSE_COLS, *CAT_COLS, "label"]))
    return batches, {"numeric": numeric, "categorical": ids.astype(np.int32)}, label[:, None]


def build_model(vocab: int, seed: int = 1):
    import keras

    from sparkdl_train.models.ctr import deepfm

    keras.utils.set_random_seed(seed)
    return deepfm(vocab)


class Ref:
    def __init__(self, value):
        self.value = value


def devices_of(model) -> dict[str, int]:
    from sparkdl_train import backend

    out: dict[str, int] = {}
    for v in [*model.weights, *model.optimizer.variables, *model.metrics_variables]:
        d = backend.current().device_of(v)
        out[d] = out.get(d, 0) + 1
    return out


def partition_pass(payload, state, settings, batches, mapping, epoch=0, task=None):
    from sparkdl_train.worker.tasks import TrainEpochTask

    task = task or TrainEpochTask(Ref(payload), Ref(state), epoch, settings)
    t0 = time.perf_counter()
    partial = task(0, mapping.chunks(iter(batches), 0))
    return partial, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--vocab", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--group", type=int, default=16, help="steps per call (spark.sparkdl_train.worker.stepsPerExecution)")
    ap.add_argument("--chunk", type=int, default=8192, help="rows per Arrow record batch")
    ap.add_argument("--equality-steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1, help="timed passes and fits per batch, alternating (medians)")
    ap.add_argument("--resnet-batch", type=int, default=0, help="ResNet-50 fused-step section at this batch (0: skipped)")
    ap.add_argument("--resnet-size", type=int, default=224, help="ResNet-50 input height and width")
    ap.add_argument("--sections", default="pass,cpu_equality,push,fused,state_transfer,prepare_ahead",
                    help="comma-separated sections to run (resnet runs when --resnet-batch > 0)")
    ap.add_argument("--output")
    ap.add_argument("--write", action="store_true",
                    help="store the result as bench/results/gpu_check.json (gpu_check_repeats.json with --repeats > 1)")
    args = ap.parse_args(argv)

    import jax
    import keras

    from sparkdl_train import backend
    from sparkdl_train.data.spec import resolve_columns
    from sparkdl_train.datasets.ctr import CAT_COLS, DENSE_COLS
    from sparkdl_train.model_io import input_infos, serialize_model
    from sparkdl_train.worker import runtime
    from sparkdl_train.worker.tasks import StepSettings, encode_state

    assert keras.backend.backend() == "jax", keras.backend.backend()
    device = jax.devices()[0]
    out: dict = {
        "date": time.strftime("%Y-%m-%d"), "device": f"{device.platform}:{device.id} {getattr(device, 'device_kind', '')}",
        "jax": jax.__version__, "keras": keras.__version__, "rows": args.rows, "vocab": args.vocab, "group": args.group,
    }
    t0 = time.perf_counter()
    batches, x_np, y_np = ctr_record_batches(args.rows, args.vocab, args.chunk)
    out["data_seconds"] = round(time.perf_counter() - t0, 2)

    driver = build_model(args.vocab)
    payload = serialize_model(driver)
    state = encode_state(driver, include_optimizer=True)
    mapping = resolve_columns(input_infos(driver), {"numeric": DENSE_COLS, "categorical": CAT_COLS}, "label")
    sections = set(args.sections.split(","))
    out["pass"] = {}
    for bs in (args.batch if "pass" in sections else []):
        settings = StepSettings(batch_size=bs, group=args.group, keras_backend="jax")
        partition_pass(payload, state, settings, batches, mapping)  # compiles (model rebuilt once per process)
        partial, seconds = partition_pass(payload, state, settings, batches, mapping, epoch=1)
        info = partial.partitions[0]
        model = runtime.get_model(payload)
        out["placement"] = devices_of(model)
        # keras' own fit, same model (a fresh one from the same state), data and batch, same device
        ref = build_model(args.vocab)
        ref.set_weights(driver.get_weights())
        ref.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=[
            keras.metrics.AUC(name="auc", num_thresholds=1000), keras.metrics.BinaryAccuracy(name="accuracy")],
            steps_per_execution=args.group)
        ref.fit(x_np, y_np, batch_size=bs, epochs=1, shuffle=False, verbose=0)  # compiles
        t1 = time.perf_counter()
        ref.fit(x_np, y_np, batch_size=bs, epochs=1, shuffle=False, verbose=0)
        fit_seconds = time.perf_counter() - t1
        steps_seconds = info.get("seconds")
        out["pass"][str(bs)] = {
            "samples": partial.samples, "task_seconds": round(seconds, 3), "pass_samples_per_s": round(partial.samples / seconds),
            "fit_samples_per_s": round(args.rows / fit_seconds), "ratio": round(fit_seconds / seconds, 3),
            "task_info_seconds": steps_seconds, "step_calls": info.get("step_calls"), "startup": info.get("startup"),
        }
        if args.repeats > 1:  # alternating, the medians' ratio (one pass against one fit moves 0.93-1.46x)
            passes, steps, fits = [seconds], [steps_seconds], [fit_seconds]
            for _ in range(args.repeats - 1):
                p, sec = partition_pass(payload, state, settings, batches, mapping, epoch=1)
                passes.append(sec)
                steps.append(p.partitions[0].get("seconds"))
                t1 = time.perf_counter()
                ref.fit(x_np, y_np, batch_size=bs, epochs=1, shuffle=False, verbose=0)
                fits.append(time.perf_counter() - t1)
            out["pass"][str(bs)]["repeated"] = {
                "pass_seconds": [round(x, 4) for x in passes], "steps_seconds": steps, "fit_seconds": [round(x, 4) for x in fits],
                "median_ratio": round(float(np.median(fits)) / float(np.median(passes)), 3),
                "median_beyond_steps_seconds": round(float(np.median(np.subtract(passes, steps))), 4)}
        print(json.dumps({"batch": bs, **out["pass"][str(bs)]}), file=sys.stderr, flush=True)
    if "pass" in sections:
        out["pinned_reads"] = pinned_reads_ab(payload, state, batches, mapping, args)
        print(json.dumps({"pinned_reads": out["pinned_reads"]}), file=sys.stderr, flush=True)

    runs = {
        "cpu_equality": lambda: cpu_equality(payload, state, batches, mapping, args),
        "push": lambda: push_cost(payload, state, batches, mapping, args),
        "fused": lambda: fused_cost(payload, x_np, y_np, args),
        "state_transfer": lambda: state_transfer(payload),
        "prepare_ahead": lambda: prepare_ahead(payload, state, batches, mapping, args),
    }
    if args.resnet_batch > 0:
        runs["resnet"] = lambda: resnet_fused(args.resnet_batch, args.resnet_size)
        sections.add("resnet")
    for name, run in runs.items():
        if name in sections:
            try:
                out[name] = run()
            except Exception as exc:  # noqa: BLE001 - one section's failure is reported, the others still run
                import traceback

                out[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
            print(json.dumps({name: out[name]}, default=str), file=sys.stderr, flush=True)
    out["backend"] = backend.current().NAME
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    if args.write:
        from bench.harness import results

        name = "gpu_check_repeats" if args.repeats > 1 else "gpu_check"
        print("wrote", results.write(name, json.loads(text)), file=sys.stderr)
    return out


def pinned_reads_ab(payload, state, batches, mapping, args, rounds: int = 2) -> dict:
    """The averaging task's pass at the largest batch with the state returned through pinned host
    memory (the JAX backend's default on an accelerator) and without, alternating: seconds of
    each pass and the medians' ratio."""
    from sparkdl_train.backend import jax as jax_backend
    from sparkdl_train.worker.tasks import StepSettings

    bs = max(args.batch)
    settings = StepSettings(batch_size=bs, group=args.group, keras_backend="jax")
    times: dict[str, list[float]] = {"pageable": [], "pinned": []}
    previous = jax_backend.PINNED_READS
    try:
        for _ in range(rounds):
            for name, flag in (("pageable", False), ("pinned", None)):
                jax_backend.PINNED_READS = flag
                times[name].append(round(partition_pass(payload, state, settings, batches, mapping, epoch=1)[1], 4))
    finally:
        jax_backend.PINNED_READS = previous
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"batch": bs, "seconds": times, "pinned_over_pageable": round(med["pinned"] / med["pageable"], 3)}


def _first_rows(batches, rows):
    taken, n = [], 0
    for b in batches:
        if n >= rows:
            break
        taken.append(b.slice(0, min(b.num_rows, rows - n)))
        n += taken[-1].num_rows
    return taken


def cpu_equality(payload, state, batches, mapping, args) -> dict:
    """The pass over ``equality_steps`` batches from the same state on the default device and on the
    CPU: the largest weight difference."""
    import jax

    from sparkdl_train.worker import runtime
    from sparkdl_train.worker.tasks import StepSettings

    bs = args.batch[0]
    part = _first_rows(batches, bs * args.equality_steps)
    settings = StepSettings(batch_size=bs, group=args.group, keras_backend="jax")
    results = {}
    for name, dev in (("default", jax.devices()[0]), ("cpu", jax.devices("cpu")[0])):
        runtime._models.clear()  # rebuilt on this device
        with jax.default_device(dev):
            partition_pass(payload, state, settings, part, mapping)
            model = runtime.get_model(payload)
            results[name] = [np.asarray(w) for w in model.get_weights()]
            results[name + "_devices"] = devices_of(model)
    runtime._models.clear()
    diffs = [float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(results["default"], results["cpu"])]
    scale = max(float(np.max(np.abs(a))) for a in results["cpu"] if a.size)
    return {"steps": args.equality_steps, "batch": bs, "max_abs_diff": max(diffs), "max_abs_weight": scale,
            "devices": {"default": results["default_devices"], "cpu": results["cpu_devices"]}}


def push_cost(payload, state, batches, mapping, args) -> dict:
    """A parameter-server worker on the device: its pass against a server in this process, and one
    push/pull's device-to-host and host-to-device cost."""
    from sparkdl_train.driver.sparse_tables import find_tables
    from sparkdl_train.net import new_secret
    from sparkdl_train.ps.server import ParameterServer
    from sparkdl_train.ps.state import ServerState
    from sparkdl_train.worker import runtime
    from sparkdl_train.worker.ps_task import PSSettings, PSTrainTask
    from sparkdl_train.worker.row_sync import TableSync
    from sparkdl_train.worker.tasks import StepSettings

    bs = args.batch[0]
    model = runtime.get_model(payload)  # the cached one (rebuilt if cpu_equality cleared it)
    tables = find_tables(model)
    weights = [w.numpy() for w in model.weights]
    ps_state = ServerState(weights, "asynchronous", sparse=[t.index for t in tables])
    secret = new_secret()
    server = ParameterServer(ps_state, "127.0.0.1", secret)
    server.start()
    try:
        host, port = server.address
        settings = StepSettings(batch_size=bs, group=args.group, keras_backend="jax")
        ps = PSSettings(host, port, secret, every=args.group, tables=tables)
        part = _first_rows(batches, min(args.rows, bs * args.group * 40))
        rows = sum(b.num_rows for b in part)
        task = PSTrainTask(Ref(payload), Ref(state), 0, settings, ps)
        partition_pass(payload, state, settings, part, mapping, task=task)  # compiles
        task = PSTrainTask(Ref(payload), Ref(state), 1, settings, ps)
        partial, seconds = partition_pass(payload, state, settings, part, mapping, task=task)
        # a push's reads (device to host) and a reply's writes (host to device), on the worker's model, as a
        # worker runs them (the window's rows wanted, the reply received, the window trained, the delta):
        # medians of three after one that compiles
        import jax

        model = runtime.get_model(payload)
        sync = TableSync(model, tables)
        window = [b for b in mapping.chunks(iter(_first_rows(part, bs * args.group)), 0)]
        served = [w.numpy() for w in model.weights]
        sync.receive(served, None)
        timed = []
        for _ in range(4):
            want = sync.want(window)
            arrays = [a[want[i]] if i in want else a for i, a in enumerate(served)]
            jax.block_until_ready([w.value for w in model.weights])
            t0 = time.perf_counter()
            sync.receive(arrays, want)
            jax.block_until_ready([w.value for w in model.weights])
            h2d = time.perf_counter() - t0
            list(sync.track(iter(window)))
            t0 = time.perf_counter()
            delta = sync.delta(1.0)
            timed.append((time.perf_counter() - t0, h2d))
        d2h, h2d = (float(np.median([t[k] for t in timed[1:]])) for k in (0, 1))
        d2h_bytes = sum(getattr(d, "nbytes", 0) or (d.ids.nbytes + d.rows.nbytes) for d in delta)
        h2d_bytes = sum(a.nbytes for a in arrays)
        return {"ps_samples_per_s": round(rows / seconds), "rows": rows, "every": args.group,
                "push_d2h_seconds": round(d2h, 5), "push_d2h_bytes": int(d2h_bytes),
                "pull_h2d_seconds": round(h2d, 5), "pull_h2d_bytes": int(h2d_bytes),
                "first_push_seconds": round(timed[0][0] + timed[0][1], 5), "reused": sync.reused,
                "tables": [t.name for t in tables], "server_updates": ps_state.stats.as_dict().get("updates")}
    finally:
        server.stop()


def prepare_ahead(payload, state, batches, mapping, args) -> dict:
    """The prepare job's task (:class:`sparkdl_train.worker.prepare.PrepareTask`) on a fresh model
    cache, then the first partition pass on it: does the pass find its steps compiled (XLA compiles
    per shape: the prepare task compiles a pass's call shapes from the data's signature), and what
    did the first pass cost against a second one."""
    from sparkdl_train.data.batching import row_signature, take_rows
    from sparkdl_train.worker import runtime
    from sparkdl_train.worker.prepare import PrepareTask
    from sparkdl_train.worker.tasks import StepSettings

    out = {}
    for bs in args.batch:
        part = _first_rows(batches, min(args.rows, bs * args.group * 20))
        first = next(iter(mapping.chunks(iter(part[:1]), 0)))
        signature = take_rows(first, slice(0, 0))
        settings = StepSettings(batch_size=bs, group=args.group, keras_backend="jax", labels=row_signature(first[1]))
        runtime._models.clear()
        t0 = time.perf_counter()
        report = PrepareTask(Ref(payload), settings, signature, ("train",))(0)
        prepare_seconds = time.perf_counter() - t0
        partial, first_seconds = partition_pass(payload, state, settings, part, mapping)
        _, second_seconds = partition_pass(payload, state, settings, part, mapping, epoch=1)
        startup = partial.partitions[0].get("startup", {})
        out[str(bs)] = {"prepare_seconds": round(prepare_seconds, 3), "prepare_error": report.get("error"),
                        "model_cached": startup.get("model_cached"), "traced": startup.get("traced"),
                        "first_step_seconds": startup.get("first_step"), "first_pass_seconds": round(first_seconds, 3),
                        "second_pass_seconds": round(second_seconds, 3), "rows": sum(b.num_rows for b in part)}
    runtime._models.clear()
    return out


def state_transfer(payload, repeats: int = 3) -> dict:
    """The model's whole state (weights and optimizer: what an averaging task returns and a task
    starts from) read to the host and written back, several ways: per variable (``v.numpy()``, what
    ``get_state`` does now), all transfers started at once (``jax.device_get``), through pinned host
    memory (``device_put`` to the ``pinned_host`` memory kind, then numpy), and written per variable
    (``v.assign``) against one ``device_put`` of the list. Best of ``repeats``, seconds."""
    import jax

    from sparkdl_train.model_io import state_variables
    from sparkdl_train.worker import runtime

    model = runtime.get_model(payload)
    variables = state_variables(model)
    values = [v.value for v in variables]
    jax.block_until_ready(values)
    arrays = [np.asarray(a) for a in values]
    out: dict = {"arrays": len(values), "bytes": int(sum(a.nbytes for a in arrays))}

    def best(fn, fresh=None):
        """``fresh()`` makes the arguments untimed: a jax Array keeps the host copy it was read
        to once, so every read times new device arrays."""
        times = []
        for _ in range(repeats):
            arg = fresh() if fresh else None
            t0 = time.perf_counter()
            fn(arg) if fresh else fn()
            times.append(time.perf_counter() - t0)
        return round(min(times), 5)

    import jax.numpy as jnp

    def copies():
        return jax.block_until_ready([jnp.copy(v.value) for v in variables])

    out["read_per_variable"] = best(lambda vals: [np.asarray(a) for a in vals], copies)
    out["read_device_get"] = best(lambda vals: jax.device_get(vals), copies)
    device = next(iter(values[0].devices()))
    try:
        pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")

        def via_pinned(vals):
            return [np.asarray(a) for a in jax.block_until_ready(jax.device_put(vals, pinned))]

        out["read_pinned_host"] = best(via_pinned, copies)
        got = via_pinned(copies())
        out["pinned_equal"] = all(np.array_equal(a, b) for a, b in zip(got, arrays))
    except Exception as exc:  # noqa: BLE001 - a platform without pinned host memory: reported
        out["read_pinned_host"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    from sparkdl_train.backend import jax as jax_backend

    out["read_values"] = best(lambda: jax_backend.read_values(variables))  # what get_state does

    def assign_each():
        for v, a in zip(variables, arrays):
            v.assign(a)
        jax.block_until_ready([v.value for v in variables])

    out["write_per_variable"] = best(assign_each)
    out["write_device_put"] = best(lambda: jax.block_until_ready(jax.device_put(arrays, device)))
    out["write_values"] = best(lambda: jax_backend.assign_values(variables, arrays))  # what set_state does
    return out


def collective_step(model, batch, batch_size: int, repeats: int) -> dict:
    """The allreduce step through XLA's collectives (``allreduce.collectives='xla'``) as one rank of
    one: gradients, their sum over the mesh (one device: XLA elides it) and the update in one program on
    the device, nothing through the host but the batch. Mean seconds of ``repeats`` after one compiling
    call, and whether a step matches one of the plain train step from the same weights."""
    import jax

    from sparkdl_train.backend.jax_collectives import CollectiveStep
    from sparkdl_train.data.batching import tree_map

    try:
        step = CollectiveStep(model, batch_size)
        step.load()
        template = tree_map(lambda a: np.asarray(a)[:0], batch)
        t0 = time.perf_counter()
        jax.block_until_ready(step(batch, template))
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(repeats):
            step(batch, template)
        jax.block_until_ready(step.state)
        return {"collective_step_seconds": round((time.perf_counter() - t0) / repeats, 6),
                "collective_compile_seconds": round(compile_s, 2)}
    except Exception as exc:  # noqa: BLE001 - reported with the section's other figures
        return {"collective_error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def fused_cost(payload, x_np, y_np, args) -> dict:
    """The allreduce's fused step (gradient flattened to one vector and copied to the host; the
    summed vector copied back, split and applied) against one train step, on the device."""
    from sparkdl_train import _compat
    from sparkdl_train.worker import runtime
    from sparkdl_train.worker.fused_step import cached_fused_step
    from sparkdl_train.worker.steps import compiled_step

    out = {}
    for bs in args.batch:
        model = runtime.get_model(payload)
        batch = ({k: v[:bs] for k, v in x_np.items()}, y_np[:bs], None)
        _compat.symbolic_build(model, batch)
        step = cached_fused_step(model, bs)
        buf = np.empty(step.size, np.float32)
        step.trace(batch)
        step.gradients(batch, buf)
        step.apply(buf)
        n = 20
        t0 = time.perf_counter()
        for _ in range(n):
            step.gradients(batch, buf)
        grad = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            step.apply(buf)
        import jax

        jax.block_until_ready([v.value for v in model.trainable_variables])
        apply = (time.perf_counter() - t0) / n
        train = compiled_step(model, "train", batch)
        train(batch)
        jax.block_until_ready([v.value for v in model.trainable_variables])
        t0 = time.perf_counter()
        for _ in range(n):
            train(batch)
        jax.block_until_ready([v.value for v in model.trainable_variables])
        plain = (time.perf_counter() - t0) / n
        out[str(bs)] = {"gradients_seconds": round(grad, 6), "apply_seconds": round(apply, 6),
                        "train_step_seconds": round(plain, 6), "vector_bytes": int(buf.nbytes),
                        "fused_over_plain": round((grad + apply) / plain, 2)}
        coll = collective_step(model, batch, bs, n)
        if "collective_step_seconds" in coll:
            coll["collective_over_plain"] = round(coll["collective_step_seconds"] / plain, 2)
        out[str(bs)].update(coll)
        # the same with the tables' gradients as the rows the step touched (allreduce.sparseGradients):
        # the device hands over the nonzero rows (jnp.nonzero at the batch's bound), one rank's rows applied
        from sparkdl_train.driver.sparse_tables import gradient_tables

        tables = gradient_tables(model, True, 2, bs)
        sparse = cached_fused_step(model, bs, 0, tables)
        vec = np.empty(sparse.size, np.float32)
        sparse.trace(batch)
        sparse.gradients(batch, vec)
        sparse.apply(vec, sparse.touched)
        jax.block_until_ready([v.value for v in model.trainable_variables])
        t0 = time.perf_counter()
        for _ in range(n):
            sparse.gradients(batch, vec)
        s_grad = (time.perf_counter() - t0) / n
        touched = sparse.touched
        t0 = time.perf_counter()
        for _ in range(n):
            sparse.apply(vec, touched)
        jax.block_until_ready([v.value for v in model.trainable_variables])
        s_apply = (time.perf_counter() - t0) / n
        out[str(bs)]["sparse_rows"] = {
            "tables": len(tables), "rows_touched": [int(len(ids)) for ids, _ in touched],
            "bytes_to_host": int(vec.nbytes + sum(ids.nbytes + rows.nbytes for ids, rows in touched)),
            "gradients_seconds": round(s_grad, 6), "apply_seconds": round(s_apply, 6),
            "fused_over_plain": round((s_grad + s_apply) / plain, 2)}
    return out


def resnet_fused(batch_size: int, size: int, repeats: int = 10) -> dict:
    """ResNet-50 (``keras.applications``, no weights, 1000 classes) under the ``mixed_bfloat16``
    policy: the plain compiled train step against the allreduce's fused step (forward, backward,
    the float32 gradient flattened into one vector and copied to the host; the vector copied back,
    split and applied), and the vector's device-to-host copy alone, pageable and through pinned
    host memory. Mean of ``repeats`` after one compiling call, seconds."""
    import jax
    import keras

    from sparkdl_train import _compat
    from sparkdl_train.worker.fused_step import cached_fused_step
    from sparkdl_train.worker.steps import compiled_step

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(3)
        model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch_size, size, size, 3), dtype=np.float32)
        y = rng.integers(0, 1000, (batch_size, 1)).astype(np.int32)
        batch = (x, y, None)
        _compat.symbolic_build(model, batch)

        def wait():
            jax.block_until_ready([v.value for v in model.trainable_variables])

        def mean_of(fn):
            fn()
            wait()
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            wait()
            return (time.perf_counter() - t0) / repeats

        train = compiled_step(model, "train", batch)
        t0 = time.perf_counter()
        train(batch)
        wait()
        compile_train = time.perf_counter() - t0
        plain = mean_of(lambda: train(batch))
        step = cached_fused_step(model, batch_size)
        buf = np.empty(step.size, np.float32)
        t0 = time.perf_counter()
        step.trace(batch)
        step.gradients(batch, buf)
        step.apply(buf)
        compile_fused = time.perf_counter() - t0
        from sparkdl_train.backend import jax as jax_backend

        ab: dict = {}
        reads = jax_backend.PINNED_READS
        try:
            for name, flag in (("pageable", False), ("pinned", None), ("pageable_again", False), ("pinned_again", None)):
                jax_backend.PINNED_READS = flag
                ab[name] = {}
                for part, fn in (("gradients_seconds", lambda: step.gradients(batch, buf)), ("apply_seconds", lambda: step.apply(buf))):
                    try:
                        ab[name][part] = round(mean_of(fn), 5)
                    except Exception as exc:  # noqa: BLE001 - reported
                        ab[name][part] = f"{type(exc).__name__}: {str(exc)[:160]}"
        finally:
            jax_backend.PINNED_READS = reads

        def fastest(part):  # the default (pinned reads where the platform has them)
            got = [ab[k][part] for k in ("pinned", "pinned_again") if isinstance(ab[k][part], float)]
            return min(got) if got else float("nan")

        grad, apply = fastest("gradients_seconds"), fastest("apply_seconds")
        coll = collective_step(model, batch, batch_size, repeats)
        if "collective_step_seconds" in coll:
            coll["collective_over_plain"] = round(coll["collective_step_seconds"] / plain, 3)
        device = jax.devices()[0]
        import jax.numpy as jnp

        base = jax.device_put(buf[:-1], device).block_until_ready()

        def copy_times(fn, fresh=False):
            total = 0.0
            for i in range(repeats + 1):  # the first call warms up, untimed
                arg = jnp.copy(base).block_until_ready() if fresh else None
                t0 = time.perf_counter()
                fn(arg) if fresh else fn()
                if i:
                    total += time.perf_counter() - t0
            return total / repeats

        out = {"batch": batch_size, "size": size, "parameters": int(step.size - 1),
               "vector_bytes": int(buf.nbytes), "compile_train_seconds": round(compile_train, 2),
               "compile_fused_seconds": round(compile_fused, 2), "train_step_seconds": round(plain, 5),
               "fused_gradients_seconds": round(grad, 5), "fused_apply_seconds": round(apply, 5),
               "fused_over_plain": round((grad + apply) / plain, 3), "fused_transfers": ab, **coll,
               "d2h_pageable_seconds": round(copy_times(lambda v: np.asarray(jax.device_get(v)), True), 5),
               "h2d_pageable_seconds": round(copy_times(
                   lambda: jax.device_put(buf, device, may_alias=False).block_until_ready()), 5)}
        pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
        for name, fn, fresh in (
                ("d2h_pinned_seconds", lambda v: np.asarray(jax.device_put(v, pinned).block_until_ready()), True),
                ("d2h_pinned_to_numpy_copy_seconds", lambda v: np.array(jax.device_put(v, pinned).block_until_ready()), True)):
            try:
                out[name] = round(copy_times(fn, fresh), 5)
            except Exception as exc:  # noqa: BLE001 - a platform without pinned host memory: reported
                out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return out
    finally:
        keras.config.set_dtype_policy(previous)


if __name__ == "__main__":
    main()
