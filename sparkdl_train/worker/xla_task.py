"""A rank of the allreduce engine through XLA's collectives (``allreduce.collectives='xla'``).

The barrier task itself stays a Spark Python worker, which Spark reuses and in which
``jax.distributed`` can start only once; so each rank trains in a fresh process of its own
(:mod:`.xla_rank`), one JAX job across the stage's ranks. The task:

1. writes its partition to a local file as it streams in (:class:`~.replay.Replay`), counting its rows;
2. meets the other ranks (``allGather``, or the driver's rendezvous server): rank 0 names the
   coordinator's address (its executor's host, a free port), and every rank its batches' signature
   (a rank with an empty partition trains on zeros shaped like another rank's batches);
3. starts the rank process with plain data (the task's settings and the broadcast's values, in a
   private folder); a stage of several epochs (``allreduce.epochsPerStage``) hands the driver each
   epoch's partial the process wrote and passes its answer back; then it returns the partial the
   process wrote last (:meth:`Partial.to_bytes`, no
   pickle). A rank process that fails fails the task with its traceback; one whose task dies
   follows it (it watches its parent).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable

from ..data.batching import Batch
from ..errors import RankError
from ..merge import Partial
from ..net import ports as port_range
from .replay import Replay, local_dir
from .tasks import task_identity

SPEC, RESULT, ERROR, LOG, DATA = "spec.pkl", "partial.bin", "error.txt", "rank.log", "partition.npy"
EPOCH_RESULT = "epoch-{}.bin"  # a stage's epoch before its last (allreduce.epochsPerStage)


def encode_signature(struct: Any) -> Any:
    """A batch's structure and each leaf's row shape and dtype, as JSON."""
    if struct is None:
        return {"none": True}
    if isinstance(struct, dict):
        return {"dict": {k: encode_signature(v) for k, v in struct.items()}}
    if isinstance(struct, (list, tuple)):
        return {type(struct).__name__: [encode_signature(v) for v in struct]}
    import numpy as np

    a = np.asarray(struct)
    return {"shape": list(a.shape[1:]), "dtype": a.dtype.str}


def decode_signature(sig: Any) -> Any:
    """:func:`encode_signature`'s batch, with no rows."""
    import numpy as np

    if "none" in sig:
        return None
    if "dict" in sig:
        return {k: decode_signature(v) for k, v in sig["dict"].items()}
    if "tuple" in sig or "list" in sig:
        kind = tuple if "tuple" in sig else list
        return kind(decode_signature(v) for v in sig["tuple" if kind is tuple else "list"])
    return np.zeros((0, *sig["shape"]), np.dtype(sig["dtype"]))


def _free_port(host: str, ports: tuple[int, int] | None = None) -> int:
    """A port for the XLA coordinator (JAX binds it itself): free now, from ``network.ports`` when set."""
    with port_range.bound(host, ports, "XLA coordinator") as s:
        return s.getsockname()[1]


def _child_env(device: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["KERAS_BACKEND"] = "jax"
    # the worker's import path (Spark's own zips, --py-files, an archive's site-packages)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.exists(p))
    if device is None or device.startswith("cpu"):
        env["JAX_PLATFORMS"] = "cpu"
    else:  # the task's GPU only: the rank process sees it as its one device
        ordinal = int(device.partition(":")[2] or 0)
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[ordinal] if ordinal < len(visible) else str(ordinal)
        flags = env.get("XLA_FLAGS", "")
        if "latency_hiding_scheduler" not in flags:  # lets XLA move the sums to overlap the backward pass (NVIDIA's default)
            env["XLA_FLAGS"] = (flags + " --xla_gpu_enable_latency_hiding_scheduler=true").strip()
    return env


def run_rank(task: Any, partition: int, chunks: Iterable[Batch], barrier: Any, device: str | None) -> Partial:
    """One rank of ``task`` (an :class:`~.allreduce_task.AllreduceTrainTask`) in a process of its own."""
    group, host = task.group(barrier)
    rank, size = group.rank, group.size
    bind = task.ring.host or host
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparkdl_train-xla-", dir=local_dir()) as folder:
        os.chmod(folder, 0o700)
        replay = Replay(path=os.path.join(folder, DATA))
        for _ in replay.first(chunks):
            pass
        template = replay.template
        replay.close()
        spilled = time.perf_counter() - started
        port = _free_port(bind, task.ring.ports) if rank == 0 else 0
        mine = {"host": bind, "port": port,
                "signature": encode_signature(template) if template is not None else None}
        peers = [json.loads(m) for m in group.all_gather(json.dumps(mine))]
        signatures = [p["signature"] for p in peers if p["signature"] is not None]
        if not signatures:  # no rank has a row: every rank hands the driver the same empty partials
            empty = Partial(partitions={partition: {"rank": rank, "world_size": size, "samples": 0, "batches": 0,
                                                    "collectives": "xla", **task_identity()}})
            for k in range(task.epochs - 1):
                if not group.epoch_end(task.epoch + k, empty.to_bytes()):
                    break
            return empty
        host0 = peers[0]["host"]
        spec = {
            "payload": task.payload.value, "state": task.state.value, "settings": task.settings, "report": task.report,
            "epoch": task.epoch, "partition": partition, "rank": rank, "size": size,
            "coordinator": f"[{host0}]:{peers[0]['port']}" if ":" in host0 else f"{host0}:{peers[0]['port']}",
            "bind": bind, "timeout": task.ring.timeout, "lr_scaling": task.ring.lr_scaling, "compression": task.ring.compression,
            "gpu": device is not None and not device.startswith("cpu"), "chunks": replay.chunks,
            "template": decode_signature(signatures[0]), "spilled_seconds": spilled,
            "epochs": task.epochs,
            "identity": task_identity(),  # the Spark task's: where the driver finds the executor it ran on
        }
        # the task's own objects, for its own child, in a folder only this user reads: never from the network
        with open(os.path.join(folder, SPEC), "wb") as f:
            pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
        answers_r, answers_w = os.pipe()  # the task's go / stop to the rank process
        epochs_r, epochs_w = os.pipe()  # the rank process's epoch ends to the task
        with open(os.path.join(folder, LOG), "wb") as out:
            try:
                proc = subprocess.Popen([sys.executable, "-m", "sparkdl_train.worker.xla_rank", folder, str(answers_r), str(epochs_w)],
                                        env=_child_env(device), stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                        pass_fds=(answers_r, epochs_w))
            except BaseException:
                os.close(epochs_r)
                os.close(answers_w)
                raise
            finally:
                os.close(answers_r)
                os.close(epochs_w)
            try:
                with os.fdopen(epochs_r, "r") as ends, os.fdopen(answers_w, "w") as answers:
                    for line in ends:  # until the rank process exits
                        k = int(line.split()[1])
                        with open(os.path.join(folder, EPOCH_RESULT.format(k)), "rb") as f:
                            go = group.epoch_end(task.epoch + k, f.read())
                        answers.write("go\n" if go else "stop\n")
                        answers.flush()
                code = proc.wait()
            finally:
                if proc.poll() is None:  # the task was interrupted (Spark killed the stage): the rank goes too
                    proc.kill()
                    proc.wait()
        result = os.path.join(folder, RESULT)
        if code != 0 or not os.path.exists(result):
            detail = _read(os.path.join(folder, ERROR)) or _read(os.path.join(folder, LOG))[-6000:]
            raise RankError(f"allreduce rank {rank} of {size} (XLA collectives): its process exited with {code}:\n{detail}")
        with open(result, "rb") as f:
            return Partial.from_bytes(f.read())


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""
