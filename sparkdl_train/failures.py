"""Spark job failures as typed causes, and the retry policy over them.

A failed Spark action reaches Python as a ``Py4JJavaError`` / ``PythonException`` /
``SparkException`` whose only detail is text. This module is the one place that reads that
text (:func:`classify`); everything else decides on the :class:`Cause` it returns:
``sparkdl_train.data.adapters`` turns a failed job into :class:`~sparkdl_train.errors.FitCancelled`
or a :class:`~sparkdl_train.errors.WorkerError` carrying the cause, and the allreduce engine
re-runs an epoch only when :class:`FailurePolicy` says the cause is a lost rank. The
patterns are checked against error texts produced by this Spark version in
``tests/spark/test_failures.py`` (live jobs on ``local[2]``; the killed-worker texts in the
``local-cluster`` fault tests).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from .errors import WorkerError

# the classic session's, and a Spark Connect client's (pyspark.errors.exceptions.connect: an
# interrupted operation arrives as an UnknownException wrapping OPERATION_CANCELED)
SPARK_ERRORS = ("PythonException", "Py4JJavaError", "SparkException", "UnknownException", "SparkConnectGrpcException")


class Cause(str, enum.Enum):
    CANCELLED = "cancelled"  # the job (group or tag) was cancelled: Spark UI, cancel(), stop_training
    WORKER_LOST = "worker_lost"  # the task's Python worker died (killed, out of memory, crashed)
    CONTAINER_MEMORY = "container_memory"  # the cluster manager killed the executor's container for its memory
    EXECUTOR_LOST = "executor_lost"  # the executor (JVM, container, node) went away
    CONNECTION_LOST = "connection_lost"  # a peer's socket reset or broke (its process died)
    TIMEOUT = "timeout"  # a peer or a round never answered within its timeout
    USER_ERROR = "user_error"  # sparkdl_train refused the data, the model or the config on an executor
    TASK_ERROR = "task_error"  # any other exception raised by the task's code


# YARN's NodeManager (through Spark's YarnAllocator) and Kubernetes, killing a container for its memory
_MEMORY_RULE = re.compile(r"Container killed by YARN for exceeding \w+ memory limits|"
                          r"Container from a bad node: .* exceeding \w+ memory|OOMKilled")
# (cause, pattern): the first that matches wins, so the specific come first
_RULES: tuple[tuple[Cause, re.Pattern], ...] = (
    (Cause.CANCELLED, re.compile(r"Job \d+ cancelled|\[OPERATION_CANCELED\]")),
    (Cause.USER_ERROR, re.compile(r"sparkdl_train\.errors\.(?:DataError|TransformError|ModelError|ConfigError)")),
    (Cause.CONTAINER_MEMORY, _MEMORY_RULE),
    (Cause.WORKER_LOST, re.compile(r"Python worker exited unexpectedly")),
    (Cause.EXECUTOR_LOST, re.compile(r"ExecutorLostFailure|Executor lost|executor \S+ exited|Lost executor")),
    (Cause.TIMEOUT, re.compile(r"RingTimeout|RoundTimeout|not complete after [\d.]+ s|timed out")),
    (Cause.CONNECTION_LOST, re.compile(r"Connection reset by peer|Broken pipe|ConnectionResetError|BrokenPipeError")),
)
_TASK = re.compile(r"[Tt]ask (\d+)(?:\.\d+)? in stage|barrier task \w*Task\(\d+, (\d+)\)")
# the lost executor's id, and the line that says so ("ExecutorLostFailure (executor 10 exited ...) Reason: ...")
_EXECUTOR = re.compile(r"ExecutorLostFailure \(executor (\S+?)\b[^\n]*|Lost executor (\S+) on[^\n]*|executor (\S+) exited[^\n]*")
# the line that says so, in each form the rule above knows
_MEMORY_LINE = re.compile(r"Container (?:killed by YARN|from a bad node)[^\n]*?exceeding[^\n]*|[^\n]*OOMKilled[^\n]*")
# what to change, when the cluster manager's own line does not say it
MEMORY_ADVICE = ("TensorFlow's memory is native, outside the JVM heap, and counts against the container: raise "
                 "spark.executor.memoryOverhead (or spark.executor.memory)")
_CANCELLED_LINE = re.compile(r"Job \d+ cancelled[^\n]*|\[OPERATION_CANCELED\][^\n]*")
_CAUSE_LINES = ("sparkdl_train.", "ValueError", "TypeError", "RuntimeError", "KeyError", "MemoryError")


@dataclass(frozen=True)
class SparkFailure:
    """A failed Spark job, read once."""

    cause: Cause
    partition: int  # the failing task's partition (-1: unknown)
    summary: str  # the line that says what went wrong ("" when no line does)
    text: str = field(repr=False, default="")
    executor: str | None = None  # the lost executor's id (cause EXECUTOR_LOST, when Spark names it)


def is_spark_error(exc: BaseException) -> bool:
    return type(exc).__name__ in SPARK_ERRORS


def classify(exc: BaseException) -> SparkFailure | None:
    """The typed cause of a failed Spark action (``None`` when ``exc`` is not one)."""
    if not is_spark_error(exc):
        return None
    return classify_text(str(exc))


def classify_text(text: str) -> SparkFailure:
    cause = next((c for c, rule in _RULES if rule.search(text)), Cause.TASK_ERROR)
    m = _TASK.search(text)
    partition = int(m.group(1) or m.group(2)) if m else -1
    lost = _EXECUTOR.search(text) if cause in (Cause.CONTAINER_MEMORY, Cause.EXECUTOR_LOST) else None
    executor = next(g for g in lost.groups() if g) if lost else None
    if cause is Cause.CANCELLED:
        line = _CANCELLED_LINE.search(text)
        summary = line.group(0) if line else "cancelled"
    elif cause is Cause.CONTAINER_MEMORY:
        line = _MEMORY_LINE.search(text)
        summary = (f"executor {executor}'s " if executor else "an executor's ") + "container was killed for its memory: " + \
            (line.group(0).strip() if line else "over its limit")
        if "spark.executor.memoryOverhead" not in summary:
            summary += f" ({MEMORY_ADVICE})"
    elif lost is not None:  # EXECUTOR_LOST
        summary = f"executor {executor} was lost ({lost.group(0).strip()})"
    else:
        summary = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip().startswith(_CAUSE_LINES)), "")
    return SparkFailure(cause, partition, summary, text, executor)


def memory_kill(removed: dict[str, str]) -> SparkFailure | None:
    """The first of ``removed`` (``{executor id: Spark's removal reason}``, executors that went away during a
    fit) that its cluster manager killed for its memory, as a failure of cause ``CONTAINER_MEMORY``; ``None``
    when none was. A fit whose Spark job fails otherwise (a fetch failure for the lost executor's shuffle
    output, an aborted stage) reports this cause instead: the next container would be killed too."""
    for executor, reason in sorted(removed.items()):
        if _MEMORY_RULE.search(reason or ""):
            failure = classify_text(f"ExecutorLostFailure (executor {executor} exited) Reason: {reason}")
            return SparkFailure(Cause.CONTAINER_MEMORY, -1, failure.summary, reason, executor)
    return None


def memory_error(failure: SparkFailure, what: str) -> WorkerError:
    """The fit's error for ``failure`` (a :func:`memory_kill`): ``what`` failed on an executor."""
    return WorkerError(f"sparkdl_train fit: {what} failed on an executor: {failure.summary}",
                       {failure.partition: failure.text}, cause=failure.cause.value)


# A SparkContext that failed to start for a reason a second start does not share. Spark's YARN client
# mode: the ApplicationMaster's AddWebUIFilter message is handled on an RPC thread while SparkContext
# attaches the UI's handlers (SparkUI.attachAllHandlers, unsynchronized since SPARK-36237); when they
# interleave, Jetty finds a filter mapping without its filter and the start fails. Seen in this
# project's CI on a loaded machine, in two forms: the missing filter, and Jetty's filter list modified while it
# initialized a page (ConcurrentModificationException under attachAllHandlers). The next start does not race so.
_START_RACES = re.compile(r"[\w.]*Exception: No filter named org\.apache\.spark\.deploy\.yarn\.AmIpFilter|"
                          r"java\.util\.ConcurrentModificationException(?=[\s\S]*SparkUI\S*attachAllHandlers)")


def start_race(exc: BaseException) -> str | None:
    """The line that says a failed session start is one of Spark's known start-up races (:data:`_START_RACES`),
    worth one more start; ``None`` when it is not one."""
    m = _START_RACES.search(str(exc))
    return m.group(0) if m else None


@dataclass(frozen=True)
class FailurePolicy:
    """Decides by cause, never by message, whether a failed stage is worth running again.

    The default retries what a new stage can fix: a lost worker, executor or connection. A
    timeout (a stalled rank would stall again), a container killed for its memory (the next one
    would be too), a user error (bad data, model or config) and a task's own exception fail at
    once, as does a cancelled job.
    """

    max_retries: int = 2
    retry_on: frozenset = frozenset({Cause.WORKER_LOST, Cause.EXECUTOR_LOST, Cause.CONNECTION_LOST})

    def should_retry(self, cause: Cause | None, attempt: int) -> bool:
        """``attempt`` counts the retries already made."""
        return cause in self.retry_on and attempt < self.max_retries
