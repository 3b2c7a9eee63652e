"""``elephas.enums.frequency.Frequency``: how often workers exchange weights."""

from enum import Enum


class Frequency(str, Enum):
    """Compares equal to its string, as Elephas' does: ``Frequency.BATCH == "batch"``."""

    EPOCH = "epoch"
    BATCH = "batch"

    def __str__(self) -> str:
        return self.value
