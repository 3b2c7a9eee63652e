"""Data adapters and column mapping."""

from .adapters import ArrayAdapter, DataAdapter, DataFrameAdapter, RDDAdapter
from .rdd import to_simple_rdd
from .spec import ColumnMapping, TensorSpec, resolve_columns

__all__ = [
    "ArrayAdapter",
    "ColumnMapping",
    "DataAdapter",
    "DataFrameAdapter",
    "RDDAdapter",
    "TensorSpec",
    "resolve_columns",
    "to_simple_rdd",
]
