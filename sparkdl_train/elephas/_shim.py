"""What the Elephas layer translates, in one place: Elephas-only arguments, Keras-2 habits, row layouts."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, DataError

log = logging.getLogger(__name__)


class ElephasCompatibilityWarning(UserWarning):
    """An Elephas argument or habit that sparkdl_train accepts but handles differently."""


_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Warn about ``key`` once per process (a notebook re-running a cell is not told again)."""
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, ElephasCompatibilityWarning, stacklevel=_caller_level())


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside sparkdl_train: the warning names the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        level, frame = level + 1, frame.f_back
    return level


# Elephas constructor arguments that mean nothing here, and what replaces them
IGNORED_ARGUMENTS = {
    "parameter_server_mode": "sparkdl_train has one parameter server: a binary protocol over TCP with a per-fit "
                             "secret (no HTTP or pickle); its transport is not chosen",
    "port": "the parameter server takes a free port per fit; to fix one (a firewall rule), pass ps_port=... or set "
            "spark.sparkdl_train.ps.port",
}


def drop_ignored(kwargs: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """``kwargs`` without the Elephas-only arguments (each warned about once unless ``quiet``)."""
    kept = dict(kwargs)
    for name, replacement in IGNORED_ARGUMENTS.items():
        if name in kept:
            kept.pop(name)
            if not quiet:
                warn_once(f"argument:{name}", f"Elephas' {name}= is accepted and ignored: {replacement}")
    return kept


def plain(value: Any) -> Any:
    """An Elephas ``Mode``/``Frequency`` member (or any str enum) as its string."""
    return value.value if hasattr(value, "value") and isinstance(value, str) else value


# Keras ``fit`` arguments that Elephas forwarded to the workers' ``model.fit``
FIT_ARGUMENTS = ("epochs", "batch_size", "verbose", "callbacks", "validation_split", "validation_data", "shuffle",
                 "initial_epoch")
_KERAS_FIT_UNSUPPORTED = {
    "class_weight": "weight rows instead: RDD elements (x, y, sample_weight), or sample_weight_col= on a DataFrame",
    "sample_weight": "weight rows instead: RDD elements (x, y, sample_weight), or sample_weight_col= on a DataFrame",
    "steps_per_epoch": "an epoch is one pass over the data; use fewer rows (rdd.sample) for shorter epochs",
    "validation_steps": "validation covers all of validation_data",
    "validation_batch_size": "validation uses the training batch size",
    "validation_freq": "validation runs after every epoch",
    "x": "pass the RDD as the first argument", "y": "labels are part of the RDD's (x, y) rows",
}


def fit_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Elephas' ``fit(rdd, **kwargs)`` keywords checked against what a distributed fit can honour."""
    for name in kwargs:
        if name in FIT_ARGUMENTS:
            continue
        if name in _KERAS_FIT_UNSUPPORTED:
            raise ConfigError(f"fit: Keras' {name}= is not supported in a distributed fit; {_KERAS_FIT_UNSUPPORTED[name]}")
        raise ConfigError(f"fit: unknown argument {name!r}; Elephas' fit forwards Keras fit arguments, of which "
                          f"these apply: {', '.join(FIT_ARGUMENTS)}")
    return dict(kwargs)


def keras2_compile(model: Any) -> None:
    """Keras 2 read ``compile(optimizer, loss, ['acc'])`` as metrics; Keras 3's third positional argument is
    ``loss_weights``. Elephas re-compiled the model (dropping them); here they become the metrics they meant."""
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    weights = (config or {}).get("loss_weights")
    if not isinstance(weights, (list, tuple)) or not any(isinstance(w, str) for w in weights):
        return
    warn_once("keras2-metrics", f"model.compile's loss_weights={list(weights)!r} are names: Keras 3's third positional "
                                "argument is loss_weights, not metrics (Keras 2). Re-compiling with them as metrics; "
                                "write compile(optimizer, loss, metrics=[...]) to silence this.")
    model.compile(optimizer=model.optimizer, loss=model.loss, metrics=list(weights))


def input_widths(model: Any) -> list[tuple[int, ...]] | None:
    """Per-input shapes (without the batch axis) of a multi-input model; None for one input."""
    if len(model.inputs) < 2:
        return None
    shapes = [tuple(int(d) for d in t.shape[1:]) if all(d is not None for d in t.shape[1:]) else None for t in model.inputs]
    if any(s is None for s in shapes):
        return None  # variable-length inputs cannot be cut from a flat row
    return shapes


def row_splitter(model: Any) -> Callable[[Any], Any] | None:
    """For a multi-input model, a function cutting Elephas' flat feature row (a list or array holding all
    inputs side by side, which Elephas ``np.hsplit``) into the tuple of per-input arrays sparkdl_train reads;
    rows already given as a tuple or dict pass through. None for single-input models."""
    shapes = input_widths(model)
    if shapes is None:
        return None
    sizes = [int(np.prod(s)) for s in shapes]
    total = sum(sizes)
    offsets = np.cumsum([0] + sizes)

    def split(x: Any) -> Any:
        if isinstance(x, (tuple, dict)):
            return x
        flat = np.asarray(x).reshape(-1)
        if flat.size != total:
            raise DataError(f"a feature row of {flat.size} values cannot feed a model whose {len(shapes)} inputs take "
                            f"{sizes} values ({total} together)")
        return tuple(flat[offsets[i]:offsets[i + 1]].reshape(shapes[i]) for i in range(len(shapes)))

    return split
