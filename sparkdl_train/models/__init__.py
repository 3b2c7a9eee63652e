"""Ready-made Keras 3 models."""

from .ctr import deepfm, wide_and_deep

__all__ = ["deepfm", "wide_and_deep"]
