"""Elephas' ``elephas.mllib``: numpy <-> MLlib ``Vector`` / ``Matrix``."""

from .adapter import from_matrix, from_vector, to_matrix, to_vector

__all__ = ["from_matrix", "from_vector", "to_matrix", "to_vector"]
