"""Driver-side progress display (``tqdm.auto``); nothing is drawn on executors.

``verbose=1``: one bar per epoch, moved by the workers' live reports (samples,
samples/s, running loss and metrics, active workers), finished with the epoch's
exact logs. ``verbose=2``: one line per epoch. ``verbose=0``: nothing.
"""

from __future__ import annotations

import math
from typing import Any

from .reports import EpochTally


def _fmt(logs: dict[str, Any]) -> dict[str, str]:
    return {k: f"{v:.4g}" for k, v in logs.items() if isinstance(v, float)}


class FitProgress:
    def __init__(self, epochs: int, verbose: int, workers: int):
        self.epochs = epochs
        self.verbose = int(verbose)
        self.workers = workers
        self.live = self.verbose == 1
        self._bar: Any = None
        self._expected: int | None = None  # the last full epoch's samples: the next bar's total
        self.live_updates = 0

    def epoch_begin(self, epoch: int) -> None:
        if not self.live:
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=self._expected, desc=f"Epoch {epoch + 1}/{self.epochs}", unit="sample",
            unit_scale=True, dynamic_ncols=True, leave=True,
        )

    def report(self, tally: EpochTally) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.update(tally.samples - bar.n)
        post = _fmt(tally.logs())
        post["workers"] = f"{tally.active}/{self.workers}"
        bar.set_postfix(post, refresh=True)
        self.live_updates += 1

    def epoch_end(self, epoch: int, logs: dict[str, Any], samples: int, seconds: float, interrupted: bool = False) -> None:
        rate = samples / seconds if seconds > 0 else math.nan
        if not interrupted:
            self._expected = samples
        bar, self._bar = self._bar, None
        if bar is not None:
            if bar.total is not None and bar.total != samples and not interrupted:
                bar.total = samples
            bar.update(samples - bar.n)
            post = _fmt(logs)
            post["samples/s"] = f"{rate:.0f}"
            if interrupted:
                post["stopped"] = "early"
            bar.set_postfix(post, refresh=False)
            bar.close()
        elif self.verbose == 2:
            from tqdm.auto import tqdm

            parts = " - ".join(f"{k}: {v}" for k, v in _fmt(logs).items())
            tqdm.write(f"Epoch {epoch + 1}/{self.epochs} - {seconds:.1f}s - {rate:.0f} samples/s - {parts}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
