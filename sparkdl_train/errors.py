"""Exceptions raised by sparkdl_train. All of them pickle (they cross process boundaries)."""

from __future__ import annotations


class SparkDLError(Exception):
    """Base class of every error raised by sparkdl_train."""


class ConfigError(SparkDLError, ValueError):
    """An argument or configuration value is invalid (names the argument)."""


class ModelError(SparkDLError, ValueError):
    """The Keras model cannot be used as given (uncompiled, unserializable, ...)."""


class DataError(SparkDLError, ValueError):
    """The training data does not fit the model (column, dtype, shape, emptiness)."""


class RankError(SparkDLError):
    """Raised on a rank of an allreduce barrier stage; the message names the rank that failed first
    and carries its traceback."""


class FitCancelled(SparkDLError):
    """The Spark jobs of a fit/evaluate were cancelled (job group or tag cancelled,
    e.g. from the Spark UI, ``SparkModel.cancel()`` or ``sc.cancelJobGroup``)."""


class BatchTimeout(SparkDLError):
    """A stream's micro-batch ran longer than ``batch_timeout`` (a stalled executor or task): its jobs were
    cancelled; ``fit_stream`` trains it again from the last commit."""


class ServerStopped(SparkDLError):
    """The driver's parameter server shut down while a worker waited on it (the fit failed,
    was cancelled or stopped)."""


class ConsistencyError(SparkDLError):
    """Workers that must agree did not: allreduce ranks ended an epoch with different weights,
    or a rank reported no state."""


class WorkerError(SparkDLError):
    """One or more workers failed; carries the per-rank tracebacks.

    ``failures`` maps a rank / partition id to the formatted traceback text; ``cause`` is the
    typed cause (a :class:`sparkdl_train.failures.Cause` value such as ``"worker_lost"``, or
    ``None`` when unknown), which retry decisions use instead of the text.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None, cause: str | None = None):
        self.failures = dict(failures or {})
        self.cause = cause
        detail = "".join(f"\n--- worker {r} ---\n{tb.rstrip()}" for r, tb in sorted(self.failures.items()))
        super().__init__(message + detail)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.message, self.failures, self.cause))


class TransformError(DataError):
    """A user's batch transform failed or returned something the model cannot take; names the
    partition and the rows (the original exception is chained as ``__cause__``)."""
