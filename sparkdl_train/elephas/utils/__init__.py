"""Elephas' ``elephas.utils``: RDD, model and weight-list helpers."""

from . import serialization
from .functional_utils import add_params, average_and_subtract, divide_by, get_neutral, subtract_params
from .model_utils import LossModelTypeMapper, ModelType, is_multiple_input_model, is_multiple_output_model
from .rdd_utils import encode_label, from_labeled_point, lp_to_simple_rdd, to_labeled_point, to_simple_rdd
from .serialization import dict_to_model, model_to_dict

__all__ = [
    "LossModelTypeMapper", "ModelType", "add_params", "average_and_subtract", "dict_to_model", "divide_by", "encode_label",
    "from_labeled_point", "get_neutral", "is_multiple_input_model", "is_multiple_output_model", "lp_to_simple_rdd",
    "model_to_dict", "serialization", "subtract_params", "to_labeled_point", "to_simple_rdd",
]
