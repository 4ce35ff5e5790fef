"""An explicit replay source for the demo and benchmarks: a recorded or generated series, shifted to now.

Never chosen silently: ``rose predictor serve --replay FILE.csv`` (or ``--replay generated``)
selects it instead of Prometheus and says so in the log. All but the last ``lead`` points lie
in the past when the source is created; the held-back points are revealed in real time, one
per step, after which the data ages and the forecast turns stale (as it should).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from predictor.series import Series


class ReplaySource:
    def __init__(
        self, series: Series, now: float | None = None, lead: int = 0, clock: Callable[[], float] = time.time
    ) -> None:
        """``lead`` points of the series are held back and revealed as time passes."""
        self.series = series
        self.clock = clock
        t_now = clock() if now is None else now
        aligned = int(t_now) - int(t_now) % series.step
        self.offset = aligned - (series.start + (len(series) - 1 - lead) * series.step)

    def range(self, query: str, start: int, end: int, step: int) -> Series:
        s = self.series
        if step != s.step:
            raise ValueError(f"replay series has step {s.step}s; run with --step {s.step}s")
        start -= start % step
        t = np.arange(start, end + 1, step, dtype=np.int64)
        idx = (t - self.offset - s.start) // s.step
        ok = (idx >= 0) & (idx < len(s)) & (t <= self.clock())
        v = np.full(len(t), np.nan)
        v[ok] = s.values[idx[ok]]
        return Series(start=start, step=step, values=v)
