"""GPU placement on executors: a task trains on the GPUs Spark assigned to it.

Spark schedules GPUs as task resources (``spark.task.resource.gpu.amount``); a task reads
its addresses from ``TaskContext.resources()["gpu"]``. Those addresses are what the
executor's discovery script reported: usually physical CUDA device ids. When the resource
manager already narrowed the process's view (YARN, Kubernetes and Docker set
``CUDA_VISIBLE_DEVICES``, e.g. ``"2,3"``), CUDA numbers the visible devices 0..n-1, so
physical id ``3`` is CUDA ordinal ``1``: :func:`cuda_ordinals` does that re-mapping.

Python workers are reused across tasks and CUDA's visible set is fixed once TensorFlow
starts, so the environment is left as it is: every GPU the executor sees stays visible (with
memory growth on, so idle ones cost no memory), and each task runs under
``tf.device("/GPU:<ordinal>")``. The rebuilt model is cached per device.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Sequence

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
    import tensorflow as tf

    global _memory_growth_set
    gpus = tf.config.list_physical_devices("GPU")
    if not _memory_growth_set:
        for g in gpus:
            try:
                tf.config.experimental.set_memory_growth(g, True)
            except RuntimeError:  # already initialised: keep TF's setting
                pass
        _memory_growth_set = True
    return gpus


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
            log.warning("Spark assigned GPU(s) %s to this task, but TensorFlow sees no GPU (CPU-only build or "
                        "no driver): training on the CPU", addresses)
            _warned_no_gpu = True
        device = "/CPU:0"
    elif max(ordinals) >= visible:
        raise ConfigError(f"GPU address(es) {addresses} map to CUDA ordinal(s) {ordinals}, but TensorFlow sees {visible} GPU(s)")
    else:
        # one device per task: a task given several GPUs trains on the first (the others
        # stay reserved for it by Spark); data parallelism across GPUs is one task per GPU
        device = f"/GPU:{ordinals[0]}"
    return {"gpus": addresses, "cuda_ordinals": ordinals, "device": device}


@contextlib.contextmanager
def scope(device: str | None) -> Iterator[None]:
    """``tf.device(device)`` when a device is given, else nothing."""
    if not device:
        yield
        return
    import tensorflow as tf

    with tf.device(device):
        yield
