"""Projected efficiency of the engines with GPU step times (issue 37), from the scaling model's
constants as docs/scaling.md gives them: the H200 step times measured with Keras 3 on JAX
(docs/gpu), 25 Gb/s, this machine's Spark, server and ring constants. Pure arithmetic (no Spark):
prints one table per workload, the efficiency at 8, 64 and 256 workers and the bottleneck at 64.

    python -m bench.scaling.gpu_projection [--gbps 25] [--epochs-per-stage 8] [--plot docs/scaling_gpu.png]
"""

from __future__ import annotations

import argparse

from bench.scaling import model as sm

# docs/scaling.md's constants (bench/scaling/measure.py): the ring's hop as re-measured with a core per rank,
# a fit's stage outside its tasks, the driver's rendezvous server (nothing beyond a plain stage)
RING = sm.Ring(call_s=1e-6, hop_s=49e-6)
SPARK = sm.SparkCosts(stage_s=0.361, task_s=0.0023, rendezvous_s=0.0, merge_bytes_per_s=7.4e9, python_task_s=0.058)
SERVER = sm.Server(request_s=133e-6, serial_bytes_per_s=3.16e9, row_s=47e-9)
WORKERS = (8, 64, 256)
CURVE = (1, 2, 4, 8, 16, 32, 64, 128, 256)


# what the allreduce's fused step costs beyond a plain train step on the H200 (ResNet-50 mixed bf16,
# batch 256, JAX, gradients read through pinned host memory): 94.2 + 28.3 ms against 50.6 ms
# (bench/gpu/check.py, 2026-11-27, docs/performance.md): the float32 vector flattened, staged through
# host memory each way, split and applied. A collective reading device memory would not pay it.
RESNET_STAGING_S = 0.0942 + 0.0283 - 0.0506


def resnet(step_s: float, n: int, staging_s: float = 0.0) -> sm.Workload:
    """ResNet-50 (25.6M parameters), batch 256 per worker, an ImageNet epoch (1.28M images) split over n;
    ``staging_s``: the fused step's cost beyond a train step (host staging)."""
    return sm.Workload("ResNet-50", step_s, 256, dense_bytes=25.6e6 * 4, steps_per_epoch=max(1, int(1.28e6 / 256 / n)),
                       step_cv=0.05, fused_call_s=staging_s)


# the same for the DeepFM (batch 512, 1M-id tables): a fused step's gradients 9.6 ms and apply 9.0 ms
# against a 1.24 ms train step (bench/gpu/check.py, H200, 2026-11-27): the 36 MB of tables each way
DEEPFM_STAGING_S = 0.0096 + 0.0090 - 0.00124
# with the tables' gradients as rows: what is staged instead, one step's touched rows (13.2k of 1M,
# uniform draws) with their ids and the 65 KB of dense weights, against the whole vector
DEEPFM_ROWS_SHARE = (13.2e3 * (36 + 8) + 65e3) / (36e6 + 65e3)


# a worker's own cost per push byte with 1M-row tables, compiled end to end (the rows' bases beside the
# tables, the window's rows not found again) over what it was: bench/ps/push.py, TensorFlow, a push every
# 4 steps, 25.3 / 28.4 ms before and 15.5 / 14.7 ms after (2026-11-27, docs/scaling.md)
COMPILED_PUSH = 0.56


def deepfm(n: int, staging_s: float = 0.0, push_scale: float = 1.0) -> sm.Workload:
    """The flagship DeepFM at batch 512 (0.86 ms on the H200), 1M-id tables (36 MB), 45M-row epochs split over n;
    ``staging_s``: the fused step's cost beyond a train step (host staging); ``push_scale``: the worker's
    per-byte push cost against the constant measured before its push was compiled end to end."""
    return sm.Workload("DeepFM", 0.86e-3, 512, dense_bytes=65e3, table_bytes=36e6, rows_per_batch=512 * 26, row_bytes=36,
                       table_rows=1e6, steps_per_epoch=int(45e6 / 512 / n), step_cv=0.05, push_fixed_s=0.55e-3,
                       push_byte_s=9.5e-9 * push_scale, id_bytes=8.0, fused_call_s=staging_s)


def table(title: str, make, engines: list[sm.Engine], net: sm.Network) -> list[dict]:
    """Print the efficiency at WORKERS; return every engine's curve over CURVE."""
    print(f"\n{title}")
    print(f"  {'engine':<54}" + "".join(f"{'N=' + str(n):>8}" for n in WORKERS) + "   bottleneck at 64")
    rows = []
    for entry in engines:  # an Engine, or (Engine, its own workload maker, a label suffix)
        e, mk, suffix = entry if isinstance(entry, tuple) else (entry, make, "")
        label = e.label + suffix
        preds = [sm.predict(e, mk(n), n, net, SERVER, RING, SPARK) for n in WORKERS]
        print(f"  {label:<54}" + "".join(f"{p.efficiency:>8.3f}" for p in preds) + f"   {preds[1].bottleneck}")
        rows.append({"engine": label, **{str(n): sm.predict(e, mk(n), n, net, SERVER, RING, SPARK).efficiency for n in CURVE}})
    return rows


def plot(out: dict, path: str, gbps: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(out), figsize=(6 * len(out), 7.5), sharey=True)
    for ax, (title, rows) in zip(axes, out.items()):
        for i, row in enumerate(rows):
            style = "-" if "stage" in row["engine"] else "--"
            ax.plot(CURVE, [row[str(n)] for n in CURVE], style, marker=".", label=row["engine"], color=plt.cm.tab20(i % 20))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.axhline(0.85, color="grey", linewidth=0.5)
        ax.axhline(0.80, color="grey", linewidth=0.5, linestyle=":")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("workers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)  # below: no curve hidden
    axes[0].set_ylabel("projected scaling efficiency")
    fig.suptitle(f"sparkdl_train on GPUs: H200 step times, {gbps:g} Gb/s, this project's measured constants "
                 "(bench/scaling/gpu_projection.py)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


BUCKET = 4 << 20  # bench/allreduce/overlap.py's buckets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gbps", type=float, default=25.0)
    ap.add_argument("--epochs-per-stage", type=int, default=8)
    ap.add_argument("--plot", help="write the curves here (PNG)")
    args = ap.parse_args()
    net, k = sm.Network(args.gbps), args.epochs_per_stage
    print(f"bench/scaling/gpu_projection.py  {args.gbps:g} Gb/s, {k} epochs per stage where a stage runs several")
    out = {}
    for name, step, precision in (("ResNet-50 mixed bf16 (45.9 ms)", 45.9e-3, 2), ("ResNet-50 fp32 (73.2 ms)", 73.2e-3, 4)):
        out[name] = table(name, lambda n, s=step: resnet(s, n), [
            sm.Engine("allreduce", precision=precision),
            sm.Engine("allreduce", precision=precision, epochs_per_stage=k),
            # buckets of 4 MiB reduced during the backward pass (about 2/3 of a step; allreduce.bucketBytes,
            # TensorFlow), then a collective library's hops (NCCL-class, reading device memory), and 8 GPUs per
            # node reduced over NVLink: with the hops, what collectives='xla' gives if XLA overlaps its sums
            sm.Engine("allreduce", precision=precision, epochs_per_stage=k, overlap=2 / 3, bucket_bytes=BUCKET),
            sm.Engine("allreduce", precision=precision, epochs_per_stage=k, overlap=2 / 3, bucket_bytes=BUCKET, hop_s=5e-6),
            sm.Engine("allreduce", precision=precision, epochs_per_stage=k, overlap=2 / 3, bucket_bytes=BUCKET, hop_s=5e-6,
                      gpus_per_node=8),
            sm.Engine("averaging"),
            sm.Engine("allreduce", average="state", epochs_per_stage=k),
            # this project's ring as it runs on a GPU today: the fused step's host staging, measured
            (sm.Engine("allreduce", precision=precision, epochs_per_stage=k),
             lambda n, s=step: resnet(s, n, RESNET_STAGING_S), ", host staging as measured"),
            # allreduce.collectives='xla' (built; compression='bf16' in the bf16 workload: sums in bfloat16): NCCL
            # on device memory, no staging, its hops, no overlap. The rows above with hop 5 us are this engine
            # with the overlap XLA's GPU scheduler may give its per-variable sums (not measured: needs GPUs)
            (sm.Engine("allreduce", precision=precision, epochs_per_stage=k, hop_s=5e-6),
             lambda n, s=step: resnet(s, n), ", XLA collectives, no overlap"),
        ], net)
    out["DeepFM"] = table("DeepFM b512 (0.86 ms), 45M-row epochs", deepfm, [
        sm.Engine("averaging"),
        sm.Engine("ps", "hogwild", None),
        sm.Engine("ps", "asynchronous", 4),
        # deltas and replies as bfloat16 (ps.compression): the driver's NIC and the worker's bytes halved,
        # the server's float32 work not
        sm.Engine("ps", "hogwild", None, ps_wire="bf16"),
        sm.Engine("ps", "asynchronous", 4, ps_wire="bf16"),
        # the worker's push compiled end to end (its per-byte cost as measured, COMPILED_PUSH)
        (sm.Engine("ps", "hogwild", None, ps_wire="bf16"), lambda n: deepfm(n, push_scale=COMPILED_PUSH), ", push compiled"),
        (sm.Engine("ps", "asynchronous", 4, ps_wire="bf16"), lambda n: deepfm(n, push_scale=COMPILED_PUSH),
         ", push compiled"),
        sm.Engine("allreduce", precision=4),
        sm.Engine("allreduce", precision=4, epochs_per_stage=k),
        # the tables' gradients as the rows each step touched (allreduce.sparseGradients)
        sm.Engine("allreduce", precision=4, epochs_per_stage=k, sparse_rows=True),
        sm.Engine("allreduce", precision=2, epochs_per_stage=k, sparse_rows=True),
        # as each runs on a GPU today: the fused step's host staging, measured for whole tables; for rows,
        # scaled by the bytes staged (an estimate: no GPU run of it yet)
        (sm.Engine("allreduce", precision=4, epochs_per_stage=k), lambda n: deepfm(n, DEEPFM_STAGING_S),
         ", host staging as measured"),
        (sm.Engine("allreduce", precision=4, epochs_per_stage=k, sparse_rows=True),
         lambda n: deepfm(n, DEEPFM_STAGING_S * DEEPFM_ROWS_SHARE), ", host staging scaled by bytes"),
        sm.Engine("allreduce", average="state"),
        sm.Engine("allreduce", average="state", epochs_per_stage=k),
        sm.Engine("allreduce", average="state", epochs_per_stage=k, state_bytes=4),
        sm.Engine("allreduce", average="state", epochs_per_stage=k, touches=True),
    ], net)
    if args.plot:
        plot(out, args.plot, args.gbps)
    rounded = {t: [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows] for t, rows in out.items()}
    print("RESULT", rounded)
    from bench.harness import results

    print("wrote", results.write("gpu_projection", {"gbps": args.gbps, "epochs_per_stage": k, "workloads": rounded}))


if __name__ == "__main__":
    main()
