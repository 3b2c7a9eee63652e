"""Elephas' ``elephas.ml``: DataFrame adapters and Spark ML param mixins."""

from .adapter import df_to_simple_rdd, from_data_frame, to_data_frame
from .params import *  # noqa: F403
from .params import __all__ as _params

__all__ = ["df_to_simple_rdd", "from_data_frame", "to_data_frame", *_params]
