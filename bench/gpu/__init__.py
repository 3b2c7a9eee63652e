"""The executor's pass on a GPU (run on the lent device machine) and a CPU-against-GPU smoke run."""
