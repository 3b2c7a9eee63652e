"""The process of one allreduce rank with XLA's collectives: ``python -m sparkdl_train.worker.xla_rank FOLDER IN OUT``.

Started by :mod:`.xla_task` with the folder holding its spec (the task's plain settings and the
broadcast's values) and its partition. It joins the stage's JAX job (``jax.distributed``: rank 0's
process hosts the coordinator, bound to its executor's address), rebuilds the model with the
driver's state, trains the stage's epochs with :class:`~sparkdl_train.backend.jax_collectives.CollectiveStep`,
and writes the last one's partial (:meth:`Partial.to_bytes`) or its traceback; between two epochs
it writes the epoch's partial, says so on its pipe ``OUT`` and waits for the task's go or stop on
``IN``. It exits when its task's process does.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any

from .xla_task import ERROR, RESULT, SPEC


class _Value:
    def __init__(self, value: Any):
        self.value = value


def _follow_parent() -> None:
    """Exit when the task's process is gone (Spark killed the stage, the executor died)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="sparkdl-xla-parent", daemon=True).start()


def train(spec: dict[str, Any], folder: str, driver: Any = None) -> bytes:
    from . import runtime

    settings = spec["settings"]
    runtime.prepare_process(settings.threads, "jax")
    from ..backend import jax_collectives

    t0 = time.perf_counter()
    jax_collectives.join(spec["coordinator"], spec["size"], spec["rank"], spec["bind"], spec["gpu"], max(10, int(spec["timeout"])))
    blob = _epochs(spec, folder, time.perf_counter() - t0, driver)
    # every rank reaches this: the job's shutdown barrier. A failing rank does not (it would wait there
    # for ranks that wait on its sums): it exits at once, and Spark ends the stage's other tasks
    jax_collectives.leave()
    return blob


def _epochs(spec: dict[str, Any], folder: str, joined: float, driver: Any) -> bytes:
    """The stage's epochs; returns the last one's partial. Between two epochs the partial goes to the
    task (``driver``: a line-based pipe), which hands it to the driver and answers go or stop."""
    import dataclasses

    import numpy as np

    from .. import _compat
    from ..backend.jax_collectives import CollectiveStep
    from ..data.batching import num_rows, zero_rows
    from .allreduce_task import _rank_partial, _scale_lr, lr_factor
    from .replay import Replay
    from .tasks import PartitionPass
    from .xla_task import DATA, EPOCH_RESULT

    settings, rank, size, first = spec["settings"], spec["rank"], spec["size"], spec["epoch"]
    run = PartitionPass(_Value(spec["payload"]), _Value(spec["state"]), settings, spec["partition"],
                        device="gpu:0" if spec["gpu"] else None, epoch=first, report=spec["report"])
    run.startup.update(xla_join=joined, spill=spec["spilled_seconds"])
    model = run.model
    base_lr = _scale_lr(model, lr_factor(spec["lr_scaling"], size))  # in the program's state from here on; the partials carry the base rate
    template = spec["template"]
    t0 = time.perf_counter()
    _compat.symbolic_build(model, zero_rows(tuple(template), settings.batch_size))
    step = CollectiveStep(model, settings.batch_size, spec["compression"])
    step.load()
    replay = Replay.saved(os.path.join(folder, DATA), spec["chunks"], template)
    values = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    try:
        for k in range(spec["epochs"]):
            if k:
                report = spec["report"]
                run.next_epoch(first + k, dataclasses.replace(report, epoch=first + k) if report is not None else None)
                step.reset_metrics()
            batches = (b for b in run.batches(replay.again()) if num_rows(b))
            samples = local_steps = global_steps = 0
            waited = 0.0
            # the summed weight of a step is read after the next step is dispatched, so the device never
            # waits for the host between two steps; the steps after every rank ran out of data are no-ops
            pending = None
            while True:
                batch = next(batches, None)
                total = step(batch, template)
                if local_steps == 0 and batch is not None and k == 0:
                    run.startup["first_step"] = time.perf_counter() - t0  # compiling the program
                if pending is not None:
                    t1 = time.perf_counter()
                    done = float(np.asarray(pending.addressable_data(0))[0]) == 0.0  # every rank was out of data
                    waited += time.perf_counter() - t1
                    if done:
                        break
                    global_steps += 1
                pending = total
                if batch is not None:
                    local_steps += 1
                    samples += num_rows(batch)
                    if run.reporter.due():
                        step.store(metrics_only=True)
                        run.reporter(local_steps, samples, model)
            step.store()
            scaled = _scale_lr(model, 1.0, base_lr)
            run.finish(local_steps, samples)
            partial = _rank_partial(run, None, rank, size, samples, local_steps, global_steps, 0.0, (0, 0),
                                    collectives="xla", xla_processes=size, step_wait_seconds=round(waited, 4),
                                    # where this rank's Gloo sockets listened, and the JAX job's coordinator
                                    collectives_host=spec["bind"], coordinator=spec["coordinator"],
                                    gradient_values=values)
            info = partial.partitions[spec["partition"]]
            info.update(spec["identity"])  # the Spark task's, not this process's
            if spec["epochs"] > 1:
                info["stage_epochs"] = {"index": k, "of": spec["epochs"], "kept_bytes": os.path.getsize(os.path.join(folder, DATA))}
            blob = partial.to_bytes()
            if k == spec["epochs"] - 1:
                return blob
            if scaled is not None:
                _scale_lr(model, 1.0, scaled)  # the model's variable only; the program keeps its own state
            with open(os.path.join(folder, EPOCH_RESULT.format(k)), "wb") as f:
                f.write(blob)
            driver[1].write(f"epoch {k}\n")
            driver[1].flush()
            if driver[0].readline().strip() != "go":
                return blob
        raise AssertionError("unreachable")
    finally:
        replay.close()


def main(folder: str, answers: int, epochs: int) -> int:
    """``answers``, ``epochs``: this process's ends of the task's pipes (its go / stop, our epoch ends)."""
    _follow_parent()
    driver = (os.fdopen(answers, "r"), os.fdopen(epochs, "w"))
    try:
        with open(os.path.join(folder, SPEC), "rb") as f:
            spec = pickle.load(f)  # written by this process's parent, the Spark task, in its private folder
        blob = train(spec, folder, driver)
        with open(os.path.join(folder, RESULT), "wb") as f:
            f.write(blob)
        return 0
    except BaseException as exc:  # noqa: BLE001 - handed to the task as text
        with open(os.path.join(folder, ERROR), "w", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        sys.stderr.flush()
        os._exit(1)  # not through exit handlers: jax.distributed's would wait for the other ranks


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
