"""The figures of the README and docs/, rendered from bench/results/*.json: one source for every figure.

A page holds each table between two markers::

    <!-- figures:e2e_ctr -->
    ... rendered here ...
    <!-- /figures:e2e_ctr -->

``python -m bench.harness.docs`` re-renders every marked table in README.md and docs/ from the result
files; ``--check`` only reports the pages that differ (tests/unit/test_docs_figures.py runs it). Prose
states no measured figure of its own: it points at these tables (the same test looks for strays).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Any, Callable

from . import results

MARK = re.compile(r"<!-- figures:(?P<name>[a-z0-9_]+) -->\n(?P<body>.*?)<!-- /figures:(?P=name) -->", re.S)
RENDERERS: dict[str, Callable[[], str]] = {}


def figure(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        RENDERERS[name] = fn
        return fn

    return register


def source(*names: str) -> str:
    """The line under a table that says where its figures come from."""
    parts = []
    for name in names:
        r = results.load(name)
        d = r.get("derived")
        parts.append(f"[{name}.json](../bench/results/{name}.json): `{r['command']}`, commit {r['commit']}, {r['date']}, "
                     f"{r['machine']}" + (f"; {r['note']}" if r.get("note") else "")
                     + (f"; predictions from those measurements by the model at commit {d['commit']}, {d['date']} (`{d['command']}`)"
                        if d else ""))
    return "Source: " + "; ".join(parts) + "."


def table(columns: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def block(caption: str, columns: list[str], rows: list[list[Any]], *names: str) -> str:
    """A caption, its table and the line naming the result files it came from."""
    return "\n".join([caption, "", table(columns, rows), "", source(*names)])


def x(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


# -- end to end ----------------------------------------------------------------------------------------


def _e2e_rows() -> tuple[dict, list[list[Any]]]:
    r = results.load("e2e_ctr")
    keras = r["runs"][0]
    best = max(keras["epoch_val_auc"])
    rows = []
    for run in r["runs"]:
        reached = max(run.get("epoch_val_auc") or [run["test_auc"]]) / best
        rows.append([run["name"].replace(" local", ""), run["workers"], f"{run['samples_per_second']:,.0f}",
                     x(run["samples_per_second"] / keras["samples_per_second"]), f"{run['test_auc']:.4f}", f"{reached:.1%}"])
    return r, rows


@figure("e2e_ctr")
def e2e_ctr() -> str:
    r, rows = _e2e_rows()
    caption = (f"DeepFM on {r['rows']:,} generated CTR rows (Bayes-optimal test AUC {r['bayes_auc']:.4f}), {r['epochs']} epochs, "
               f"batch {r['batch_size']}, `local[{r['cores']}]`; steady-state samples/s against single-process `model.fit` in the "
               "same run.")
    return block(caption, ["run", "workers", "samples/s", "vs Keras", "test AUC", "best held-out AUC vs Keras'"], rows, "e2e_ctr")


@figure("fixed_cost")
def fixed_cost() -> str:
    r = results.load("fixed_cost")
    rows = [[name, x(ratio), (f"{r['targets'][name]}x" if name in r.get("targets", {}) else "")] for name, ratio in r["ratios"].items()]
    caption = (f"A whole fit's wall time against Keras' first epoch ({r['keras_first_epoch_s']:.2f} s, {r['rows']:,} rows, batch "
               f"{r['batch_size']}), each configuration in a fresh session.")
    return block(caption, ["fit", "vs Keras' first epoch", "target"], rows, "fixed_cost")


@figure("time_to_target")
def time_to_target() -> str:
    r = results.load("time_to_target")
    rows = [[m["mode"], x(m["low"]), x(m["high"]), x(m.get("median"))] for m in r["modes"]]
    caption = f"Time to 99% of single-process Keras' best held-out AUC, Elephas {r['elephas']} over sparkdl_train, {r['runs']} runs."
    return block(caption, ["mode", "lowest", "highest", "median"], rows, "time_to_target")


@figure("cold_first_fit")
def cold_first_fit() -> str:
    r = results.load("cold_first_fit")
    secs = lambda v: "-" if v is None else f"{v:.1f} s"  # noqa: E731
    secs2 = lambda v: "-" if v is None else f"{v:.2f} s"  # noqa: E731
    rows = [[s["model"], s["mode"], f"{s['keras_s']:.1f} s", secs(s["elephas_s"]), secs(s["tensorflow_s"]), x(s["vs_elephas_tf"]),
             x(s.get("vs_elephas_tf_with_session")), secs(s.get("tensorflow_no_start_s")),
             secs(s["jax_s"]), x(s["vs_elephas_jax"]), x(s["jax_over_tf"]), secs(s.get("jax_empty_cache_s"))] for s in r["summary"]]
    caption = (f"The first fit of a fresh process (JVM, executors, imports cold): seconds from `SparkModel(...)` to 99% of "
               f"single-process Keras' best held-out metric, {r['workers']} workers on `local[2]`, batch {r['batch_size']}, "
               f"Elephas {r['elephas']} in its own venv; \"session + fit\" adds each process's session start (the executor "
               "plugin's imports overlap it); -: the target not reached in the epochs tried. "
               "Goals: " + "; ".join(f"{k} {v}" for k, v in r["goals"].items()) + ".")
    out = block(caption, ["model", "mode", "Keras", "Elephas", "sparkdl_train TF", "Elephas/TF", "Elephas/TF, session + fit",
                          "TF without the executor plugin", "sparkdl_train JAX", "Elephas/JAX", "JAX/TF", "JAX, empty cache (Keras' epochs)"],
                rows, "cold_first_fit")
    steady = [s for s in r["summary"] if s.get("elephas_steady_s")]
    if steady:  # per library and mode, a process's third fit less its second (bench.e2e.cold_first_fit.STEADY_FITS)
        rows = [[s["model"], s["mode"], secs2(s["elephas_steady_s"]), secs2(s.get("tensorflow_steady_s")), x(s.get("steady_vs_elephas_tf")),
                 secs2(s.get("jax_steady_s")), x(s.get("steady_vs_elephas_jax"))] for s in steady]
        out += "\n\n" + table(["a steady epoch (same run: a process's fit of 3 epochs less its fit of 1, halved, after a first fit)",
                                "mode", "Elephas", "sparkdl_train TF", "Elephas/TF", "sparkdl_train JAX", "Elephas/JAX"], rows)

    # where the time of DeepFM's cold fits went, on TensorFlow with and without the executor plugin and on JAX: each mode's last try
    def last(lib: str, backend: str = "tensorflow") -> dict:
        return {run["mode"]: {**run["tries"][-1]["fixed_costs"], "seconds": run["tries"][-1]["seconds"],
                              "session_s": run["tries"][-1].get("session_s", 0.0)}
                for run in r["runs"] if (run["model"], run["lib"], run["backend"]) == ("deepfm", lib, backend)
                and "fixed_costs" in run["tries"][-1]}

    now, before, jax = last("sparkdl_train"), last("sparkdl_train, no executor start"), last("sparkdl_train", "jax")
    if not now:
        return out

    def phases(b: dict) -> str:
        d = b["driver"]
        wait = d.get("preflight", 0.0) + d.get("sample", 0.0)  # the executors' import, behind whichever job met it first
        prepare, job, check = d.get("prepare", 0.0), b["first_epoch"].get("job", 0.0), d.get("sample_check", 0.0)
        return (f"{b['seconds']:.1f} s: import (preflight + sample) {wait:.1f}, the driver's sample check {check:.1f}, "
                f"prepare {prepare:.1f}, first epoch's job {job:.1f}, the rest {b['seconds'] - wait - check - prepare - job:.1f}; "
                f"session {b['session_s']:.1f}")

    rows = [[mode, phases(before[mode]) if mode in before else "-", phases(b), phases(jax[mode]) if mode in jax else "-"]
            for mode, b in now.items()]
    return out + "\n\n" + table(["DeepFM, a cold fit's seconds (same run)", "TensorFlow without the executor plugin",
                                  "TensorFlow with it (the documented set-up)", "JAX with it"], rows)


@figure("daemon_start")
def daemon_start() -> str:
    r = results.load("daemon_start")
    label = {"off": "store off (every daemon compiles pyspark.zip's modules)", "cold": "store empty (a host's first daemon)",
             "warm": "store filled (every later daemon)", "site-packages": "pyspark from site-packages (no zip: the floor)"}
    start = {row["setting"]: row for row in r["rows"] if row["what"] == "daemon start"}
    rows = [[label[k], f"{v['median_s']:.2f} s", x(start["off"]["median_s"] / v["median_s"])] for k, v in start.items()]
    caption = (f"The worker daemon's start (fresh interpreter, Spark's pyspark.zip and py4j's zip first on its path, as an "
               f"executor's: {r['modules']} modules from the archives), median of {r['rounds']} alternated rounds; off / setting.")
    out = block(caption, ["daemon start", "seconds", "off / this"], rows, "daemon_start")
    fits = {row["setting"]: row for row in r["rows"] if row["what"] == "cold fit"}
    if fits:
        rows = [[label[k], f"{v['median_s']:.2f} s", f"{v['executors_wait_s']:.2f} s", x(fits["off"]["median_s"] / v["median_s"])]
                for k, v in fits.items()]
        out += "\n\n" + table([f"a cold DeepFM fit (synchronous, 1 epoch, `local[2]`), median of {r['fits']}", "fit",
                                "waiting for the executors' start", "off / this"], rows)
    return out


@figure("flagship_job")
def flagship_job() -> str:
    r = results.load("flagship_job")
    rows = [[j["rows"], j["epochs"], j["engine"], f"{j['test_auc']:.4f}", f"{r['bayes_auc']:.4f}", f"{r['bayes_auc'] - j['test_auc']:.3f}"]
            for j in r["runs"]]
    return block("Test AUC of the planted-model data's held-out rows.", ["rows", "epochs", "engine", "test AUC", "Bayes-optimal AUC", "gap"],
                 rows, "flagship_job")


@figure("image_pipeline")
def image_pipeline() -> str:
    r = results.load("image_pipeline")
    names = {"arrays": "pre-decoded arrays", "png": "PNG bytes, decoded on the executors", "png-2t": "PNG bytes, 2 transform threads"}
    rows = [[names.get(k, k), f"{v['images_per_s']:,.0f}", x(v["ratio_to_arrays"])] for k, v in r["results"].items()]
    caption = (f"{r['images']:,} images, {r['workers']} workers, {r['mode']}, batch {r['batch_size']}, {r['epochs']} epochs, median "
               f"of {r['repeats']} interleaved rounds.")
    return block(caption, ["variant", "images/s", "vs pre-decoded"], rows, "image_pipeline")


@figure("elephas_side_by_side")
def elephas_side_by_side() -> str:
    r = results.load("elephas_side_by_side")
    rows = [[m["mode"], f"{m['elephas_s']:.1f} s", f"{m['sdt_s']:.1f} s", f"{m['elephas_accuracy']:.3f}", f"{m['sdt_accuracy']:.3f}"]
            for m in r["modes"]]
    caption = f"{r['rows']:,} rows, {r['epochs']} epochs, batch {r['batch_size']}, {r['workers']} workers; held-out accuracy."
    return block(caption, ["mode", "Elephas fit", "sparkdl_train.elephas fit", "Elephas accuracy", "sparkdl_train accuracy"], rows,
                 "elephas_side_by_side")


@figure("model_epochs")
def model_epochs() -> str:
    from bench.e2e.model_epochs import render_table

    return render_table(results.load("model_epochs")) + "\n\n" + source("model_epochs")


# -- parts ---------------------------------------------------------------------------------------------


@figure("stream")
def stream() -> str:
    r = results.load("stream")
    rest, a = r["batch"], r["arrival"]
    caption = (f"`fit_stream` on {r['master']} ({r['workers']} workers, {r['engine']['mode']} parameter server per batch, "
               f"batch {r['batch_size']}), the CTR job's DeepFM on planted-model events, {r['events_per_file']:,} a file. "
               f"The same {rest['samples']:,} rows at rest, a fit's second epoch: {rest['samples_per_second']:,.0f} samples/s.")
    rows = [[f"backlog, {b['events_per_micro_batch']:,} events a micro-batch", f"{b['events_per_second']:,.0f}", x(b["to_batch"]),
             f"{b['seconds_per_micro_batch']:.2f}", f"{b['first_seconds']:.1f}", "-", "-"] for b in r["backlog"]]
    rows.append([f"arrival, a file every {a['interval']:g} s, a version after each micro-batch", "-", "-",
                 f"{a['seconds_per_micro_batch']:.2f}", f"{a['first_version_seconds']:.1f}", f"{a['freshness_p50']:.1f}",
                 f"{a['freshness_p99']:.1f}"])
    return block(caption, ["run", "events/s (after the first micro-batch)", "against the batch fit", "s a micro-batch (median)",
                           "first micro-batch, s", "freshness p50, s", "freshness p99, s"], rows, "stream")


@figure("tls_cost")
def tls_cost() -> str:
    r = results.load("tls_cost")
    rows = [[t["transport"], f"{t['mb']:g}", f"{t['plain_s']:.4f}", f"{t['tls_s']:.4f}", x(t["tls_s"] / t["plain_s"]),
             f"{t['tls_mb_per_s']:,.0f}"] for t in r["rows"]]
    caption = f"Best of {r['rounds']} alternations of the median of {r['reps']} repetitions each."
    return block(caption, ["transport", "MB", "plaintext s", "TLS s", "TLS / plaintext", "TLS MB/s"], rows, "tls_cost")


@figure("ps_push")
def ps_push() -> str:
    r = results.load("ps_push")
    rows = []
    for row in r["rows"]:
        c, e = row["compiled"], row["eager"]
        rows.append([f"{row['vocab']:,}", row["window"], f"{c['total_ms']:.2f}", f"{e['total_ms']:.2f}" if e else "-",
                     x(e["total_ms"] / c["total_ms"]) if e else "-", f"{(c['push_bytes'] + c['reply_bytes']) / 1e6:.2f}"])
    caption = f"A worker's own work per push (DeepFM, Keras on {r['backend']}, no Spark, no server), median of {r['pushes']} pushes."
    return block(caption, ["table rows", "push every N steps", "compiled ms", "eager ms", "eager / compiled", "MB each way"], rows, "ps_push")


# -- scaling -------------------------------------------------------------------------------------------


@figure("scaling_validation")
def scaling_validation() -> str:
    r = results.load("scaling")
    within = [abs(v["ratio"] - 1) <= 0.2 for v in r["validation"]]
    rows = [[v["master"], v["engine"], v["workers"], f"{v['samples_per_s']:,.0f}", f"{v['predicted']:,.0f}", f"{v['ratio']:.2f}"]
            for v in r["validation"]]
    return block(f"Measured fits against the model's prediction: {sum(within)} of {len(within)} within 20%.",
                 ["master", "engine", "workers", "measured samples/s", "predicted", "measured / predicted"], rows, "scaling")


@figure("net_links")
def net_links() -> str:
    r = results.load("net_links")
    links = [[label, f"{v['gbps']:.3f} Gb/s", f"{v['host_to_host']['gbps']:.3f} Gb/s", f"{v['latency_s'] * 1e6:.0f} us",
              f"{sum(b['rx'] + b['tx'] for b in v['bytes'].values()) / 1e6:,.0f} MB"] for label, v in r["links"].items()]
    hosts = [v for v in r["validation"] if v["master"] in r["links"] or (v["engine"] in r["engines"] and v["workers"] == 2)]
    within = [abs(v["samples_per_s"] / v["predicted"] - 1) <= 0.2 for v in hosts if v["master"] in r["links"]]
    rows = [[v["master"], v["engine"], f"{v['samples_per_s']:,.0f}", f"{v['predicted']:,.0f}", f"{v['samples_per_s'] / v['predicted']:.2f}",
             v["bottleneck"]] for v in hosts]
    # two workers sharing the machine's cores: each engine's step with two workers over its step with one (local[2]),
    # beside the one factor the model applies to every two-worker fit (averaging's)
    local = {(v["engine"], v["workers"]): v for v in r["validation"] if v["master"] == "local[2]"}
    applied = next(v["host_share"] for v in r["validation"] if v["workers"] == 2 and v["engine"] == "averaging/epoch")
    shares = [[e, f"{local[(e, 2)]['step_s'] / local[(e, 1)]['step_s']:.2f}x", f"{applied:.2f}x"]
              for e in r["engines"] if (e, 1) in local and (e, 2) in local]
    return (table(["links", "measured to the driver", "host to host", "latency (one way)", "carried by the fits"], links) + "\n\n"
            + table(["engine", "a worker's step, two workers on the cores over one (local[2])", "what the model applies"], shares) + "\n\n"
            + block(f"Two workers on two hosts against the model's prediction for the measured links, with `local[2]`'s fits "
                    f"beside them: {sum(within)} of {len(within)} host rows within 20%.",
                    ["master", "engine", "measured samples/s", "predicted", "measured / predicted", "the model's bottleneck"],
                    rows, "net_links"))


@figure("scaling_projections")
def scaling_projections() -> str:
    r = results.load("scaling")
    proj = r["projections"]
    workloads = list(proj)
    rows = []
    for engine in proj[workloads[0]]:
        cells = []
        for w in workloads:
            at = {p["workers"]: p for p in proj[w].get(engine, [])}
            cells.append(f"{at[64]['efficiency']:.2f}" if 64 in at else "-")
        rows.append([engine, *cells])
    return block("Scaling efficiency at 64 workers (samples/s over 64 times one worker's), CPU step times as measured here.",
                 ["engine", *workloads], rows, "scaling")


@figure("scaling_constants")
def scaling_constants() -> str:
    r = results.load("scaling")
    s, ring, spark, ctr, dense = r["server"], r["ring"], r["spark"], r["ctr"], r["dense"]
    rows = [
        ["CTR step (DeepFM, batch 512)", f"{ctr['compute_s'] * 1e3:.2f} ms", f"step spread (cv) {ctr['step_cv']:.2f}"],
        ["dense 25M step (batch 64)", f"{dense['compute_s'] * 1e3:.1f} ms", f"step spread (cv) {dense['step_cv']:.2f}"],
        ["server: per request", f"{s['request_s'] * 1e3:.3f} ms", f"{s['driver_cores']} driver cores"],
        ["server: per table row", f"{s['row_s'] * 1e9:.0f} ns", f"serialisation {s['serial_bytes_per_s'] / 1e9:.2f} GB/s"],
        ["worker: per push", f"{ctr['push_fixed_s'] * 1e3:.2f} ms", f"plus {ctr['push_byte_s'] * 1e9:.2f} ns per byte"],
        ["ring: per hop", f"{ring['hop_s'] * 1e6:.0f} us", f"loopback {r['loopback_gbps']:.1f} Gb/s"],
        ["Spark: per stage", f"{spark['stage_s'] * 1e3:.0f} ms", f"per task {spark['task_s'] * 1e3:.1f} ms"],
        ["Spark: merge", f"{spark['merge_bytes_per_s'] / 1e9:.1f} GB/s", ""],
    ]
    return "\n".join([table(["constant", "value", "also"], rows), "", source("scaling")])


@figure("gpu_projection")
def gpu_projection() -> str:
    r = results.load("gpu_projection")
    out = []
    for workload, rows in r["workloads"].items():
        out.append(f"**{workload}**, {r['gbps']:g} Gb/s, {r['epochs_per_stage']} epochs per stage where a stage runs several:")
        out.append("")
        out.append(table(["engine", "8", "64", "256"], [[row["engine"], *(f"{row[str(n)]:.2f}" for n in (8, 64, 256))] for row in rows]))
        out.append("")
    out.append(source("gpu_projection"))
    return "\n".join(out)


# -- GPU -----------------------------------------------------------------------------------------------


@figure("gpu_check")
def gpu_check() -> str:
    r, rep = results.load("gpu_check"), results.load("gpu_check_repeats")
    batches = sorted(r["pass"], key=int)
    rows = [
        ["averaging task's pass, samples/s", *(f"{r['pass'][b]['pass_samples_per_s']:,.0f}" for b in batches)],
        ["`model.fit`, samples/s (same model, numpy data)", *(f"{r['pass'][b]['fit_samples_per_s']:,.0f}" for b in batches)],
        ["pass / fit, one run", *(x(r["pass"][b]["ratio"]) for b in batches)],
        [f"pass / fit, median of {len(rep['pass'][batches[0]]['repeated']['pass_seconds'])} alternating (earlier run)",
         *(x(rep["pass"][b]["repeated"]["median_ratio"]) for b in batches)],
        ["the task beyond its steps, median (earlier run)",
         *(f"{rep['pass'][b]['repeated']['median_beyond_steps_seconds'] * 1e3:.1f} ms" for b in batches)],
        ["fused allreduce step / plain train step", *(x(r["fused"][b]["fused_over_plain"], 1) for b in batches)],
        ["fused step with embedding rows / plain", *(x(r["fused"][b]["sparse_rows"]["fused_over_plain"], 1) for b in batches)],
        ["XLA collective step / plain", *(x(r["fused"][b]["collective_over_plain"]) for b in batches)],
    ]
    push = r["push"]
    st = r["state_transfer"]
    return "\n".join([
        f"{r['device']}, Keras {r['keras']} on JAX {r['jax']}, the flagship DeepFM ({r['vocab']:,}-id tables), {r['rows']:,} rows, "
        f"steps grouped by {r['group']}.", "",
        table(["measured", *(f"batch {b}" for b in batches)], rows), "",
        f"State of {st['bytes'] / 1e6:.0f} MB to the host: {st['read_pinned_host'] * 1e3:.1f} ms through pinned memory, "
        f"{st['read_device_get'] * 1e3:.1f} ms with `jax.device_get`, {st['read_per_variable'] * 1e3:.1f} ms one variable at a time. "
        f"Parameter-server task: {push['ps_samples_per_s']:,.0f} samples/s pushing every {push['every']} steps, "
        f"{push['reused']} pushes reusing their pulled rows. All {sum(r['placement'].values())} variables on the GPU.", "",
        source("gpu_check", "gpu_check_repeats")])


# -- the README's headline -----------------------------------------------------------------------------


@figure("headline")
def headline() -> str:
    _, rows = _e2e_rows()
    by = {row[0]: row for row in rows}
    loaded = {name: results.load(name) for name in ("e2e_ctr", "flagship_job", "cold_first_fit", "gpu_check_repeats", "scaling")}
    job, bayes = loaded["flagship_job"]["runs"][0], loaded["flagship_job"]["bayes_auc"]
    gpu = loaded["gpu_check_repeats"]
    proj = loaded["scaling"]["projections"]
    best64 = max((p["efficiency"], e) for e, ps in proj["CTR (DeepFM) @ 25 Gb/s"].items() for p in ps if p["workers"] == 64)
    lines = [
        ["the flagship job (`./run job`): test AUC against the Bayes-optimal",
         f"{job['test_auc']:.4f} / {bayes:.4f}", "flagship_job"],
        ["2 workers on 2 cores against single-process `model.fit` (samples/s)",
         ", ".join(f"{k} {by[k][3]}" for k in ("sync-avg", "async-ps", "hogwild-ps", "allreduce") if k in by), "e2e_ctr"],
        ["a fresh process's first fit against Elephas 7.3, time to 99% of Keras' best (3 models, "
         f"{len({c['mode'] for c in loaded['cold_first_fit']['summary']})} modes; -: a target not reached)",
         _span([c["vs_elephas_tf"] for c in loaded["cold_first_fit"]["summary"]]) + " on TensorFlow, "
         + _span([c["vs_elephas_jax"] for c in loaded["cold_first_fit"]["summary"]]) + " on JAX", "cold_first_fit"],
        ["the executor's pass against `model.fit` on one H200, batch 512 / 4096 (median of 5)",
         " / ".join(x(gpu["pass"][b]["repeated"]["median_ratio"]) for b in ("512", "4096")), "gpu_check_repeats"],
        ["projected efficiency at 64 workers, CTR model, 25 Gb/s, CPU steps (best engine)", f"{best64[0]:.2f} ({best64[1]})", "scaling"],
    ]
    return table(["measured", "figure", "result file"],
                 [[a, b, f"[{c}](bench/results/{c}.json), {loaded[c]['date']}"] for a, b, c in lines])


def _span(ratios: list) -> str:
    """The lowest and highest of ``ratios`` ("-" among them where one is None: a target not reached)."""
    got = [r for r in ratios if r is not None]
    if not got:
        return "-"
    return f"{x(min(got))}-{x(max(got))}" + (" (and -)" if len(got) < len(ratios) else "")


# -- pages ---------------------------------------------------------------------------------------------


def pages() -> list[str]:
    return [os.path.join(results.ROOT, "README.md"), *sorted(glob.glob(os.path.join(results.ROOT, "docs", "**", "*.md"), recursive=True))]


def render(text: str, page: str = "") -> str:
    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{page}: no renderer for figures:{name} (bench/harness/docs.py)")
        body = RENDERERS[name]()
        if os.path.basename(page) == "README.md":  # the README links from the checkout's root
            body = body.replace("](../bench/", "](bench/")
        return f"<!-- figures:{name} -->\n{body}\n<!-- /figures:{name} -->"

    return MARK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only list the pages whose tables differ from their result files")
    args = p.parse_args(argv)
    stale = []
    for page in pages():
        with open(page) as f:
            text = f.read()
        new = render(text, page)
        if new != text:
            stale.append(os.path.relpath(page, results.ROOT))
            if not args.check:
                with open(page, "w") as f:
                    f.write(new)
    for page in stale:
        print(("differs: " if args.check else "rendered: ") + page)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
