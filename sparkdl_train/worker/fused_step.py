"""A Keras train step split around the allreduce (TensorFlow backend).

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

The result is the gradient of the mean loss over the global batch, also when
ranks' batches differ in size (the last batch of a partition) or a rank has no
batch at all (it contributes zeros and weight 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _compat


def _first_input(x: Any) -> Any:
    import keras

    return next(i for i in keras.tree.flatten(x) if i is not None)


class FusedStep:
    def __init__(self, model: Any, batch_size: int):
        import tensorflow as tf

        self.model = model
        self.variables = list(model.trainable_variables)
        if not self.variables:
            raise ValueError(f"model {model.name!r} has no trainable weights")
        self.shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(self.sizes) + 1
        self.batch_size = float(batch_size)
        self._gradients = tf.function(self._gradients_impl, reduce_retracing=True)
        self._apply = tf.function(self._apply_impl)

    def _gradients_impl(self, x: Any, y: Any, sample_weight: Any) -> Any:
        import tensorflow as tf

        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if _compat.call_takes_training(model) else model(x)
            loss = _compat.compute_loss(model)(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            rows = tf.shape(_first_input(x))[0]
            tracker = _compat.loss_tracker(model)
            if tracker is not None:
                tracker.update_state(loss, sample_weight=rows)
            scaled = model.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, self.variables)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        flat = []
        for g, v, shape in zip(grads, self.variables, self.shapes):
            g = tf.zeros(shape, tf.float32) if g is None else tf.convert_to_tensor(g)
            flat.append(tf.reshape(tf.cast(g, tf.float32), [-1]))
        w = tf.cast(rows, tf.float32) / self.batch_size
        return tf.concat([tf.concat(flat, 0) * w, tf.reshape(w, [1])], 0)

    def _apply_impl(self, summed: Any) -> None:
        import tensorflow as tf

        mean = summed[:-1] / summed[-1]
        parts = tf.split(mean, self.sizes)
        grads = [tf.cast(tf.reshape(p, s), v.dtype) for p, s, v in zip(parts, self.shapes, self.variables)]
        self.model.optimizer.apply_gradients(zip(grads, self.variables))

    def trace(self, batch: tuple) -> bool:
        """Trace the gradient step for ``batch``'s signature with any number of rows, so that a
        short batch (a partition's last) reuses the trace instead of tracing again; returns
        whether it traced (``False``: that signature was traced before)."""
        from .steps import open_rows_spec

        before = self._gradients.experimental_get_tracing_count()
        self._gradients.get_concrete_function(*open_rows_spec(tuple(batch)))
        return self._gradients.experimental_get_tracing_count() > before

    def gradients(self, batch: tuple, out: np.ndarray) -> int:
        """Write this rank's weighted, fused gradient into ``out``; returns the batch's rows."""
        x, y, w = batch
        flat = self._gradients(x, y, w)
        np.copyto(out, flat.numpy())
        return int(_rows(x))

    def apply(self, summed: np.ndarray) -> None:
        self._apply(summed)


def _rows(x: Any) -> int:
    return int(np.shape(_first_input(x))[0])


def cached_fused_step(model: Any, batch_size: int) -> FusedStep:
    """One FusedStep per (model, batch size), kept on the cached model: traced once per worker."""
    cache = model.__dict__.setdefault("_sparkdl_fused_steps", {})
    step = cache.get(batch_size)
    if step is None:
        step = cache[batch_size] = FusedStep(model, batch_size)
    return step
