"""Model helpers with Elephas' names (``elephas.utils.model_utils``)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any


class ModelType(Enum):
    CLASSIFICATION = 1
    REGRESSION = 2


_REGRESSION = ("mean_squared_error", "mean_absolute_error", "mse", "mae", "cosine_proximity", "cosine_similarity",
               "mean_absolute_percentage_error", "mean_squared_logarithmic_error", "logcosh", "log_cosh", "huber")
_CLASSIFICATION = ("binary_crossentropy", "categorical_crossentropy", "sparse_categorical_crossentropy",
                   "binary_focal_crossentropy", "categorical_focal_crossentropy", "hinge", "squared_hinge",
                   "categorical_hinge", "kl_divergence", "poisson")


class LossModelTypeMapper:
    """Loss name -> :class:`ModelType` (one shared mapping, as in Elephas; ``register_loss`` adds to it)."""

    _mapping: dict[str, ModelType] = {
        **{name: ModelType.REGRESSION for name in _REGRESSION},
        **{name: ModelType.CLASSIFICATION for name in _CLASSIFICATION},
    }

    def get_model_type(self, loss: Any) -> ModelType | None:
        return self._mapping.get(_loss_name(loss))

    def register_loss(self, loss: Any, model_type: ModelType) -> None:
        self._mapping[_loss_name(loss)] = model_type


def _loss_name(loss: Any) -> Any:
    if isinstance(loss, str) or loss is None:
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None)


class ModelTypeEncoder(json.JSONEncoder):
    """Writes a :class:`ModelType` as ``{"__enum__": "ModelType.NAME"}`` (Elephas' saved-transformer format)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, ModelType):
            return {"__enum__": str(o)}
        return super().default(o)


def as_enum(d: dict[str, Any]) -> Any:
    """``json.loads`` object hook reading what :class:`ModelTypeEncoder` wrote."""
    if "__enum__" in d:
        return ModelType[d["__enum__"].split(".", 1)[1]]
    return d


def is_multiple_input_model(model: Any) -> bool:
    return len(model.inputs) > 1


def is_multiple_output_model(model: Any) -> bool:
    return len(model.outputs) > 1
