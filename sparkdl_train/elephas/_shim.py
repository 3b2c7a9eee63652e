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
    "port": "the parameter server takes a free port per fit; for a firewall rule, set a range every server of a fit "
            "takes its port from (spark.sparkdl_train.network.ports=LOW-HIGH), or fix this one with ps_port=... or "
            "spark.sparkdl_train.ps.port",
}


_MODES = ("synchronous", "asynchronous", "hogwild")


def elephas_settings(kwargs: dict[str, Any], default_mode: str, unknown_mode: str, owner: str,
                     quiet: bool = False) -> tuple[dict[str, Any], str | None]:
    """Elephas' constructor keywords as sparkdl_train settings, accepting what Elephas accepts:

    * ``parameter_server_mode`` and ``port`` mean nothing here: warned about once, dropped;
    * a name that is no sparkdl_train setting (Elephas stores any keyword): warned about once, with a
      hint for a likely misspelling, and not used (the caller keeps it for ``get_config()``);
    * a mode Elephas' class does not know: it trains as that class does with it (``unknown_mode``), warned;
    * a frequency no engine knows: accepted now, and the fit fails naming it, as Elephas' workers do.

    Returns the settings and, for a bad frequency, the error its fit raises (None otherwise). ``quiet``
    (loading a saved model) warns about nothing."""
    import difflib

    from ..config import all_settings, check_setting

    known = {s.arg for s in all_settings()}
    settings: dict[str, Any] = {}
    unknown = []
    for name, value in kwargs.items():
        if name in IGNORED_ARGUMENTS:
            if not quiet:
                warn_once(f"argument:{name}", f"Elephas' {name}= is accepted and ignored: {IGNORED_ARGUMENTS[name]}")
        elif name in known:
            settings[name] = plain(value)
        else:
            unknown.append(name)
    if unknown and not quiet:
        hints = [f"{n!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(n, known, 1)) else repr(n) for n in sorted(unknown)]
        warn_once(f"unknown:{owner}:{sorted(unknown)}", f"{owner}: keyword argument(s) {', '.join(hints)} mean nothing to "
                  "sparkdl_train: kept in get_config() as Elephas keeps them, and not used")
    mode = settings.get("mode") or default_mode
    if mode not in _MODES:
        if not quiet:
            extra = " (sparkdl_train's allreduce engine is sparkdl_train.SparkModel(mode='allreduce'))" if mode == "allreduce" else ""
            warn_once(f"mode:{owner}:{mode}", f"{owner}(mode={mode!r}): not one of Elephas' modes {', '.join(_MODES)}; it trains "
                      f"{unknown_mode}, as Elephas' {owner} does with it{extra}")
        mode = unknown_mode
    settings["mode"] = mode
    bad = None
    frequency = settings.get("frequency")
    if frequency is None:
        settings["frequency"] = "epoch"
    else:
        try:
            check_setting("frequency", frequency)
        except ConfigError as exc:
            bad = f"{owner}(frequency={frequency!r}): {exc}"
            settings["frequency"] = "epoch"
    return settings, bad


def plain(value: Any) -> Any:
    """An Elephas ``Mode``/``Frequency`` member (or any str enum) as its string."""
    return value.value if hasattr(value, "value") and isinstance(value, str) else value


# Keras ``fit`` arguments that Elephas forwarded to the workers' ``model.fit``
FIT_ARGUMENTS = ("epochs", "batch_size", "verbose", "callbacks", "validation_split", "validation_data", "shuffle",
                 "initial_epoch", "validation_freq")
_KERAS_FIT_UNSUPPORTED = {
    "class_weight": "weight rows instead: RDD elements (x, y, sample_weight), or sample_weight_col= on a DataFrame",
    "sample_weight": "weight rows instead: RDD elements (x, y, sample_weight), or sample_weight_col= on a DataFrame",
    "steps_per_epoch": "an epoch is one pass over the data; use fewer rows (rdd.sample) for shorter epochs",
    "validation_steps": "validation covers all of validation_data",
    "validation_batch_size": "validation uses the training batch size",
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
    ``loss_weights``, and names there break training. Elephas re-compiles the model with its loss, optimizer
    and compiled metrics, so the names are dropped and ``evaluate`` gives the loss alone: the same here, said once."""
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    weights = (config or {}).get("loss_weights")
    if not isinstance(weights, (list, tuple)) or not any(isinstance(w, str) for w in weights):
        return
    warn_once("keras2-metrics", f"model.compile's loss_weights={list(weights)!r} are names: Keras 3's third positional "
                                "argument is loss_weights, not metrics (Keras 2). As Elephas does, the model is re-compiled "
                                "without them, so evaluate() returns the loss alone; for metrics, write "
                                "compile(optimizer, loss, metrics=[...]).")
    model.compile(optimizer=model.optimizer, loss=model.loss, metrics=config.get("metrics"),
                  weighted_metrics=config.get("weighted_metrics"))


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
