"""The one seam between sparkdl_train and the framework Keras runs on.

Everything backend-specific on an executor sits behind the small interface below, one module
per backend: :mod:`.tensorflow` (the default) and :mod:`.jax`. No other module imports
``tensorflow`` or ``jax`` (``tests/unit/test_imports.py`` keeps it so). A fit trains on the backend
of the driver's model (``keras.backend.backend()``); the executors' Python workers are started
with ``KERAS_BACKEND`` set to it (:func:`sparkdl_train.driver.backend_env.executor_backend`), and
the preflight check fails a fit whose executors run another one.

A backend module provides:

``NAME``, ``CAPABILITIES``
    The backend's name and what it can do (:class:`Capabilities`, declared below for every backend
    so that the driver and the worker daemon read them without importing the framework).
``import_framework()``
    Import the framework; returns the seconds it took (0.0 when already imported).
``configure_threads(threads)``
    Size the framework's CPU thread pools before its first op (first call in a process wins).
``compiled_step(model, kind, batch, stats, grouped)``, ``traces(model, kind, grouped)``, ``instantiate(model, kind, batch, sizes)``
    The model's own ``train_step`` / ``test_step`` / ``predict_step`` compiled once per model,
    called statefully on numpy batches (``grouped``: on a stack of batches in one call, as
    Keras' ``steps_per_execution``); see :mod:`sparkdl_train.worker.steps`.
``check_test_step(model, batch)``
    One test step on the driver, its check of a data sample, leaving the model's ``test_function`` as it was
    (TensorFlow: eagerly, nothing traced; JAX: as one compiled program, whose ops one by one would each be an
    XLA compile of their own).
``FusedStep(model, batch_size, bucket_bytes=0, sparse=())``
    The train step split around the allreduce (:mod:`sparkdl_train.worker.fused_step`); buckets handed
    over during the backward pass where the backend can (TensorFlow; JAX refuses ``bucket_bytes``);
    ``sparse`` tables' gradients handed over as rows (both).
``variable_io(model, dense, tables)``
    Compiled read and assign of every dense weight (one flat vector) and some table rows, for
    parameter-server pushes (:mod:`sparkdl_train.worker.row_sync`): ``read(ids, scale)`` gives the rows
    less their delta bases (the rows as last pulled, kept beside the tables on their device),
    ``write(flat, ids, rows)`` sets rows of the tables and of their bases, ``rebase()`` makes the
    tables as they are the bases; ``None`` where the eager path serves.
``scatter_rows(variable, ids, rows)``
    ``variable[ids] = rows``.
``read_values(variables)``, ``assign_values(variables, arrays)``
    Many variables to the host and back (a model's state between tasks and the driver): JAX moves
    them in one batched transfer each way instead of one waited-for copy per variable, reading
    through pinned host memory on an accelerator. The arrays read are not written into.
``gpu_count()``, ``device_scope(device)``, ``device_name(ordinal)``, ``device_of(variable)``
    Placement on the task's GPU (:mod:`sparkdl_train.worker.gpu`).

The PyTorch and NumPy backends are refused at ``fit`` (:func:`check_supported`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator, Protocol

from ..errors import ConfigError

SUPPORTED = ("tensorflow", "jax")
DEFAULT = "tensorflow"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; callers ask these instead of testing framework names."""

    framework: str
    """The module a worker imports to run it (the executors' preflight checks it is there)."""
    compiles_per_shape: bool
    """Compiled steps are per input shape: a pass runs a short last group batch by batch instead of compiling its size."""
    gradient_buckets: bool
    """The fused step hands gradient buckets to the ring while the backward pass runs (``allreduce.bucketBytes``)."""
    xla_collectives: bool
    """Ranks can run as one multi-process XLA program (``allreduce.collectives='xla'``)."""
    buckets_refused: str = ""
    """Why ``gradient_buckets`` is False, for the error a fit raises before any job."""
    compilation_cache: bool = False
    """Compiled steps persist across processes in a folder (``jax.compilationCache``; the backend module's
    ``configure_cache`` and its ``CACHE_SETTING_ENV``/``CACHE_BYTES_ENV`` for the executors)."""
    speculative_imports: tuple[str, ...] = ()
    """Packages the framework and Keras on it import at their own import only in case a user calls on them
    (Keras' scikit-learn wrappers and image gallery plots, TensorFlow Lite's JAX converter), each in a ``try: import ... except
    ImportError``; executor code never does. Workers import the framework with them hidden
    (:func:`without_speculative_imports`): where they are installed, a second of every executor's start."""


CAPABILITIES = {
    "tensorflow": Capabilities(framework="tensorflow", compiles_per_shape=False, gradient_buckets=True, xla_collectives=False,
                               speculative_imports=("sklearn", "jax", "matplotlib")),
    "jax": Capabilities(
        framework="jax", compiles_per_shape=True, gradient_buckets=False, xla_collectives=True,
        compilation_cache=True, speculative_imports=("sklearn", "matplotlib"),
        buckets_refused=("allreduce.bucketBytes (gradient buckets reduced while the backward pass runs) needs a backend "
                         "whose step hands gradients over during the backward pass (TensorFlow): on JAX the jitted step is one "
                         "XLA program that hands nothing back before it ends. Leave bucketBytes at 0 on JAX (XLA's own "
                         "collectives, allreduce.collectives='xla', are the route there)")),
}


@contextlib.contextmanager
def without_speculative_imports(name: str | None = None) -> Iterator[list[str]]:
    """Within the block, importing one of backend ``name``'s :attr:`Capabilities.speculative_imports` not yet
    imported raises ImportError (``None`` in ``sys.modules``, Python's own way to block one); afterwards they
    import as usual. Yields the names it hid. For executors' Python workers only: a module that tried one
    in the block keeps its fallback (Keras' scikit-learn wrappers say scikit-learn is missing in that worker).
    A backend sparkdl_train does not train on hides nothing (the worker daemon must serve it; the task's own
    check names the problem)."""
    can = CAPABILITIES.get(name or os.environ.get("KERAS_BACKEND") or DEFAULT)
    hidden = [m for m in can.speculative_imports if m not in sys.modules and m != can.framework] if can is not None else []
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        yield hidden
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


def capabilities(name: str | None = None) -> Capabilities:
    """The declared capabilities of backend ``name`` (default: this process's Keras backend), without importing it."""
    return CAPABILITIES[check_supported(name if name is not None else keras_backend())]


class Backend(Protocol):
    """The interface every backend module provides (``tests/unit/test_backend_interface.py`` checks both)."""

    NAME: str
    CAPABILITIES: Capabilities
    FusedStep: type

    def import_framework(self) -> float: ...
    def configure_threads(self, threads: int) -> int: ...
    def compiled_step(self, model: Any, kind: str, batch: Any, stats: dict | None = None, grouped: bool = False) -> Any: ...
    def traces(self, model: Any, kind: str, grouped: bool = False) -> int: ...
    def instantiate(self, model: Any, kind: str, batch: Any, sizes: tuple[int, ...] = (1,)) -> bool: ...
    def check_test_step(self, model: Any, batch: Any) -> None: ...
    def variable_io(self, model: Any, dense: list[int], tables: list[int]) -> Any: ...
    def scatter_rows(self, variable: Any, ids: Any, rows: Any) -> None: ...
    def read_values(self, variables: list[Any]) -> list[Any]: ...
    def assign_values(self, variables: list[Any], arrays: list[Any]) -> None: ...
    def gpu_count(self) -> int: ...
    def device_name(self, ordinal: int | None) -> str: ...
    def device_scope(self, device: str) -> Iterator[None]: ...
    def device_of(self, variable: Any) -> str: ...


INTERFACE = tuple(n for n in Backend.__annotations__) + tuple(
    n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_"))


def check_supported(name: str) -> str:
    """``name`` if sparkdl_train trains on that Keras backend, else a ConfigError naming the supported ones."""
    if name not in SUPPORTED:
        raise ConfigError(
            f"sparkdl_train trains Keras models on the {' and '.join(SUPPORTED)} backends; this model's Keras runs on "
            f"{name!r}. Set KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax before importing keras."
        )
    return name


def keras_backend() -> str:
    """The backend Keras runs on in this process (importing Keras, on ``KERAS_BACKEND`` or TensorFlow if unset)."""
    os.environ.setdefault("KERAS_BACKEND", DEFAULT)
    import keras

    return keras.backend.backend()


def current() -> ModuleType:
    """The backend module for this process's Keras."""
    return module(check_supported(keras_backend()))


def module(name: str) -> ModuleType:
    return importlib.import_module(f".{check_supported(name)}", __name__)
