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
batch's signature with any number of rows), ``gradients(batch, out) -> rows``, ``apply(summed)``.

The result is the gradient of the mean loss over the global batch, also when
ranks' batches differ in size (the last batch of a partition) or a rank has no
batch at all (it contributes zeros and weight 0).
"""

from __future__ import annotations

from typing import Any

from .. import backend


def cached_fused_step(model: Any, batch_size: int) -> Any:
    """One FusedStep per (model, batch size), kept on the cached model: traced once per worker."""
    cache = model.__dict__.setdefault("_sparkdl_fused_steps", {})
    step = cache.get(batch_size)
    if step is None:
        step = cache[batch_size] = backend.current().FusedStep(model, batch_size)
    return step
