"""Statistical efficiency on small data: when a fit's epochs carry fewer optimizer steps than
``model.fit``'s on the same data, and what to do about it (pure: no Spark, no Keras).

With ``K`` workers and batch size ``B``, an epoch of ``N`` rows runs ``N / (K B)`` steps on each
worker. Every engine then moves the model about as far per epoch as ``N / (K B)`` steps of
``model.fit`` would: averaging and the parameter server (deltas scaled by ``1/K``) average ``K``
models that each took those steps; allreduce takes those steps with ``K`` times the batch. On
large data that is the point (the same progress, ``K`` times sooner); on small data, where the
model is limited by the number of steps, the same epochs reach less than ``model.fit``. The fit
says so once, after its first epoch, with the fixes (docs/models.md measures the cost per engine).
"""

from __future__ import annotations

# below this many steps per worker per epoch, a model is usually still step-limited at Keras' epochs
FEW_STEPS = 100


def few_steps_advice(workers: int, steps_per_worker: float, batch_size: int, mode: str) -> str | None:
    """The warning to give (``None``: none) for a first epoch in which each of ``workers`` workers ran
    ``steps_per_worker`` steps of ``batch_size`` rows."""
    if workers < 2 or steps_per_worker <= 0 or steps_per_worker >= FEW_STEPS:
        return None
    keras_steps = steps_per_worker * workers
    smaller = max(1, batch_size // workers)
    fixes = [f"about {workers}x the epochs", f"batch_size={smaller} (as many steps per epoch as model.fit with batch_size={batch_size})"]
    if mode == "allreduce":
        fixes.append("lr_scaling='linear' (the learning rate times the workers, for the larger global batch)")
    else:
        fixes.append("mode='allreduce' (one model, gradients averaged every step)")
    return (f"each of the {workers} workers ran {steps_per_worker:.0f} optimizer steps in the first epoch, where model.fit would "
            f"run {keras_steps:.0f} on the same data with batch_size={batch_size}: on small data a fit reaches less than "
            f"model.fit in as many epochs. Use " + ", or ".join(fixes) + " (docs/models.md: the cost in epochs per engine)")
