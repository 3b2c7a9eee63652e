"""The flagship job as shipped (``./run job``) and variants of it: test AUC against the Bayes-optimal AUC
of the planted model. Each variant runs ``./run job`` with its flags in a fresh output folder and its
``summary.json`` is recorded; the table in docs/ctr_job.md and the README's headline come from
bench/results/flagship_job.json.

    python -m bench.e2e.flagship_job                                  # the default, and the asynchronous PS every 4 steps
    python -m bench.e2e.flagship_job --variants "" "--epochs 1"      # flags per variant ("" is the default job)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile

from bench.harness import results


def run(flags: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="sdt-job-") as work:
        cmd = [os.path.join(results.ROOT, "run"), "job", *shlex.split(flags), "--output", os.path.join(work, "output")]
        subprocess.run(cmd, cwd=work, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
        with open(os.path.join(work, "output", "summary.json")) as f:
            s = json.load(f)
    rows = s["train_rows"] + s.get("test_rows", 0)
    return {"flags": flags, "rows": f"{rows / 1e6:.1f}M" if rows >= 1e6 else f"{rows:,}", "epochs": s["epochs"],
            "engine": f"{s['mode']}/{s['frequency']}" + (f" ({flags})" if flags else " (the default job)"),
            "test_auc": s["test_auc"], "bayes_auc": s["bayes_auc"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["", "--mode asynchronous --frequency 4"])
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args()
    runs = []
    for flags in args.variants:
        runs.append(run(flags, args.timeout))
        print(runs[-1], flush=True)
    print("wrote", results.write("flagship_job", {"bayes_auc": runs[0]["bayes_auc"], "runs": runs}))


if __name__ == "__main__":
    main()
