"""``elephas.utils.serialization``: a Keras model as a dict of its JSON architecture and weights, and back."""

from __future__ import annotations

from typing import Any

__all__ = ["dict_to_model", "model_to_dict"]


def model_to_dict(model: Any) -> dict[str, Any]:
    """``{"model": model.to_json(), "weights": model.get_weights()}``."""
    return dict(model=model.to_json(), weights=model.get_weights())


def dict_to_model(_dict: dict[str, Any], custom_objects: dict[str, Any] | None = None) -> Any:
    """The model :func:`model_to_dict` described, with its weights."""
    import keras

    model = keras.models.model_from_json(_dict["model"], custom_objects=custom_objects)
    model.set_weights(_dict["weights"])
    return model
