"""Synthetic datasets with planted ground truth."""
