"""What TLS costs the transports, measured with and without it in one run.

* Parameter server: seconds per push + pull round trip of an M-byte model
  (``bench/ps/transport.py``'s measurement), plaintext and TLS.
* Ring allreduce: seconds per allreduce of M bytes over N local processes
  (``bench/allreduce/ring.py``'s measurement), plaintext and TLS.

Printed ratio: TLS time / plaintext time (1.0 = free). Runs alternate plaintext and TLS so that a
noisy machine affects both alike.

    python -m bench.net.tls_cost [--sizes-mb 10 100] [--reps 5] [--ranks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.allreduce.ring import run as ring_run
from bench.ps.transport import ps_seconds
from sparkdl_train.net import new_identity  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="plaintext/TLS alternations")
    args = p.parse_args()
    identity = new_identity()
    print(f"bench/net/tls_cost.py  cpus={os.cpu_count()}  reps={args.reps}  rounds={args.rounds}")
    print(f"{'transport':<22} {'MB':>6} {'plain s':>9} {'TLS s':>9} {'TLS/plain':>10} {'TLS MB/s':>9}")
    rows = []
    for mb in args.sizes_mb:
        nbytes = int(mb * 1_000_000)
        plain, secure = [], []
        for _ in range(args.rounds):
            plain.append(statistics.median(ps_seconds(nbytes, args.reps)))
            secure.append(statistics.median(ps_seconds(nbytes, args.reps, tls=identity)))
        tp, ts = min(plain), min(secure)
        print(f"{'parameter server':<22} {mb:>6g} {tp:>9.4f} {ts:>9.4f} {ts / tp:>10.2f} {2 * mb / ts:>9.0f}")
        rows.append({"transport": "parameter server push + pull", "mb": mb, "plain_s": tp, "tls_s": ts, "tls_mb_per_s": 2 * mb / ts})
    for mb in args.sizes_mb:
        plain, secure = [], []
        for _ in range(args.rounds):
            plain.append(ring_run(args.ranks, [mb], args.reps, False)[0]["allreduce_s"])
            secure.append(ring_run(args.ranks, [mb], args.reps, False, tls=identity)[0]["allreduce_s"])
        tp, ts = min(plain), min(secure)
        label = f"ring allreduce, N={args.ranks}"
        print(f"{label:<22} {mb:>6g} {tp:>9.4f} {ts:>9.4f} {ts / tp:>10.2f} {mb / ts:>9.0f}")
        rows.append({"transport": f"ring allreduce, {args.ranks} ranks", "mb": mb, "plain_s": tp, "tls_s": ts, "tls_mb_per_s": mb / ts})
    from bench.harness import results

    print("wrote", results.write("tls_cost", {"reps": args.reps, "rounds": args.rounds, "rows": rows}))


if __name__ == "__main__":
    main()
