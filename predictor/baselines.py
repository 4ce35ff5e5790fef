"""Baselines that deployed systems use today: persistence, seasonal naive, exponentially weighted mean.

All are pure functions of the observed values ``y`` (NaN = gap), the origins and the horizon in
steps; a forecast for origin ``i`` reads ``y[: i + 1]`` only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from predictor.series import FloatArray

IndexArray = npt.NDArray[np.int64]

EWMA_ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def persistence(y: FloatArray, origins: IndexArray) -> FloatArray:
    """The last value: ``y[i]``."""
    return y[origins].astype(np.float64)


def seasonal_naive(y: FloatArray, origins: IndexArray, horizon: int, period: int) -> FloatArray:
    """The value one ``period`` before the target time: ``y[i + h - period]``.

    Needs ``period >= horizon`` (else the value is in the future: NaN). Where that value is a
    gap, falls back to persistence so the baseline is never silently missing.
    """
    if period < horizon:
        return np.full(len(origins), np.nan)
    src = origins + horizon - period
    out = np.full(len(origins), np.nan)
    ok = src >= 0
    out[ok] = y[src[ok]]
    gap = ok & np.isnan(out)
    out[gap] = y[origins[gap]]
    return out


def ewma_levels(y: FloatArray, alpha: float) -> FloatArray:
    """``e[i] = alpha * y[i] + (1 - alpha) * e[i-1]``, skipping gaps (``e`` carries over a gap)."""
    s = pd.Series(y)
    out: FloatArray = s.ewm(alpha=alpha, adjust=False, ignore_na=True).mean().to_numpy(dtype=np.float64)
    return out


def ewma(y: FloatArray, origins: IndexArray, alpha: float) -> FloatArray:
    """The exponentially weighted mean at the origin, held flat over the horizon."""
    return ewma_levels(y, alpha)[origins]


def tune_ewma_alpha(y: FloatArray, horizon: int, upto: int) -> float:
    """The alpha (from :data:`EWMA_ALPHAS`) with the lowest MAE on origins whose target ≤ ``upto``."""
    origins = np.arange(0, max(0, upto - horizon + 1), dtype=np.int64)
    actual = y[origins + horizon] if len(origins) else np.empty(0)
    best, best_err = EWMA_ALPHAS[0], np.inf
    for a in EWMA_ALPHAS:
        f = ewma_levels(y[: upto + 1], a)[origins] if len(origins) else np.empty(0)
        ok = ~np.isnan(actual) & ~np.isnan(f)
        if not ok.any():
            continue
        err = float(np.mean(np.abs(actual[ok] - f[ok])))
        if err < best_err:
            best, best_err = a, err
    return best
