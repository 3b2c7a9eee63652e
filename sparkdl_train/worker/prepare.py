"""Prepare task: a fit's model rebuilt, and its step traced, on the executors' Python workers
before the fit's first epoch (the driver side is :mod:`sparkdl_train.driver.prepare`).

A fit's first epoch used to start with every task rebuilding the model from its archive and
tracing its step (1.5-2 s per worker on two contended cores). A prepare task does both while the
driver is still serializing, planning and sampling; Spark reuses Python workers, so the epoch's
tasks find the model in :mod:`.runtime`'s cache with its step traced. It also calls the traced
train and test steps on a group of no batches (:func:`.steps.instantiate`): TensorFlow builds a
function's graph at its first call (0.2 s of a CTR model's first step), and a loop of no steps
changes nothing.

The trace needs the batches' signature: the driver derives a batch of zero rows from the data's
column types (:meth:`~sparkdl_train.data.adapters.DataAdapter.empty_batch`) before any data is
read, or takes the rows off its sample of the data where column types tell nothing (an RDD).
Building the compiled metrics from it resolves names such as ``"accuracy"`` from label shapes the
data has not confirmed yet, so such a model is marked as built for a guess
(:func:`.runtime.mark_prepared`) and kept only by tasks whose settings carry the same labels'
signature, the one the driver then finds in its sample.
Without a signature (the sample failed) the task only rebuilds the model.

A prepare task never raises: Spark would end the Python worker it ran in, and a model that cannot
be rebuilt fails the epoch's own tasks with their traceback anyway. It reports what it did.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

from .. import _compat
from ..data.batching import Batch, row_signature
from . import runtime
from .tasks import Ref, StepSettings, placed, task_identity

log = logging.getLogger(__name__)

# the step a fit's workers run: Keras' own train/test steps (.steps) or the allreduce engine's
# fused gradient step (.fused_step)
KINDS = ("train", "test", "fused")


@dataclass(frozen=True)
class PrepareTask:
    """Rebuild the model of ``payload`` (and with ``batch``, a batch of zero rows with the data's
    signature, build its compiled metrics and trace ``kinds`` of step for it)."""

    payload: Ref
    settings: StepSettings
    batch: Batch | None = None
    kinds: tuple[str, ...] = ("train",)

    def __call__(self, index: int) -> dict[str, Any]:
        start = time.perf_counter()
        out: dict[str, Any] = {"index": index, "host": socket.gethostname(), "pid": os.getpid(), "started_at": round(time.time(), 3),
                               **task_identity()}
        try:
            with placed(self.settings) as place:
                out.update(self._prepare(place.get("device")))
        except Exception as exc:  # noqa: BLE001 - reported, never raised (see the module docstring)
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc(limit=8)
        out["seconds"] = round(time.perf_counter() - start, 4)
        return out

    def _prepare(self, device: str | None) -> dict[str, Any]:
        runtime.import_tensorflow()
        value = self.payload.value
        labels = row_signature(self.batch[1]) if self.batch is not None else None
        t0 = time.perf_counter()
        model = runtime.peek_model(value, device, labels)  # a model built for these labels, or for any
        cached = model is not None
        miss = None if cached else runtime.cache_miss(value, device, labels)
        if model is None:  # marked as built for a guess of the labels: kept only if the data confirms it
            model = runtime.get_model(value, device, labels, confirmed=False)
        out: dict[str, Any] = {"cached": cached, "rebuild": round(time.perf_counter() - t0, 4), "traced": []}
        if miss is not None:
            out["cache_miss"] = miss
        if self.batch is None:
            return out
        t1 = time.perf_counter()
        if not _compat.compiled_metrics_built(model):
            _compat.symbolic_build(model, self.batch)
            if not _compat.compiled_metrics_built(model):
                # its first step builds them, from the data's own labels
                out["trace_skipped"] = "the compiled metrics cannot be built symbolically"
                return out
            runtime.mark_prepared(model, labels)
        for kind in self.kinds:
            _trace(model, kind, self.batch, self.settings)
            out["traced"].append(kind)
        out["trace"] = round(time.perf_counter() - t1, 4)
        return out


def _trace(model: Any, kind: str, batch: Batch, settings: StepSettings) -> None:
    if kind == "fused":
        from .fused_step import cached_fused_step

        cached_fused_step(model, settings.batch_size, settings.bucket_bytes, settings.sparse_tables).trace(batch)
    elif kind in ("train", "test"):
        from .steps import instantiate

        instantiate(model, kind, batch, settings.batch_size, settings.group)  # traced, and instantiated (TF) or compiled (JAX)
    else:
        raise ValueError(f"step kind must be one of {KINDS}, got {kind!r}")
