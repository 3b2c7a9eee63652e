"""Data and models that benchmarks and tests both run: the digits MLP, the gallery model corpus."""
