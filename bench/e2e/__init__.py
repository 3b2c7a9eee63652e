"""Whole fits against single-process Keras: throughput, fixed cost, time to a target, epochs to Keras' metric."""
