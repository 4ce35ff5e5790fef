"""Feature matrices for direct multi-horizon forecasting, all relative to the current level.

Values are first mapped to ``z = log(y + c)`` (``c`` > 0, from the training data) so that a
multiplicative change reads the same at every level. For an origin ``i`` and a horizon of
``h`` steps the target is ``z[i+h] - z[i]``: the change relative to the current level, which
keeps a level shift from breaking the model. Every feature at origin ``i`` reads ``z[:i+1]``
only (no look-ahead); gaps stay NaN (the gradient-boosting models take NaN natively).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictor.series import FloatArray

DAY = 86400
WEEK = 7 * DAY

# Lags and windows in seconds; converted to steps of the series (and de-duplicated).
LAG_SECONDS = (1, 2, 3, 6, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600)  # small ones are in steps
WINDOW_SECONDS = (1800, 3600, 3 * 3600, 6 * 3600, DAY)


@dataclass(frozen=True)
class Transform:
    """``z = log(y + offset)``; values below zero are clipped to zero first."""

    offset: float

    @staticmethod
    def fit(values: FloatArray) -> Transform:
        v = values[~np.isnan(values)]
        if len(v) == 0:
            raise ValueError("no observed values to fit the transform on")
        mean = float(np.mean(np.clip(v, 0.0, None)))
        return Transform(offset=max(0.1 * mean, 1e-6))

    def forward(self, y: FloatArray) -> FloatArray:
        return np.log(np.clip(y, 0.0, None) + self.offset)

    def inverse(self, z: FloatArray) -> FloatArray:
        return np.clip(np.exp(z) - self.offset, 0.0, None)


@dataclass(frozen=True)
class FeatureSpec:
    """What to compute for a series of a given step and seasonal periods (in seconds)."""

    step: int
    day: int = DAY
    week: int = WEEK

    def lag_steps(self) -> list[int]:
        scale = self.day / DAY  # compressed time (tests, demos) scales the lags too
        out: set[int] = set()
        for s in LAG_SECONDS:
            k = s if s < 60 else round(s * scale / self.step)  # tiny values are counts of steps
            if k >= 1:
                out.add(int(k))
        return sorted(out)

    def window_steps(self) -> list[int]:
        scale = self.day / DAY  # compressed time (tests, demos) scales the windows too
        return sorted({max(2, round(w * scale / self.step)) for w in WINDOW_SECONDS})

    def periods(self) -> list[int]:
        """Seasonal periods in steps (only those that are whole numbers of steps)."""
        out = []
        for p in (self.day, self.week):
            if p % self.step == 0 and p // self.step >= 2:
                out.append(p // self.step)
        return out


def shift(z: FloatArray, k: int) -> FloatArray:
    """``out[i] = z[i - k]`` (NaN where out of range); ``k`` may be negative."""
    n = len(z)
    out = np.full(n, np.nan)
    if k >= 0:
        if k < n:
            out[k:] = z[: n - k]
    elif -k < n:
        out[: n + k] = z[-k:]
    return out


def rolling_mean_std(z: FloatArray, w: int) -> tuple[FloatArray, FloatArray]:
    """Mean and std of the last ``w`` observed values ending at ``i`` (inclusive), ignoring gaps."""
    ok = ~np.isnan(z)
    x = np.where(ok, z, 0.0)
    c1 = np.concatenate([[0.0], np.cumsum(x)])
    c2 = np.concatenate([[0.0], np.cumsum(x * x)])
    cn = np.concatenate([[0.0], np.cumsum(ok.astype(np.float64))])
    idx = np.arange(1, len(z) + 1)
    lo = np.maximum(idx - w, 0)
    cnt = cn[idx] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (c1[idx] - c1[lo]) / cnt
        var = (c2[idx] - c2[lo]) / cnt - mean * mean
    mean[cnt < max(2, w // 4)] = np.nan
    std = np.sqrt(np.clip(var, 0.0, None))
    std[np.isnan(mean)] = np.nan
    return mean, std


def build_features(z: FloatArray, times: FloatArray, horizon: int, spec: FeatureSpec) -> FloatArray:
    """Feature matrix (one row per origin ``i``) for forecasting ``horizon`` steps ahead.

    Column order is fixed for a given ``spec``: lags, rolling mean/std, seasonal (for periods
    longer than the horizon), Fourier terms of the target's time of day and week.
    """
    cols: list[FloatArray] = []
    for k in spec.lag_steps():
        cols.append(shift(z, k) - z)
    for w in spec.window_steps():
        mean, std = rolling_mean_std(z, w)
        cols.append(mean - z)
        cols.append(std)
    for p in spec.periods():
        if horizon >= p:
            # the smoothed column reads z[i + horizon - p + 1]: past the origin unless horizon < p
            continue
        same_time = shift(z, p - horizon)  # z at (target time - one period): known at i
        cols.append(same_time - z)
        cols.append(same_time - shift(z, p))  # what that period did over the same span
        sm, _ = rolling_mean_std(shift(z, p - horizon - 1), 3)  # smoothed around it
        cols.append(sm - z)
    target_t = times + horizon * spec.step
    for period, orders in ((spec.day, 3), (spec.week, 2)):
        phase = 2.0 * math.pi * (target_t % period) / period
        for k in range(1, orders + 1):
            cols.append(np.sin(k * phase))
            cols.append(np.cos(k * phase))
    return np.column_stack(cols)


def targets(z: FloatArray, horizon: int) -> FloatArray:
    """``z[i + horizon] - z[i]`` (NaN where unknown)."""
    return shift(z, -horizon) - z
