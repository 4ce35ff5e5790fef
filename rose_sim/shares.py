"""``rose simulate --gpu-shares N``: what lending the idle fraction of partly used serving GPUs in
shares of ``1/N`` GPU would add (issue 27 §3). Pure: numbers in, numbers out.

The whole-GPU planner lends ``pool - ⌈b⌉`` GPUs, where ``b`` is serving's forecast bound (GPUs,
fractional, at the operator's risk): serving keeps ``⌈b⌉`` GPUs of which ``⌈b⌉ - b`` are forecast
idle. This model lends that idle fraction too, in whole shares, on top of whatever the whole-GPU
policy yields, tick by tick over the evaluated period:

- **Planned.** At tick ``i`` the bound ``b`` over the window the share must run (the first
  served horizon at or past ``window_s``, the jobs' longest minimum useful run) gives
  ``k = ⌊N (min(pool, ⌈b⌉) - b)⌋`` shares. Fewer than the tick before: a planned shrink (nothing lost).
- **Unplanned.** When serving's demand during the tick exceeds ``⌈b⌉ - k / N`` the shares are
  reclaimed first (serving waits for their suspend, counted once per tick with shares), and they
  do nothing that tick.
- **Useful.** A share held from the tick before computes the whole tick; a new one (or one
  re-lent after a reclaim) computes after ``start_s`` (the cost model's pod start). A share of
  ``1/N`` GPU is assumed to do ``1/N`` of a GPU's work (MPS with an active-thread percentage), and
  an RL job is assumed to take every share offered.

This is the potential of co-locating RL shares with serving on its GPUs. ROSE's driver today does
not do that: a serving claim's prepare reclaims every share on its GPU, and the extender and the
planner count serving in whole GPUs (``scheduler_extender/shares.py``). So the figure is an upper
bound of what the issue's "serving GPU whose load uses a fraction of it lends the rest" would add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rose_sim.forecasters import Bounds

MAX_SHARES_PER_GPU = 20  # the driver's compute step is 5 %: at most 20 shares of one GPU


@dataclass(frozen=True)
class ShareLending:
    forecaster: str
    shares_per_gpu: int
    window_s: int  # the forecast horizon the shares were planned over
    lent_gpu_hours: float  # the shares' fractions x time they were planned
    useful_gpu_hours: float  # less start-ups and ticks lost to unplanned reclaims
    unplanned_reclaims: int  # ticks where serving needed the shares' part (serving waited for their suspend)
    planned_shrinks: int
    evaluated_days: float

    def report(self) -> dict[str, float | int | str]:
        days = self.evaluated_days or 1.0
        return {
            "forecaster": self.forecaster,
            "shares_per_gpu": self.shares_per_gpu,
            "window_s": self.window_s,
            "lent_gpu_hours_per_day": round(self.lent_gpu_hours / days, 1),
            "useful_gpu_hours_per_day": round(self.useful_gpu_hours / days, 1),
            "unplanned_reclaims_per_day": round(self.unplanned_reclaims / days, 2),
            "planned_shrinks_per_day": round(self.planned_shrinks / days, 1),
        }


def planned_shares(bound: float, pool_gpus: int, shares_per_gpu: int) -> tuple[int, int]:
    """(serving's GPUs ``min(pool, ⌈bound⌉)``, shares of ``1/N`` lent of their forecast idle fraction)."""
    serving = min(pool_gpus, math.ceil(bound - 1e-9))
    idle = max(0.0, serving - bound)
    return serving, math.floor(idle * shares_per_gpu + 1e-9)


def _column(bounds: Bounds, window_s: int) -> int:
    for i, h in enumerate(bounds.horizons_s):
        if h >= window_s:
            return i
    return len(bounds.horizons_s) - 1


def share_lending(
    busy: np.ndarray,
    bounds: Bounds,
    *,
    history: int,
    tick_s: int,
    pool_gpus: int,
    shares_per_gpu: int,
    window_s: int,
    start_s: float,
) -> ShareLending:
    """Share lending over ticks ``history..`` of ``busy`` (serving's GPUs per tick) planned on ``bounds``."""
    if not 1 <= shares_per_gpu <= MAX_SHARES_PER_GPU:
        raise ValueError(f"--gpu-shares must be 1..{MAX_SHARES_PER_GPU} shares per GPU, got {shares_per_gpu}")
    col = _column(bounds, window_s)
    lent = useful = 0.0
    reclaims = shrinks = held = 0
    fresh = max(0.0, tick_s - start_s)
    for i in range(history, len(busy)):
        serving, k = planned_shares(float(bounds.values[i, col]), pool_gpus, shares_per_gpu)
        lent += k * tick_s / shares_per_gpu
        if k < held:
            shrinks += 1
        if k and float(busy[i]) > serving - k / shares_per_gpu + 1e-9:
            reclaims += 1
            held = 0
            continue
        kept = min(k, held)
        useful += (kept * tick_s + (k - kept) * fresh) / shares_per_gpu
        held = k
    days = (len(busy) - history) * tick_s / 86400
    return ShareLending(
        bounds.name, shares_per_gpu, bounds.horizons_s[col], lent / 3600, useful / 3600, reclaims, shrinks, days
    )
