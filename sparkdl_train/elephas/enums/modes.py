"""``elephas.enums.modes.Mode``: the training modes Elephas names (sparkdl_train also has ``allreduce``)."""

from enum import Enum


class Mode(str, Enum):
    """Compares equal to its string, as Elephas' does: ``Mode.ASYNCHRONOUS == "asynchronous"``."""

    SYNCHRONOUS = "synchronous"
    ASYNCHRONOUS = "asynchronous"
    HOGWILD = "hogwild"

    def __str__(self) -> str:
        return self.value
