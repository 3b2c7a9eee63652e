"""Driver-side progress display (``tqdm.auto``); nothing is drawn on executors.

``verbose=1``: in a terminal or a Jupyter kernel, one live bar per epoch, moved by the
workers' live reports (samples, samples/s, running loss and metrics, active workers) and
finished with the epoch's exact logs. Where stderr is no terminal (spark-submit on YARN, CI
logs, ``nohup``) carriage-return redraws would pile up as one unreadable line, so the same
numbers go out as one plain line every ``log_interval`` seconds instead, plus one line at the
epoch's end. ``verbose=2``: one line per epoch. ``verbose=0``: nothing.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable

from .reports import EpochTally


def interactive() -> bool:
    """A live bar can be drawn: a Jupyter/IPython kernel (tqdm.auto draws a widget) or a terminal."""
    shell = sys.modules.get("IPython")
    if shell is not None and "ipykernel" in sys.modules:
        ip = getattr(shell, "get_ipython", lambda: None)()
        if ip is not None and type(ip).__name__ == "ZMQInteractiveShell":
            return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _line(epoch: int, epochs: int, samples: int, rate: float, logs: dict[str, Any], extra: str = "") -> str:
    parts = [f"Epoch {epoch + 1}/{epochs}", f"{samples:,} samples", f"{rate:,.0f} samples/s"]
    parts += [f"{k}: {v}" for k, v in _fmt(logs).items()]
    return " - ".join(parts) + extra


def _fmt(logs: dict[str, Any]) -> dict[str, str]:
    return {k: f"{v:.4g}" for k, v in logs.items() if isinstance(v, float)}


class FitProgress:
    def __init__(self, epochs: int, verbose: int, workers: int, log_interval: float = 10.0, bar: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.epochs = epochs
        self.verbose = int(verbose)
        self.workers = workers
        self.live = self.verbose == 1
        self.bar = self.live and (interactive() if bar is None else bar)  # else: lines every log_interval seconds
        self.log_interval = log_interval
        self._clock = clock
        self._bar: Any = None
        self._expected: int | None = None  # the last full epoch's samples: the next bar's total
        self._epoch = 0
        self._started = 0.0
        self._next_line = 0.0
        self.live_updates = 0

    def epoch_begin(self, epoch: int) -> None:
        self._epoch = epoch
        self._started = self._clock()
        self._next_line = self._started + self.log_interval
        if not self.bar:
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=self._expected, desc=f"Epoch {epoch + 1}/{self.epochs}", unit="sample",
            unit_scale=True, dynamic_ncols=True, leave=True,
        )

    def report(self, tally: EpochTally) -> None:
        if self.live and not self.bar:
            now = self._clock()
            if now >= self._next_line:
                self._next_line = now + self.log_interval
                rate = tally.samples / max(now - self._started, 1e-9)
                self._write(_line(self._epoch, self.epochs, tally.samples, rate, tally.logs(),
                                  f" - workers {tally.active}/{self.workers}"))
                self.live_updates += 1
            return
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
        elif self.live:  # line mode: the epoch's exact logs close it
            self._write(_line(epoch, self.epochs, samples, rate, logs,
                              f" - {seconds:.1f}s" + (" - stopped early" if interrupted else " - done")))

    @staticmethod
    def _write(line: str) -> None:
        # a display, like tqdm's: it goes to stderr whatever the logging configuration
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
