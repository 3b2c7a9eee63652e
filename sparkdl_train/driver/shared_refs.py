"""Shared references for one fit / predict / evaluate call (model payload, state)."""

from __future__ import annotations

from typing import Any

from ..data.adapters import ArrayAdapter, DataAdapter
from ..model_io import ModelPayload
from ..worker.tasks import encode_state


class SharedRefs:
    """Broadcasts made for one call, reused across adapters of the same kind, all released at the end."""

    def __init__(self, payload: ModelPayload):
        self.payload = payload
        self._payload_refs: dict[str, Any] = {}
        self._owned: list[tuple[DataAdapter, Any]] = []

    @staticmethod
    def _kind(adapter: DataAdapter) -> str:
        return "local" if isinstance(adapter, ArrayAdapter) else "spark"

    def payload_ref(self, adapter: DataAdapter) -> Any:
        kind = self._kind(adapter)
        if kind not in self._payload_refs:
            ref = adapter.share(self.payload)
            self._payload_refs[kind] = ref
            self._owned.append((adapter, ref))
        return self._payload_refs[kind]

    def state_ref(self, adapter: DataAdapter, model: Any, include_optimizer: bool) -> Any:
        """The model's state (weights, optionally the optimizer's), shared for the stages that also
        carry this call's payload."""
        return adapter.share(encode_state(model, include_optimizer), beside=[self.payload])

    def own(self, adapter: DataAdapter, ref: Any) -> None:
        """Release ``ref`` (a persisted RDD, a broadcast) with this call's broadcasts."""
        self._owned.append((adapter, ref))

    def release(self) -> None:
        for adapter, ref in self._owned:
            adapter.unshare(ref)
        self._owned.clear()
        self._payload_refs.clear()
