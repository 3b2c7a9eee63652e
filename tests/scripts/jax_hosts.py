"""Submitted by tests/cluster/test_standalone.py to the standalone cluster whose Workers are hosts of their own
(minicluster/hosts.py), with the executors' environment from ``./run pack --backend jax`` (no TensorFlow in it)
and this driver on Keras' JAX backend: the ring allreduce and XLA's collectives (``jax.distributed``, Gloo
between the hosts' CPUs) from the same weights on the same partitions, one rank on each host
(tests/scripts/jax_check.py's :func:`xla_against_ring`: partitions of 250 and 774 rows, then a rank whose
data fails).

    spark-submit --archives sparkdl_env_jax.tar.gz#environment ... jax_hosts.py --hosts JSON --output DIR

Writes ``DIR/summary.json``: per case the XLA fit's weights against the ring's, each rank's executor and the
address its Gloo sockets listened on, where both fits ran (executor ids and hosts, the rendezvous' peers),
and what each host's link carried during the whole run.
"""

import os

os.environ["KERAS_BACKEND"] = "jax"  # before anything imports Keras; the executors get it from each fit

import argparse  # noqa: E402
import json  # noqa: E402

import keras  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output", required=True)
    p.add_argument("--hosts", required=True, help="the Workers' host network (minicluster.hosts.HostNetwork.describe()), as JSON")
    args = p.parse_args()
    from jax_check import make_model, xla_against_ring

    from minicluster.hosts import HostNetwork
    from sparkdl_train.driver.submit import start_job, where_it_ran

    spark, _, out_dir = start_job("sparkdl_train-jax-hosts", args.output)
    network = HostNetwork.attach(json.loads(args.hosts))
    before = network.counters()
    # uneven partitions and a failing rank (a rank without data, jax_check's "empty", is no different across hosts),
    # both epochs of an XLA fit in one stage (one rank process on each host)
    result = xla_against_ring(spark.sparkContext, make_model().get_weights(), 2, cases=("uneven",),
                              where=lambda stats: {**where_it_ran(spark, stats), "server": stats.server})
    after = network.counters()
    summary = {"backend": keras.backend.backend(), "addresses": network.addresses, "driver_address": network.driver_address,
               "executor_env": dict(spark.sparkContext.environment), "xla": result,
               "links": {a: {k: after[a][k] - before[a][k] for k in ("rx", "tx")} for a in after}}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    spark.stop()


if __name__ == "__main__":
    main()
