"""Keras on JAX (sparkdl_train.backend): every engine, model I/O, predict/evaluate, sparse rows and a
checkpoint resume on ``local[2]`` with JAX's CPU build, in a process of its own (tests/scripts/jax_check.py;
this suite's Keras runs on TensorFlow), compared with the same fits on TensorFlow from the same
weights; the GPU check's executor pass (bench/gpu/check.py) on the CPU; the backend checks."""

import json
import os
import subprocess
import sys

import jax_check
import numpy as np
import pytest
from helpers import ROOT, SCRIPTS

from sparkdl_train import backend
from sparkdl_train.driver.preflight import problems
from sparkdl_train.errors import ConfigError


def _env():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("KERAS_BACKEND", None)
    return env


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax")
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "jax_check.py"), str(out)], capture_output=True,
                          text=True, timeout=900, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    with open(out / "jax.json") as f:
        result = json.load(f)
    result["weights"] = dict(np.load(out / "jax_weights.npz"))
    return result


SMOKE = ("averaging", "async-4", "allreduce")  # one engine of each family, for the default suite


@pytest.fixture(scope="module")
def jax_smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_smoke")
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "jax_check.py"), str(out), "local[2]", ",".join(SMOKE)],
                          capture_output=True, text=True, timeout=900, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "jax.json").read_text())


def test_each_engine_family_trains_on_jax_in_two_worker_processes(jax_smoke):
    """Averaging, the parameter server and the ring allreduce on Keras' JAX backend, in the default suite: the
    executors' Python workers run JAX because the fit gives its stages KERAS_BACKEND; each case learns, on
    two workers, with its steps compiled ahead by the prepare job. The full matrix is jax_run's (slow)."""
    assert jax_smoke["backend"] == "jax" and jax_smoke["executor_env"].get("KERAS_BACKEND") == "jax"
    assert set(jax_smoke["cases"]) == set(SMOKE)
    for name, case in jax_smoke["cases"].items():
        assert len(case["pids"]) == 2 and case["evaluate"]["accuracy"] >= 0.85, (name, case["evaluate"])
        assert len(case["history"]["loss"]) == jax_check.EPOCHS and case["history"]["loss"][-1] < case["history"]["loss"][0]
        assert case["prepare"]["finished"] and case["prepare"]["traced"] >= 1, (name, case["prepare"])


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_every_engine_trains_on_jax_in_two_worker_processes(jax_run):
    assert jax_run["backend"] == "jax"
    assert jax_run["executor_env"].get("KERAS_BACKEND") == "jax"  # given by the fit: the JVM's environment lacks it
    for name, case in jax_run["cases"].items():
        assert len(case["pids"]) == 2, (name, case["pids"])
        assert case["evaluate"]["accuracy"] >= 0.85, (name, case["evaluate"])
        assert len(case["history"]["loss"]) == jax_check.EPOCHS
        # the prepare job rebuilt the model and compiled its steps for the batches' shapes: the first
        # epoch's tasks compiled nothing (XLA compiles per shape: a batch of no rows would not do)
        assert case["prepare"]["finished"] and case["prepare"]["traced"] >= 1, (name, case["prepare"])
        # a first-epoch task on a model the prepare job built compiles nothing; one that missed it says why
        assert all(not t["traced"] for t in case["first_epoch_detail"] if t["model_cached"]), (name, case["first_epoch_detail"])
        assert all(t.get("cache_miss") for t in case["first_epoch_detail"] if not t["model_cached"])
    first = jax_run["cases"]["averaging"]["first_epoch"]
    assert first == [{"model_cached": True, "traced": False}] * 2, jax_run["cases"]["averaging"]["first_epoch_detail"]


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_grouped_steps_compiled_ahead_leave_only_a_short_batch_to_compile(jax_run):
    tail = jax_run["tail"]
    assert tail["compiled_ahead"] == 3  # groups of 1, 15 and 16 full batches
    assert tail["compiled_after"] == 4  # + the short last batch; the last 7 full batches ran one by one
    assert tail["steps"] == 24 and tail["samples"] == 23 * jax_check.BATCH + 10
    assert tail["max_diff_from_single_steps"] <= 1e-6


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_the_spark_ml_estimator_and_the_elephas_layer_train_on_jax(jax_run):
    ml = jax_run["ml"]
    assert ml["mode"] == "synchronous" and ml["epochs"] == jax_check.EPOCHS and ml["accuracy"] >= 0.85, ml
    assert ml["transform_max_diff"] <= 1e-5, ml  # the saved and loaded KerasModel's column is the model's predict
    el = jax_run["elephas"]
    assert el["max_diff_from_averaging"] <= 1e-6, el  # Elephas' synchronous/epoch is the averaging engine
    assert el["predict_type"] == "list" and el["predict_rows"] == 8 and el["predict_max_diff"] <= 1e-5, el
    assert el["histories"] == jax_check.EPOCHS
    assert el["evaluate"][1] >= 0.85, el["evaluate"]  # [loss, accuracy], as Elephas returns
    refused = jax_run["buckets_refused"]  # allreduce.bucketBytes is TensorFlow's: refused before a job
    assert refused is not None and "bucketBytes" in refused["message"] and "TensorFlow" in refused["message"], refused


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_integer_state_and_statistics_keep_their_roles_on_jax(jax_run):
    """An adapted Normalization's integer count never reaches the parameter server (it refuses integer arrays):
    every mode trains, the count and the adapted mean stay the driver's."""
    assert set(jax_run["roles"]) == {"asynchronous", "hogwild", "synchronous-4", "averaging"}
    for mode, r in jax_run["roles"].items():
        assert r["count_kept"] and np.dtype(r["count_dtype"]).kind == "i" and r["mean_kept"], (mode, r)  # int32 on JAX without x64
        assert r["accuracy"] >= 0.85, (mode, r)


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_one_jax_worker_without_shuffling_equals_keras_fit_on_jax(jax_run):
    assert jax_run["one_worker_vs_keras_fit"] <= 1e-5


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_jax_predict_evaluate_save_load_resume_and_sparse_rows(jax_run):
    ev = jax_run["evaluate"]
    assert ev["spark"][0] == pytest.approx(ev["keras"]["loss"], abs=1e-5)
    assert ev["spark"][1] == pytest.approx(ev["keras"]["accuracy"], abs=1e-6)
    assert jax_run["predict_max_diff"] <= 1e-5
    assert jax_run["load_max_diff"] == 0.0
    assert jax_run["resume"]["epochs_run"] == [1]  # the second epoch only, from the checkpoint
    assert jax_run["resume"]["max_diff"] <= 1e-5  # equal to two uninterrupted epochs
    assert jax_run["sparse"]["sparse_tables"] == ["table"] and jax_run["sparse"]["wire"] == "bf16"
    assert jax_run["sparse"]["evaluate"]["accuracy"] >= 0.85
    # a worker's pushes alone: the compiled path equals the eager one; six pushes of different row counts
    # compile one gather and one scatter (ids padded to a few sizes), not one per push
    pr = jax_run["push_rounds"]
    assert pr["max_diff"] <= 1e-6 and pr["reused"] == [6, 6] and len(set(pr["row_counts"])) > 3, pr
    assert pr["executables"] == [1, 1], pr
    # allreduce.sparseGradients on JAX: the step hands back the table's rows that have a gradient
    sa = jax_run["sparse_allreduce"]
    assert sa["tables"] == [[], ["table/embeddings"]], sa
    assert sa["max_diff"] == 0.0 and sa["digests"] == [1, 1], sa  # two ranks: the dense exchange's floats
    assert sa["bytes_sent"][1] < sa["bytes_sent"][0] and all(r > 0 for r in sa["rows_sent"]), sa
    assert sa["accuracy"] >= 0.8, sa


def _xla_close(name: str) -> float:
    """How close an XLA fit's weights and logs are to the ring's: "bf16" sums in bfloat16 (each step's
    gradient rounded to 8 bits) against the ring's float32 fit; the others are the same sums."""
    return 2e-2 if name == "bf16" else 1e-5


def _check_xla_ranks(xla: dict) -> None:
    """Each rank trained in a process of its own (not its Spark worker's), one JAX job of two; a rank
    that fails fails the fit naming its error (not retried: a data error), and the other rank's
    process, blocked in the sums, ends within seconds (the JAX job's heartbeat, 10 s)."""
    failure = xla["failure"]
    assert failure["raised"] == "WorkerError" and "DataError: non-finite value" in failure["message"], failure
    assert "partition 1" in failure["message"] and failure["retries"] == [], failure
    assert failure["left"] == [] and failure["left_after"] < 25, failure
    for name, fit in xla.items():
        if name == "failure":
            continue
        assert fit["collectives"] == "xla", (name, fit)
        ranks = fit["ranks"]
        assert {r["collectives"] for r in ranks} == {"xla"} and {r["xla_processes"] for r in ranks} == {2}, (name, ranks)
        for epoch in (ranks[:2], ranks[2:]):
            assert sorted(r["rank"] for r in epoch) == [0, 1], (name, ranks)
            assert len({r["pid"] for r in epoch}) == 2 and len({r["daemon_pid"] for r in epoch}) == 2, (name, ranks)
            assert not {r["pid"] for r in epoch} & {r["daemon_pid"] for r in epoch}, (name, ranks)
            assert len({r["global_steps"] for r in epoch}) == 1, (name, ranks)  # join semantics: the same steps
        # allreduce.epochsPerStage: one stage and one process per rank for that many epochs
        stages = jax_check.EPOCHS // fit["per_stage"]
        assert fit["stages"] == stages and len({r["pid"] for r in ranks}) == 2 * stages, (name, fit)
        if fit["per_stage"] > 1:
            assert sorted((r["stage_epochs"]["index"], r["rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_allreduce_through_xla_collectives_trains_the_rings_weights_with_uneven_and_empty_partitions(jax_run):
    """allreduce.collectives='xla' (jax.distributed, Gloo on this CPU): short last batches padded, a rank
    out of data or with none feeding zeros of weight 0; the ring's weights and logs, step for step."""
    xla = jax_run["xla"]
    _check_xla_ranks(xla)
    for name, fit in xla.items():
        if name == "failure":
            continue
        close = _xla_close(name)
        assert fit["max_diff"] <= close, (name, fit["max_diff"])
        for key in ("loss", "accuracy"):
            assert fit["history"][key] == pytest.approx(fit["ring_history"][key], abs=close), (name, fit)
        assert fit["accuracy"] >= 0.85, (name, fit)
    uneven = xla["uneven"]["ranks"]
    assert sorted(r["samples"] for r in uneven[:2]) == [250, 774]
    assert {r["global_steps"] for r in uneven} == {25}  # ceil(774 / 32): the longer partition's steps
    empty = xla["empty"]["ranks"]
    assert sorted(r["samples"] for r in empty[:2]) == [0, 1024] and {r["global_steps"] for r in empty} == {32}
    assert xla["bf16"]["compression"] == "bf16" and xla["bf16"]["max_diff"] > 0, xla["bf16"]  # rounded sums


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
def test_the_collective_step_alone_is_keras_train_step_with_short_batches_padded(jax_run):
    """One process, no jax.distributed: a full batch and a short one (26 rows padded to 32 with weight
    0) give train_on_batch's weights and metrics; zeros of weight 0 (out of data) move nothing."""
    c = jax_run["collective_step"]
    assert c["totals"] == [1.0, 26 / 32, 0.0], c
    assert c["max_diff"] <= 1e-6 and c["zeros_moved"] == 0.0, c
    for key, value in c["keras_metrics"].items():
        assert c["metrics"][key] == pytest.approx(value, abs=1e-6), c


def test_xla_collectives_are_refused_where_they_cannot_run(spark):
    """Before any job: the TensorFlow backend (the suite's), per-epoch averaging, the ring's own settings."""
    from sparkdl_train import SparkModel

    x, y = jax_check.data()
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), 2)
    with pytest.raises(ConfigError, match="KERAS_BACKEND=jax"):
        SparkModel(jax_check.make_model(), mode="allreduce", num_workers=2, collectives="xla").fit(rdd, epochs=1, verbose=0)
    with pytest.raises(ConfigError, match="frequency='batch'"):
        SparkModel(jax_check.make_model(), mode="allreduce", frequency="epoch", collectives="xla")
    for bad in ({"bucket_bytes": 1 << 20}, {"sparse_gradients": True}):
        with pytest.raises(ConfigError, match=f"{next(iter(bad))}=.*collectives='ring'"):
            SparkModel(jax_check.make_model(), mode="allreduce", collectives="xla", **bad)
    with pytest.raises(ConfigError, match="applies to mode='allreduce'"):
        SparkModel(jax_check.make_model(), mode="hogwild", collectives="xla")


# deterministic engines: the same steps in the same order on both backends (float32 arithmetic
# differs in the last bits, which Adam's normalization of near-zero gradients lets grow a little)
EQUAL = {"averaging": 2e-3, "sync-batch": 2e-3, "allreduce": 2e-3, "allreduce-fp16": 5e-3, "ring-averaging-stage": 2e-3}


@pytest.mark.slow  # the whole JAX matrix (jax_run: minutes of XLA compiles); jax_smoke runs in the default suite
@pytest.mark.parametrize("name", list(jax_check.CASES))
def test_jax_fit_equals_the_tensorflow_fit_from_the_same_weights(jax_run, spark, name):
    from sparkdl_train import SparkModel

    x, y = jax_check.data()
    w = jax_run["weights"]
    n = len([k for k in w if k.startswith("init_")])
    m = jax_check.make_model()
    m.set_weights([w[f"init_{i}"] for i in range(n)])
    kwargs, fit_kwargs = jax_check.CASES[name]
    SparkModel(m, num_workers=2, **kwargs).fit(spark.sparkContext.parallelize(list(zip(x, y)), 2), epochs=jax_check.EPOCHS,
                                               batch_size=jax_check.BATCH, shuffle=False, verbose=0, **fit_kwargs)
    diff = max(float(np.max(np.abs(a - w[f"{name}_{i}"]))) for i, a in enumerate(m.get_weights()))
    if name in EQUAL:
        assert diff <= EQUAL[name], (name, diff)
    else:  # asynchronous pushes interleave as the workers' timing falls: the same quality, not the same weights
        acc = m.evaluate(x, y, verbose=0, return_dict=True)["accuracy"]
        assert acc == pytest.approx(jax_run["cases"][name]["evaluate"]["accuracy"], abs=0.03), (name, diff)


@pytest.mark.slow  # a benchmark run small (about a minute of JAX compiles): the marker's "more than ~30 s"
def test_gpu_check_runs_the_executor_pass_on_the_cpu(tmp_path):
    """bench/gpu/check.py, small: without a GPU every variable is on the CPU and the 'GPU' pass is the CPU pass."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "-m", "bench.gpu.check", "--rows", "12000", "--vocab", "5000",
                           "--batch", "256", "--equality-steps", "5", "--chunk", "4096", "--output", str(out),
                           "--sections", "pass,cpu_equality,push,fused"],  # what this test asserts
                          capture_output=True, text=True, timeout=600, env=dict(_env(), KERAS_BACKEND="jax"), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    r = json.loads(out.read_text())
    assert r["backend"] == "jax" and r["device"].startswith("cpu")
    p = r["pass"]["256"]
    assert p["samples"] == 12000 and p["pass_samples_per_s"] > 0 and p["fit_samples_per_s"] > 0
    assert p["startup"]["model_cached"] is True and p["startup"]["traced"] is False
    assert set(r["placement"]) == {"cpu:0"}
    assert r["cpu_equality"]["max_abs_diff"] == 0.0  # the same device twice
    assert r["push"]["server_updates"] > 0 and r["push"]["tables"] == ["field_embedding", "linear_embedding"]
    assert r["push"]["reused"] == 4 and r["push"]["push_d2h_seconds"] > 0, r["push"]  # the window's pulled rows, pushed
    # the fused vector: every trainable weight plus the rank's weight
    assert r["fused"]["256"]["vector_bytes"] % 4 == 0 and r["fused"]["256"]["gradients_seconds"] > 0
    # with the tables' gradients as rows: both tables, at most a batch's 256 x 26 lookups each, far fewer bytes
    rows = r["fused"]["256"]["sparse_rows"]
    assert rows["tables"] == 2 and all(0 < k <= 256 * 26 for k in rows["rows_touched"]), rows
    assert rows["bytes_to_host"] < r["fused"]["256"]["vector_bytes"] / 2 and rows["apply_seconds"] > 0, rows
    # the step through XLA's collectives, one rank (measured against the plain step on a GPU)
    assert r["fused"]["256"]["collective_step_seconds"] > 0 and r["fused"]["256"]["collective_over_plain"] > 0, r["fused"]


def test_host_arrays_handed_to_a_jax_model_are_copied_never_aliased():
    """The cause of the allreduce's occasional NaN rank on JAX: on the CPU, JAX keeps a 64-byte-aligned
    numpy buffer as an array's storage (Keras' ``assign``, and ``device_put`` even with
    ``may_alias=False``), and the ring reused its summed vector while the update still read it.
    Every path that hands host arrays to the model, each buffer aligned and overwritten right after
    (the update not waited for), keeps the values it was given (tests/scripts/jax_aliasing.py)."""
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "jax_aliasing.py")], capture_output=True, text=True,
                          timeout=300, env=dict(_env(), KERAS_BACKEND="jax"), cwd=SCRIPTS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r.pop("keras_assign_aliased")  # the platform's behaviour (True with JAX 0.10's CPU build), not this project's
    assert r == {"set_weights": True, "set_state": True, "table_sync_receive_whole": True, "fused_apply": True,
                 "scatter_rows": True, "metric_state": True}, r


def test_a_backend_sparkdl_train_cannot_train_on_is_refused_naming_the_supported_ones():
    with pytest.raises(ConfigError, match="tensorflow and jax backends.*'torch'"):
        backend.check_supported("torch")
    assert backend.check_supported("jax") == "jax"


def test_executors_on_another_backend_fail_the_preflight_naming_both_and_the_fix():
    driver = {"sparkdl_train": "1", "keras": "3.15.1", "keras_backend": "jax"}
    report = {"modules": {"sparkdl_train": {"version": "1"}, "keras": {"version": "3.15.1"}, "jax": {"version": "0.10"}},
              "keras_backend": "tensorflow"}
    (msg,) = problems(driver, report)
    assert "'tensorflow' backend" in msg and "'jax'" in msg and "spark.executorEnv.KERAS_BACKEND=jax" in msg
    report["modules"].pop("jax")
    assert any("cannot import jax" in p for p in problems(driver, report))


def test_a_worker_running_another_backend_refuses_the_task():
    from sparkdl_train.worker import runtime

    with pytest.raises(ConfigError, match="'jax' backend.*'tensorflow'.*KERAS_BACKEND"):
        runtime.prepare_process(None, "jax")
    runtime.prepare_process(None, "tensorflow")  # this process's


@pytest.mark.slow
def test_jax_fits_on_local_cluster_executors_that_get_the_backend_from_the_fit(tmp_path):
    """local-cluster[2,1,2048]: executor JVMs launched without KERAS_BACKEND (the driver deleted it
    from its environment after importing Keras on JAX); their Python workers run JAX because the fit
    gives its stages KERAS_BACKEND=jax. Averaging, a parameter-server fit (its compiled pushes) and
    allreduce on the same workers, each on both executors (allreduce after the others once went NaN
    on one rank: backend/jax.py waits for each update now), each task placed on the GPU Spark gave it
    as a task resource (fake GPUs, as tests/spark/test_gpu.py's)."""
    cases = ["averaging", "sync-batch", "allreduce", "xla"]
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "jax_check.py"), str(tmp_path), "local-cluster[2,1,2048]",
                           ",".join(cases)], capture_output=True, text=True, timeout=900, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    r = json.loads((tmp_path / "jax.json").read_text())
    assert r["executor_env"].get("KERAS_BACKEND") == "jax"
    _check_xla_ranks(r["xla"])  # allreduce through XLA's collectives on the executors: the ring's weights
    for name, fit in r["xla"].items():
        if name == "failure":
            continue
        assert fit["max_diff"] <= _xla_close(name) and fit["accuracy"] >= 0.85, (name, fit)
        assert {str(i["executor_id"]) for i in fit["ranks"]} == {"0", "1"}, (name, fit["ranks"])
    for name in cases[:-1]:
        case = r["cases"][name]
        assert len(case["executor_ids"]) == 2 and "driver" not in case["executor_ids"], (name, case["executor_ids"])
        assert len(case["pids"]) == 2 and case["evaluate"]["accuracy"] >= 0.85, (name, case)
        # each task got its executor's GPU from Spark (re-mapped through CUDA_VISIBLE_DEVICES=3,5);
        # this machine's JAX has no GPU, so the tasks ran on JAX's CPU device
        assert case["placements"] == [[["3"], [0], "cpu:0"], [["5"], [1], "cpu:0"]], (name, case["placements"])
