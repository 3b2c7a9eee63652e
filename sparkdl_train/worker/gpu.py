"""GPU placement on executors: a task trains on the GPUs Spark assigned to it.

Spark schedules GPUs as task resources (``spark.task.resource.gpu.amount``); a task reads
its addresses from ``TaskContext.resources()["gpu"]``. Those addresses are what the
executor's discovery script reported: usually physical CUDA device ids. When the resource
manager already narrowed the process's view (YARN, Kubernetes and Docker set
``CUDA_VISIBLE_DEVICES``, e.g. ``"2,3"``), CUDA numbers the visible devices 0..n-1, so
physical id ``3`` is CUDA ordinal ``1``: :func:`cuda_ordinals` does that re-mapping.

Python workers are reused across tasks and CUDA's visible set is fixed once TensorFlow
starts, so the environment is left as it is: every GPU the executor sees stays visible (with
TensorFlow's memory growth on, so idle ones cost no memory), and each task runs on its device
(``tf.device("/GPU:<ordinal>")``, JAX's ``jax.default_device``; :mod:`sparkdl_train.backend`).
The rebuilt model is cached per device.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Sequence

from .. import backend
from ..errors import ConfigError

log = logging.getLogger(__name__)

_memory_growth_set = False
_warned_no_gpu = False


def task_gpu_addresses() -> list[str]:
    """The GPU addresses Spark assigned to the running task ([] outside Spark or without GPUs)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover
        return []
    ctx = TaskContext.get()
    if ctx is None:
        return []
    res = ctx.resources().get("gpu")
    return [str(a) for a in res.addresses] if res is not None else []


def cuda_ordinals(addresses: Sequence[str], visible: str | None) -> list[int]:
    """CUDA ordinals (as this process numbers its devices) of the assigned GPU ``addresses``.

    ``visible`` is the process's ``CUDA_VISIBLE_DEVICES`` (``None``: unset, every device
    visible by its physical id). An address listed in it maps to its position there; with a
    narrowed view whose entries are not the addresses (e.g. UUIDs, or a discovery script
    that already reports 0..n-1), a numeric address below the view's size is taken as an
    ordinal.
    """
    addrs = [str(a).strip() for a in addresses]
    if visible is None or visible.strip() == "":
        view = None
    else:
        view = [v.strip() for v in visible.split(",") if v.strip()]
    out = []
    for a in addrs:
        if view is None:
            if not a.isdigit():
                raise ConfigError(f"GPU address {a!r} from Spark is not a CUDA device number and CUDA_VISIBLE_DEVICES is unset")
            out.append(int(a))
        elif a in view:
            out.append(view.index(a))
        elif a.isdigit() and int(a) < len(view):
            out.append(int(a))
        else:
            raise ConfigError(
                f"GPU address {a!r} assigned by Spark is not visible to this executor "
                f"(CUDA_VISIBLE_DEVICES={visible!r}); check the GPU discovery script"
            )
    if len(set(out)) != len(out):
        raise ConfigError(f"GPU addresses {addrs} map to repeated CUDA ordinals {out}")
    return out


def _physical_gpus() -> list[Any]:
    """GPUs the backend sees in this process."""
    return list(range(backend.current().gpu_count()))


def placement() -> dict[str, Any]:
    """Where this task runs: ``{"gpus": [...], "cuda_ordinals": [...], "device": "/GPU:k"}``,
    or ``{}`` when Spark assigned it no GPU."""
    global _warned_no_gpu
    addresses = task_gpu_addresses()
    if not addresses:
        return {}
    ordinals = cuda_ordinals(addresses, os.environ.get("CUDA_VISIBLE_DEVICES"))
    visible = len(_physical_gpus())
    if visible == 0:
        if not _warned_no_gpu:
            log.warning("Spark assigned GPU(s) %s to this task, but %s sees no GPU (CPU-only build or "
                        "no driver): training on the CPU", addresses, backend.keras_backend())
            _warned_no_gpu = True
        device = backend.current().device_name(None)
    elif max(ordinals) >= visible:
        raise ConfigError(f"GPU address(es) {addresses} map to CUDA ordinal(s) {ordinals}, but {backend.keras_backend()} "
                          f"sees {visible} GPU(s)")
    else:
        # one device per task: a task given several GPUs trains on the first (the others
        # stay reserved for it by Spark, and the driver warns: engines.base.idle_gpus); data
        # parallelism across GPUs is one task per GPU
        device = backend.current().device_name(ordinals[0])
    return {"gpus": addresses, "cuda_ordinals": ordinals, "device": device}


@contextlib.contextmanager
def scope(device: str | None) -> Iterator[None]:
    """Run on ``device`` (the backend's name for it, :func:`placement`'s) when one is given, else as is."""
    if not device:
        yield
        return
    with backend.current().device_scope(device):
        yield
