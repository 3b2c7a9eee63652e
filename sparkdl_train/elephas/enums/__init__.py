"""Elephas' ``elephas.enums``: :class:`Mode` and :class:`Frequency`."""

from .frequency import Frequency
from .modes import Mode

__all__ = ["Frequency", "Mode"]
