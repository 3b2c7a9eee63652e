"""The allreduce step through XLA's own collectives (``allreduce.collectives='xla'``, JAX only).

Every rank is one process of one JAX job (``jax.distributed``: Gloo between CPUs, NCCL between
GPUs) with one device. :class:`CollectiveStep` compiles Keras' stateless gradient, the sum of every
rank's gradients and the optimizer's update into one XLA program (``jax.shard_map`` over a mesh
of the ranks' devices, ``lax.psum`` per gradient): the reduction reads and writes device memory
(no host staging), and XLA's scheduler may start a layer's sum while earlier layers' gradients are
still computed (what its GPU backend does with NCCL; its CPU runtime, measured, does not).

The step keeps the ring engine's semantics (:mod:`sparkdl_train.worker.allreduce_task`), so the two
train to the same weights:

* every rank's gradient is weighted by its batch's rows over ``batch_size``, and the update is the
  weighted sum over the summed weight: the mean over every row of the step;
* shapes are static and equal on every rank: a short batch is padded to ``batch_size`` rows whose
  sample weight is 0, its real rows weighted ``batch_size / rows`` for the loss (the loss is then
  the mean over the real rows, as the ring engine's step computes it on the short batch itself);
* a rank out of data feeds a batch of zeros with weight 0 (join semantics): it contributes
  nothing; when the summed weight is 0 every rank is done and the update is skipped, so all ranks
  run the same number of steps;
* metrics are each rank's, updated outside the program by Keras' own metric update on the real
  rows only (Keras' compiled ``metrics`` ignore sample weights, so padding cannot be masked there);
* ``wire`` ('fp16', 'bf16'): each rank's weighted gradient is rounded to that type and the sum is
  taken in it (XLA's and NCCL's all-reduce add in the type they are given; the ring adds in float32);
  the summed weight stays float32;
* non-trainable floats (BatchNorm's moving statistics) become the ranks' weighted mean after every
  step (the ring engine averages them once, at the end of the epoch: the same mean for an update
  that is linear in them, as moving averages are); integer ones (seed generators) stay each rank's.

The weights live as global arrays replicated over the mesh while an epoch runs
(:meth:`CollectiveStep.load` / :meth:`CollectiveStep.store` move them between the model's
variables and the program). Variables a loss updates as metrics (none of Keras' own) are not kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _compat
from ..roles import merged, role
from ..trees import tree_map
from .flat import first_input

AXIS = "ranks"


def join(coordinator: str, size: int, rank: int, bind: str, gpu: bool, timeout: int) -> None:
    """This process joins the stage's JAX job: rank 0's process hosts the coordinator on ``bind``;
    between CPUs the collectives go through Gloo, whose sockets this rank opens and publishes at ``bind``
    too (:func:`_gloo_at`). A rank process that stops sending heartbeats (it failed or was killed) ends the
    others within 10 s."""
    import jax

    if not gpu:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    port = coordinator.rsplit(":", 1)[1]
    jax.distributed.initialize(coordinator, num_processes=size, process_id=rank, initialization_timeout=timeout,
                               heartbeat_timeout_seconds=10,
                               coordinator_bind_address=f"{bind}:{port}" if rank == 0 else None)
    if not gpu:
        _gloo_at(bind)


# JAX's private names :func:`_gloo_at` uses (no public way to give Gloo an address; jax 0.10):
# (module, attribute path, what for). :func:`missing` lists the ones a JAX lacks (tests/unit/test_compat.py).
PRIVATE = (
    ("jax._src.xla_bridge", "register_backend_factory", "the CPU backend made with Gloo at the executor's address"),
    ("jax._src.xla_bridge", "make_cpu_client", "that backend's constructor, given the collectives"),
    ("jax._src.lib", "_jax.make_gloo_tcp_collectives", "Gloo's TCP collectives on a given hostname"),
    ("jax._src.distributed", "global_state", "the client jax.distributed.initialize connected"),
)


def missing() -> list[str]:
    """The names of :data:`PRIVATE` this JAX lacks (as ``sparkdl_train._compat.missing`` does for Keras')."""
    import importlib

    out = []
    for module, path, _ in PRIVATE:
        obj: Any = importlib.import_module(module)
        for name in path.split("."):
            obj = getattr(obj, name, None)
        if obj is None:
            out.append(f"{module}.{path}")
    return out


def _gloo_at(bind: str) -> None:
    """Gloo's TCP collectives listening on, and published to the other ranks at, ``bind`` (the executor's
    address), in place of JAX's default: the address this machine's hostname resolves to, often
    127.0.0.1 (``/etc/hosts``), where a rank on another host cannot reach it (measured on two network
    namespaces: the default hangs until the coordinator's heartbeat gives up; this sums in 1 s).
    Must run before JAX makes its CPU backend (the first computation)."""
    from functools import partial

    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    collectives = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client, hostname=bind)
    xla_bridge.register_backend_factory("cpu", partial(xla_bridge.make_cpu_client, collectives=collectives),
                                        priority=0, fail_quietly=False)


def leave() -> None:
    """The JAX job's shutdown barrier: every rank reaches it at the end of a stage that succeeded."""
    import jax

    jax.distributed.shutdown()


def _global(local: Any, sharding: Any, shape: tuple[int, ...]) -> Any:
    import jax

    return jax.make_array_from_single_device_arrays(shape, sharding, [jax.device_put(local, jax.local_devices()[0])])


class CollectiveStep:
    """Keras' train step for ``model`` with the gradients summed over every process of the JAX job."""

    def __init__(self, model: Any, batch_size: int, wire: str | None = None):
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        if len(jax.local_devices()) != 1:
            raise RuntimeError(f"one device per rank process, not {len(jax.local_devices())}")
        self.model, self.batch_size = model, int(batch_size)
        self.size = jax.process_count()
        self.device = jax.local_devices()[0]
        self.mesh = Mesh(np.array(jax.devices()), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.split = NamedSharding(self.mesh, P(AXIS))
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        # the program's state, replicated: trainable, non-trainable and optimizer variables
        self.groups = [list(model.trainable_variables), list(model.non_trainable_variables), list(model.optimizer.variables)]
        self.metric_vars = list(model.metrics_variables)  # each rank's own, updated outside the program
        # statistics averaged (sparkdl_train.roles); counters and seed generators' states kept per rank
        floats = [merged(role(v.dtype, False, getattr(v, "path", ""))) for v in self.groups[1]]
        size = float(batch_size)
        # allreduce.compression: the gradients summed in half width (NCCL adds in the type it is given)
        wire_dtype = {"fp16": jnp.float16, "bf16": jnp.bfloat16}.get(wire or "", jnp.float32)

        def step(state, metrics, x, y, sw, rows):
            trainable, non_trainable, opt = state
            metrics = [m[0] for m in metrics]  # this rank's, without the mesh's axis
            rows = rows[0]
            w = rows / size  # the ring engine's weight: this rank's share of a full batch
            mask = (jnp.arange(size) < rows).astype(jnp.float32)
            # the loss is the mean over the real rows (padding weighs 0), as the ring engine's step on the short batch
            loss_sw = (mask if sw is None else mask * sw) * (size / jnp.maximum(rows, 1.0))
            grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
            (_, aux), grads = grad_fn(trainable, non_trainable, metrics, x, y, loss_sw, training=True,
                                      optimizer_variables=opt)
            unscaled, y_pred, new_nt, _ = aux
            has = rows > 0
            weighted = [jnp.where(has, g.astype(jnp.float32) * w, 0.0).astype(wire_dtype) for g in grads]
            summed, total = jax.lax.psum((weighted, w), AXIS)
            summed = [g.astype(jnp.float32) for g in summed]
            go = total > 0
            mean = [(g / jnp.where(go, total, 1.0)).astype(v.dtype) for g, v in zip(summed, trainable)]
            new_trainable, new_opt = model.optimizer.stateless_apply(opt, mean, trainable)
            new_trainable = [jnp.where(go, n, o) for n, o in zip(new_trainable, trainable)]
            new_opt = [jnp.where(go, n, o) for n, o in zip(new_opt, opt)]
            nt = []
            for n, o, f in zip(new_nt, non_trainable, floats):
                if f:
                    s = jax.lax.psum(jnp.where(has, n.astype(jnp.float32) * w, 0.0), AXIS)
                    n = jnp.where(go, s / jnp.where(go, total, 1.0), o).astype(o.dtype)
                nt.append(n)
            return [new_trainable, nt, new_opt], jnp.reshape(total, (1,)), jnp.reshape(unscaled, (1,)), y_pred

        rep, split = P(), P(AXIS)
        self._step = jax.jit(jax.shard_map(
            step, mesh=self.mesh, in_specs=([rep, rep, rep], split, split, split, split, split),
            out_specs=([rep, rep, rep], split, split, split), check_vma=False))

        def metrics_update(metrics, loss, x, y, y_pred, sw):
            return _compat.jax_update_metrics(model, metrics, loss, x, y, y_pred, sw)

        # Keras' own metric update on this rank's real rows (compiled per shape: full batches and a short last one)
        self._metrics = jax.jit(metrics_update)
        self.state: list[list[Any]] | None = None
        self.metrics: list[Any] | None = None
        self._metric_args: list[Any] = []

    # -- the model's variables <-> the program's global arrays --------------------------------
    def load(self) -> None:
        """The model's variables as the step's state (replicated) and this rank's metrics."""
        self.state = [[_global(np.asarray(v.value), self.replicated, tuple(v.shape)) for v in group] for group in self.groups]
        # what the program's loss is given as the metrics' values (Keras' stateless scope maps them; the values
        # it returns are dropped, the metrics being updated outside): built once, not per step
        self._metric_args = [_global(np.asarray(v.value)[None], self.split, (self.size, *v.shape)) for v in self.metric_vars]
        self.reset_metrics()

    def reset_metrics(self) -> None:
        """This rank's metrics from the model's variables (reset: a new epoch)."""
        import jax

        self.metrics = [jax.device_put(np.asarray(v.value), self.device) for v in self.metric_vars]

    def store(self, metrics_only: bool = False) -> None:
        """This rank's copy of the state (``metrics_only``: the metrics only) back into the model's variables."""
        assert self.state is not None and self.metrics is not None
        for v, x in zip(self.metric_vars, self.metrics):
            _compat.assign_raw(v, x)
        if metrics_only:
            return
        for group, values in zip(self.groups, self.state):
            for v, a in zip(group, values):
                _compat.assign_raw(v, a.addressable_data(0))  # this process's copy: a single-device array

    # -- a step ------------------------------------------------------------------------------
    def padded(self, batch: tuple | None, template: tuple) -> tuple[tuple, int]:
        """``batch`` (or, out of data, ``template``'s zeros) padded to ``batch_size`` rows, and its real rows."""
        from ..trees import zero_rows

        b = self.batch_size
        if batch is None:
            return zero_rows(tuple(template), b), 0
        rows = int(np.shape(first_input(batch[0]))[0])
        if rows == b:
            return tuple(batch), rows
        if rows > b:
            raise ValueError(f"a batch of {rows} rows for batch_size {b}")
        return tree_map(lambda a: np.concatenate([np.asarray(a), np.zeros((b - rows, *np.shape(a)[1:]), np.asarray(a).dtype)]),
                        tuple(batch)), rows

    def __call__(self, batch: tuple | None, template: tuple) -> Any:
        """One step on every rank at once (``batch`` None: this rank is out of data); returns the
        summed weight (a device array: 0 when every rank was out of data)."""
        (x, y, sw), rows = self.padded(batch, template)

        def split(a: Any) -> Any:
            a = np.asarray(a)
            return _global(a, self.split, (a.shape[0] * self.size, *a.shape[1:]))

        args = tree_map(split, (x, y)) + ((tree_map(split, sw) if sw is not None else None),)
        self.state, total, loss, y_pred = self._step(self.state, self._metric_args, *args, split(np.array([rows], np.float32)))
        if rows:
            local = tree_map(lambda a: a.addressable_data(0), y_pred)
            if rows < self.batch_size:
                local = tree_map(lambda a: a[:rows], local)
            bx, by, bsw = batch
            self.metrics = list(self._metrics(self.metrics, loss.addressable_data(0)[0], bx, by, local, bsw))
        return total
