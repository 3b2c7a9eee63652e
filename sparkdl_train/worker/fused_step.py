"""A Keras train step split around the allreduce; each backend module has its ``FusedStep``.

``Model.train_step`` computes gradients and applies them in one compiled
function; data-parallel training needs the averaged gradient in between. Two
compiled functions replace it:

* :meth:`FusedStep.gradients` - forward pass, loss (Keras' own loss tracker and
  metrics are updated exactly as ``train_step`` does), backward pass, and
  *tensor fusion*: every gradient is flattened into one float32 vector, scaled
  by this rank's weight ``w = batch rows / batch_size``, with ``w`` appended as
  the last element.
* :meth:`FusedStep.apply` - takes the vector *summed over ranks*, divides by
  the summed weight and hands the pieces to ``optimizer.apply_gradients``.

Its interface: ``size`` (floats in the fused vector), ``trace(batch) -> bool`` (compile for the
batch's signature with any number of rows), ``gradients(batch, out, ready=None) -> rows``,
``apply(summed, tables=())``, ``bucket_bounds``, ``tables``, ``touched``, ``untouched()``.

*Sparse tables* (``allreduce.sparseGradients``): an embedding table read straight from an input is
left out of the vector; :meth:`FusedStep.gradients` leaves its gradient in ``touched`` as the ids
the batch looked up (each once; TensorFlow's gradient of a lookup is those rows, JAX's step keeps the
rows of its dense gradient that are not zero) and their weighted rows, which
:mod:`sparkdl_train.allreduce.row_gather` gathers from every rank, and :meth:`FusedStep.apply` adds every
rank's rows into the table's gradient in rank order: the dense exchange's gradient, for the bytes
of the rows touched.

*Overlap* (``allreduce.bucketBytes``, TensorFlow only): the vector is cut into buckets of whole
weights from the last layer backwards (:meth:`~sparkdl_train.backend.flat.FusedLayout.buckets`);
each leaves the compiled function through a host callback as soon as the backward pass has
produced it, calling ``ready(k)``, and :class:`sparkdl_train.allreduce.buckets.BucketRing`
reduces it while the earlier layers' gradients are still being computed.

The result is the gradient of the mean loss over the global batch, also when
ranks' batches differ in size (the last batch of a partition) or a rank has no
batch at all (it contributes zeros and weight 0).
"""

from __future__ import annotations

from typing import Any

from .. import backend


def cached_fused_step(model: Any, batch_size: int, bucket_bytes: int = 0, sparse: tuple[tuple[int, int], ...] = ()) -> Any:
    """One FusedStep per (model, batch size, buckets, sparse tables), kept on the cached model: traced once per worker."""
    cache = model.__dict__.setdefault("_sparkdl_fused_steps", {})
    key = (batch_size, bucket_bytes, tuple(sparse))
    step = cache.get(key)
    if step is None:
        step = cache[key] = backend.current().FusedStep(model, batch_size, bucket_bytes, tuple(sparse))
    return step
