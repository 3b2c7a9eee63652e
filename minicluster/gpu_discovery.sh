#!/bin/sh
# Spark's GPU discovery script (spark.executor.resource.gpu.discoveryScript) for the mini cluster's stand-in GPUs:
# each NodeManager offers --nm-gpus of YARN's resource type yarn.io/gpu (default 1) and has no GPU, so this
# reports device 0, what nvidia-smi would list in a container granted one GPU on a node with YARN's GPU plugin.
# On a real cluster use Spark's examples/src/main/scripts/getGpusResources.sh (nvidia-smi) instead.
echo '{"name": "gpu", "addresses": ["0"]}'
