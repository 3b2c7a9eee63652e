"""The scaling model's network terms measured on hosts of their own: a standalone Master and the driver
on a bridge, each Worker in a network namespace with its link shaped (``minicluster/hosts.py``), the
links' bandwidth and latency measured, then the validation fits of ``bench.scaling.measure`` (the CTR
bench model) on those hosts at each link rate, against the model's prediction for the measured links.

The baseline is measured in the same run: the same fits on ``local[2]`` calibrate the model's compute
and a worker's own push cost (``bench.scaling.measure.compare``); the server's, the ring's and Spark's
constants are those of ``bench/results/scaling.json`` (measured on this machine by
``bench.scaling.measure``). Each hosts row is a prediction from those constants and the links measured
here: every host's link at its measured rate and latency; the driver's side is the bridge and this
machine's own TCP stack, not a shaped link, so the model's driver NIC is the loopback's rate
(scaling.json's). Needs root (network namespaces); everything it creates is removed by name at the end.

    .venv/bin/python -m bench.net.links [--rows 100000] [--repeats 2] [--rates 1gbit 100mbit]
    .venv/bin/python -m bench.net.links --from-json bench/results/net_links.json   # the saved fits against the model as it is now
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

from bench.harness import results
from bench.net import probe
from bench.scaling import measure
from bench.scaling import model as sm
from minicluster import hosts
from minicluster.standalone import StandaloneCluster

# the engines whose exchange crosses the links (averaging's state once per epoch, the parameter server's
# pushes, the ring's gradients every step)
ENGINES = ["averaging/epoch", "synchronous PS/4", "asynchronous PS/batch", "allreduce fp32"]

def link(network: hosts.HostNetwork, src: int, dst: int | None, nbytes: int) -> dict:
    """From host ``src`` to the driver's address (``dst`` None) or to host ``dst``: the median round
    trip of a 1-byte message and the throughput of ``nbytes`` sent in 1 MiB writes (bench.net.probe:
    the sender in ``src``'s namespace, the server in ``dst``'s or in a thread of this process)."""
    python = getattr(sys, "_base_executable", sys.executable)  # the probe needs nothing the venv has
    module = [python, "-m", "bench.net.probe"]
    server: subprocess.Popen | threading.Thread
    if dst is None:
        srv = probe.listener(network.driver_address)
        port, target = srv.getsockname()[1], network.driver_address
        server = threading.Thread(target=probe.serve, args=(srv,), daemon=True)
        server.start()
    else:
        target = network.address(dst)
        server = subprocess.Popen([*network.exec_prefix(dst), *module, "serve", target], stdout=subprocess.PIPE, text=True,
                                  cwd=results.ROOT)
        port = int(server.stdout.readline())
    try:
        proc = subprocess.run([*network.exec_prefix(src), *module, "send", target, str(port), str(nbytes)],
                              capture_output=True, text=True, timeout=300, check=True, cwd=results.ROOT)
    finally:
        if isinstance(server, subprocess.Popen):
            try:
                server.wait(probe.TIMEOUT_S)
            finally:
                server.kill()
        else:
            server.join(probe.TIMEOUT_S)
    rtt, sent, seconds = (float(v) for v in proc.stdout.split())
    return {"rtt_s": rtt, "latency_s": rtt / 2.0, "gbps": sent * 8 / seconds / 1e9, "bytes": sent}


def link_constants(network: hosts.HostNetwork, rate_gbps: float) -> dict:
    nbytes = int(rate_gbps * 1e9 / 8 * 2.0)  # about 2 s at the nominal rate
    up = [link(network, i, None, nbytes) for i in range(network.hosts)]
    across = link(network, 0, 1, nbytes)
    return {"to_driver": up, "host_to_host": across,
            "gbps": statistics.median(u["gbps"] for u in up), "latency_s": statistics.median(u["latency_s"] for u in up)}


def compare(measured: list[dict], links: dict[str, dict], saved: dict) -> list[dict]:
    """The fits against the model's prediction: ``local[2]``'s on the loopback, each hosts row with its
    links as measured (the driver's side at the loopback's rate)."""
    networks = {label: sm.Network(v["gbps"], latency_s=v["latency_s"], driver_nic_gbps=saved["loopback_gbps"])
                for label, v in links.items()}
    return measure.compare(measured, sm.Server(**saved["server"]), sm.Ring(**saved["ring"]), sm.SparkCosts(**saved["spark"]),
                           saved["loopback_gbps"], networks)


def report(checks: list[dict]) -> None:
    print(f"  {'master':<26} {'engine':<24} {'workers':>7} {'measured':>10} {'predicted':>10} {'meas/pred':>9}  bottleneck")
    for c in checks:
        print(f"  {c['master']:<26} {c['engine']:<24} {c['workers']:>7} {c['samples_per_s']:>10,.0f} "
              f"{c['predicted']:>10,.0f} {c['samples_per_s'] / c['predicted']:>9.2f}  {c['bottleneck']}")
    on_hosts = [c for c in checks if c["master"] != "local[2]"]
    within = sum(abs(c["samples_per_s"] / c["predicted"] - 1.0) <= 0.2 for c in on_hosts)
    print(f"  on the hosts: {within} of {len(on_hosts)} within 20% of the prediction", flush=True)


def gbps(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale / 1e9
    raise SystemExit(f"a rate in tc's units (1gbit, 100mbit), got {rate!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rows of the validation fits' CTR data")
    p.add_argument("--repeats", type=int, default=2, help="rounds of every fit (each row: the median round's)")
    p.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], help="each host's link rate, in tc's units")
    p.add_argument("--constants", default=os.path.join(results.RESULTS, "scaling.json"),
                   help="the server's, the ring's and Spark's constants (bench.scaling.measure's result)")
    p.add_argument("--from-json", help="compare a saved run's fits (its result file) with the model as it is now; prints only")
    p.add_argument("--write", action="store_true", help="with --from-json: store those predictions in bench/results/net_links.json "
                                                         "(the measurements and their provenance kept)")
    args = p.parse_args()
    with open(args.constants) as f:
        saved = json.load(f)
    if args.from_json:
        with open(args.from_json) as f:
            run = json.load(f)
        checks = compare(run["validation"], run["links"], saved)
        report(checks)
        if args.write:
            print("wrote", results.rederive("net_links", {"validation": checks}))
        return None
    why = hosts.unavailable()
    if why is not None:
        raise SystemExit(f"bench.net.links needs hosts of their own: {why}")
    print(f"bench/net/links.py  cpus={os.cpu_count()}  rows={args.rows}  repeats={args.repeats}  rates={args.rates}", flush=True)
    measured = measure.validation_fits({"rows": args.rows, "master": "local[2]", "repeats": args.repeats})
    network = hosts.HostNetwork(hosts=2).create()
    cluster = StandaloneCluster(tempfile.mkdtemp(prefix="sdt_links_"), network=network)
    links = {}
    try:
        cluster.start()
        conf = {"spark.driver.host": network.driver_address, "spark.driver.bindAddress": network.driver_address,
                "spark.pyspark.python": sys.executable, "spark.executor.cores": "1", "spark.cores.max": "2"}
        for rate in args.rates:
            for i in range(network.hosts):
                network.shape(i, hosts.Link(rate=rate, burst="256kb" if gbps(rate) >= 0.5 else "32kb"))
            label = f"2 hosts, {rate} links"
            links[label] = link_constants(network, gbps(rate))
            print(f"  {label}: {links[label]['gbps']:.3f} Gb/s to the driver, host to host "
                  f"{links[label]['host_to_host']['gbps']:.3f} Gb/s, latency {links[label]['latency_s'] * 1e6:.0f} us", flush=True)
            before = network.counters()
            measured += measure.validation_fits({"rows": args.rows, "master": cluster.url, "label": label, "conf": conf,
                                                 "repeats": args.repeats, "engines": ENGINES, "workers": [2]})
            after = network.counters()
            links[label]["bytes"] = {a: {k: after[a][k] - before[a][k] for k in ("rx", "tx")} for a in after}
    finally:
        cluster.stop()
        network.remove()
        left = network.leftovers()
    if left:
        raise SystemExit(f"left behind: {left}")
    checks = compare(measured, links, saved)
    report(checks)
    print("wrote", results.write("net_links", {"links": links, "validation": checks, "engines": ENGINES,
                                               "rows": args.rows, "repeats": args.repeats, "rates": args.rates,
                                               "constants": os.path.relpath(args.constants, results.ROOT)}))


if __name__ == "__main__":
    main()
