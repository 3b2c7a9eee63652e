"""``./run yarn up|down|status|fetch`` and the Hadoop clients against the cluster it started:
``./run yarn application -list``, ``./run hdfs dfs -ls /`` (minicluster/hadoop.py).

``up`` prints the shell lines that point spark-submit at the cluster (``eval "$(./run yarn up)"``);
everything else goes to stderr. The cluster lives under ``$SDT_YARN_DIR`` (default ``.yarn`` in the checkout).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from .hadoop import ROOT, MiniHadoop, artifacts
from .maven import MissingTool


def _dir() -> str:
    return os.path.abspath(os.environ.get("SDT_YARN_DIR") or os.path.join(ROOT, ".yarn"))


def _attached() -> MiniHadoop:
    where = _dir()
    if not os.path.exists(os.path.join(where, "state.json")):
        sys.exit(f"error: no YARN mini cluster under {where}: start one with ./run yarn up")
    cluster = MiniHadoop.attach(where)
    if not cluster.alive():
        sys.exit(f"error: the YARN mini cluster under {where} is not running (pid {cluster.pid}): ./run yarn up")
    return cluster


def main(argv: list[str]) -> int:
    if argv[:1] == ["hdfs"]:
        rest = argv[1:]
        if rest[:1] == ["dfs"]:
            rest = rest[1:]
        sys.stdout.write(_attached().hdfs(*rest))
        return 0
    argv = argv[1:] if argv[:1] == ["yarn"] else argv
    if argv[:1] and argv[0] not in ("up", "down", "status", "env", "fetch"):
        sys.stdout.write(_attached().yarn(*argv))
        return 0
    p = argparse.ArgumentParser(prog="./run yarn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["up", "down", "status", "env", "fetch"])
    p.add_argument("--nodemanagers", type=int, default=2)
    p.add_argument("--nm-memory-mb", type=int, default=4096, help="memory each NodeManager offers containers")
    p.add_argument("--nm-vcores", type=int, default=4)
    p.add_argument("--nm-gpus", type=int, default=1, help="yarn.io/gpu each NodeManager offers (a resource type "
                   "standing in for GPUs: Spark's spark.executor.resource.gpu.amount asks for it)")
    args = p.parse_args(argv)
    where = _dir()
    if args.action == "fetch":  # the jars and the compiled launcher, nothing started (CI, a machine about to go offline)
        try:
            jars, classes = artifacts()
        except MissingTool as exc:
            sys.exit(f"error: {exc}")
        print(f"YARN mini cluster: jars in {jars}, launcher in {classes}", file=sys.stderr)
        return 0
    if args.action == "up":
        if os.path.exists(os.path.join(where, "state.json")) and MiniHadoop.attach(where).alive():
            cluster = MiniHadoop.attach(where)
            print(f"a YARN mini cluster is running already under {where} (pid {cluster.pid})", file=sys.stderr)
        else:
            print(f"starting a YARN mini cluster under {where} (first use: Maven fetches its jars)...", file=sys.stderr)
            try:
                cluster = MiniHadoop(where, nodemanagers=args.nodemanagers, nm_memory_mb=args.nm_memory_mb,
                                     nm_vcores=args.nm_vcores, nm_gpus=args.nm_gpus).start()
            except MissingTool as exc:
                sys.exit(f"error: {exc}")
            print(f"HDFS {cluster.fs_uri}, ResourceManager {cluster.addresses['yarn.resourcemanager.address']} "
                  f"(web UI http://{cluster.addresses['yarn.resourcemanager.webapp.address']}), "
                  f"{args.nodemanagers} NodeManagers; pid {cluster.pid}; stop it with ./run yarn down", file=sys.stderr)
        args.action = "env"
    if args.action == "env":
        cluster = _attached()
        for key, value in cluster.env().items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.action == "status":
        cluster = _attached()
        print(f"pid {cluster.pid}  HDFS {cluster.fs_uri}  ResourceManager {cluster.addresses['yarn.resourcemanager.address']}")
        for n in cluster.nodes():
            print(f"NodeManager {n['index']} {n['node']} {n['state']} {n['used_mb']}/{n['total_mb']} MB {n['used_gpus']}/{n['gpus']} yarn.io/gpu")
        return 0
    # down
    if not os.path.exists(os.path.join(where, "state.json")):
        print(f"no YARN mini cluster under {where}", file=sys.stderr)
        return 0
    cluster = MiniHadoop.attach(where)
    cluster.stop()
    os.remove(os.path.join(where, "state.json"))
    print(f"stopped the YARN mini cluster under {where} (pid {cluster.pid})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
