"""Driver-side progress display (``tqdm.auto``); nothing is drawn on executors."""

from __future__ import annotations

from typing import Any


class EpochProgress:
    def __init__(self, epochs: int, initial_epoch: int, enabled: bool):
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=epochs, initial=initial_epoch, desc="sparkdl_train fit", unit="epoch")

    def update(self, epoch: int, logs: dict[str, Any], samples_per_second: float) -> None:
        if self._bar is None:
            return
        post = {k: f"{v:.4g}" for k, v in logs.items() if isinstance(v, float)}
        post["samples/s"] = f"{samples_per_second:.0f}"
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
