"""Per-epoch checkpoints of a fit: ``SparkModel.fit(..., checkpoint_dir=...)``.

After every completed epoch the driver writes the model's full training state (weights and
optimizer variables: slots, iteration count, learning rate) as one wire-format file
(JSON header + raw buffers, no pickle) and then a small ``checkpoint.json`` pointing to
it. The pointer is written to a temporary name and renamed, so it always names a complete
state file; the previous ``keep - 1`` state files are kept, older ones deleted. Files go
through Spark's Hadoop FileSystem API (:mod:`sparkdl_train.fs`), so ``hdfs://``, ``s3a://``
and local paths all work.

A fit given a ``checkpoint_dir`` that already holds a checkpoint restores that state into
the driver's model and continues with the next epoch. Per-epoch shuffling is seeded by
``(seed, epoch, partition)``, so a resumed fit replays the same epochs an uninterrupted one
would.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..errors import ConfigError
from ..fs import FileSystem, join
from ..model_io import ensure_optimizer_built, get_state, set_state, state_variables

log = logging.getLogger(__name__)

FORMAT = "sparkdl_train.checkpoint"
FORMAT_VERSION = 1
POINTER = "checkpoint.json"


def state_file(epochs_done: int) -> str:
    return f"state-epoch-{epochs_done:05d}.bin"


@dataclass
class Restored:
    epochs_done: int  # completed epochs: the fit continues with this epoch index
    history: list[dict[str, float]] = field(default_factory=list)  # each completed epoch's logs
    path: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # what the saver passed as ``info`` (a stream's batch id)


class Checkpointer:
    """Saves and restores one fit's state under ``path``."""

    def __init__(self, path: str, keep: int = 2, sc: Any = None):
        if not isinstance(path, str) or not path:
            raise ConfigError(f"checkpoint_dir must be a non-empty path string, got {path!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"checkpoint keep must be a positive integer, got {keep!r}")
        self.path = path
        self.keep = keep
        self.fs = FileSystem(sc)
        self.history: list[dict[str, float]] = []

    def _read_pointer(self) -> dict[str, Any] | None:
        p = join(self.path, POINTER)
        raw = self.fs.read_replaced(p)
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.fs.qualified(p)} is not a valid checkpoint pointer: {exc}") from None
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ConfigError(f"{self.fs.qualified(p)} is not a sparkdl_train checkpoint (format {meta.get('format')!r})")
        return meta

    def epochs_done(self) -> int | None:
        """Completed epochs of the latest checkpoint under ``path``; ``None`` when it holds none."""
        meta = self._read_pointer()
        return None if meta is None else int(meta["epochs_done"])

    def restore(self, model: Any) -> Restored | None:
        """Load the latest checkpoint into ``model``; ``None`` when the directory holds none."""
        meta = self._read_pointer()
        if meta is None:
            return None
        ensure_optimizer_built(model)
        file = join(self.path, meta["file"])
        header, arrays = wire.decode(self.fs.read_bytes(file), copy=True)
        variables = state_variables(model)
        names = header.get("variables", [])
        if len(arrays) != len(variables):
            raise ConfigError(
                f"checkpoint {self.fs.qualified(file)} holds {len(arrays)} variables but model {model.name!r} has "
                f"{len(variables)}: it was written by a different model or optimizer"
            )
        for i, (v, a) in enumerate(zip(variables, arrays)):
            if tuple(v.shape) != tuple(a.shape):
                saved = names[i] if i < len(names) else f"#{i}"
                raise ConfigError(
                    f"checkpoint {self.fs.qualified(file)}: variable {saved!r} has shape {tuple(a.shape)}, but the "
                    f"model's {v.path!r} has shape {tuple(v.shape)}: it was written by a different model"
                )
        set_state(model, arrays)
        self.history = [dict(h) for h in meta.get("history", [])]
        log.info("resuming from %s: %d epochs done", self.fs.qualified(file), meta["epochs_done"])
        info = {k: v for k, v in meta.items() if k not in ("format", "format_version", "epochs_done", "file", "history")}
        return Restored(int(meta["epochs_done"]), list(self.history), self.fs.qualified(file), info)

    def save(self, model: Any, epochs_done: int, logs: dict[str, Any], info: dict[str, Any] | None = None) -> str:
        """Write the state after ``epochs_done`` completed epochs; returns the state file's path."""
        ensure_optimizer_built(model)
        name = state_file(epochs_done)
        variables = state_variables(model)
        blob = wire.encode({"epochs_done": epochs_done, "variables": [v.path for v in variables]}, get_state(model))
        self.fs.write_bytes(join(self.path, name), blob)
        self.history.append({k: float(v) for k, v in logs.items() if isinstance(v, (int, float))})
        pointer = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "epochs_done": epochs_done,
            "file": name,
            "saved_at": time.time(),
            "history": self.history,
            **(info or {}),
        }
        self.fs.replace_bytes(join(self.path, POINTER), json.dumps(pointer, indent=1, default=str).encode())
        old = epochs_done - self.keep
        if old >= 0 and self.fs.exists(join(self.path, state_file(old))):
            self.fs.delete(join(self.path, state_file(old)))
        return join(self.path, name)
