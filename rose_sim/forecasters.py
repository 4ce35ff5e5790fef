"""Forecasters in the loop: at every tick, the GPUs serving may need over each horizon's window.

I/O boundary: none (pure arrays in, arrays out). Each forecaster returns ``bounds[i, k]``: at tick
``i`` (before tick ``i``'s demand is seen: it reads ``busy[:i]`` only, except the oracle) an
upper bound on the busy GPUs over ``[t_i, t_i + horizons[k]]``. The engine hands them to the
controller's own mapping (:func:`elastic_controller.pools.to_forecast`, at the operator's risk)
as the predictor's reply would carry them (``gpus_needed``).

- ``oracle``: the true window maximum (the limit; reads the future by definition).
- ``persistence``: the last observed value for every horizon (reactive).
- ``baseline``: the best of the tuned baselines of ``predictor.baselines`` / ``predictor.evaluate``:
  persistence x (1 + k), persistence + k, EWMA (alpha tuned) x (1 + k), yesterday's window
  maximum x (1 + k), static k; each ``k`` is the conformal ``1 - risk`` quantile of what the
  history's windows needed (``predictor.risk.conformal_upper``), and the family that reserves
  least on the history is kept. Tuned on the history only, per horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictor import baselines
from predictor import risk as rk
from predictor.series import FloatArray

PER_DAY_S = 86400


@dataclass(frozen=True)
class Bounds:
    name: str
    horizons_s: tuple[int, ...]
    values: FloatArray  # [ticks, horizons]: GPUs serving may need over [t_i, t_i + h]
    detail: str = ""


def _last(busy: FloatArray, pool_gpus: int) -> FloatArray:
    """``busy[i - 1]`` at tick ``i``; the pool at tick 0 (nothing seen yet)."""
    return np.concatenate([[float(pool_gpus)], busy[:-1]])


def oracle(busy: FloatArray, horizons_s: tuple[int, ...], tick_s: int) -> Bounds:
    cols = []
    rest = np.maximum.accumulate(busy[::-1])[::-1]  # max of busy[i:]: the trace ends, nothing comes after
    for h in horizons_s:
        wm = rk.window_max(busy, h // tick_s)
        cols.append(np.where(np.isnan(wm), rest, wm))
    return Bounds("oracle", horizons_s, np.stack(cols, axis=1))


def persistence(busy: FloatArray, horizons_s: tuple[int, ...], pool_gpus: int) -> Bounds:
    last = _last(busy, pool_gpus)
    return Bounds("persistence", horizons_s, np.repeat(last[:, None], len(horizons_s), axis=1))


class ModelUnavailable(ValueError):
    """The predictor's model cannot be fitted on this history (too few windows for the risk)."""


def model(
    observed: FloatArray,
    capacity_per_gpu: float,
    horizons_s: tuple[int, ...],
    tick_s: int,
    history: int,
    t0: int,
    risk: float,
    refit_every: int,
    pool_gpus: int,
    whole: bool = True,
) -> Bounds:
    """The predictor's model in the loop (see the module docstring); reads ``observed[:i]`` at tick ``i``.
    In whole GPUs (the predictor's ``gpus_needed``), or with ``whole=False`` the fraction of GPUs
    (``rose simulate --gpu-shares``)."""
    n = len(observed)
    cols, widths = [], []
    for hs in horizons_s:
        h = hs // tick_s + 1
        col = np.full(n, float(pool_gpus))
        names = set()
        for a in range(history, n, refit_every):
            b = min(n, a + refit_every)
            try:
                p = rk.fit_risk(observed, h, risk, tick_s, a - 1, t0)  # the history up to the last observation
            except rk.NotEnoughWindows as e:
                raise ModelUnavailable(f"the predictor's model at risk {risk}, {hs // 60}m windows: {e}") from None
            y = observed[: b - 1]
            q = rk.track_q(p, y, a - 1, b - 1, t0)
            seg = rk.bound(p, y, q, 0.0, t0)[a - 1 : b - 1]
            gpus = np.ceil(seg / capacity_per_gpu - 1e-9) if whole else seg / capacity_per_gpu
            col[a:b] = np.where(np.isnan(seg), float(pool_gpus), gpus)
            names.add(p.width_name())
        cols.append(col)
        widths.append(f"{hs // 60}m: {'/'.join(sorted(names))} width")
    detail = f"predictor.risk at risk {risk}, refit every {refit_every * tick_s // 3600} h; " + "; ".join(widths)
    return Bounds("model", horizons_s, np.stack(cols, axis=1), detail)


def _mult(base: FloatArray, need: FloatArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(base > 0, need / base - 1.0, np.where(need > 0, np.inf, -np.inf))
    return out


def _tuned(busy: FloatArray, h: int, tick_s: int, history: int, pool_gpus: int, risk: float) -> tuple[FloatArray, str]:
    """One horizon's best tuned baseline over every tick; the knob and the choice from the history only."""
    last = _last(busy, pool_gpus)
    need = rk.window_max(busy, h)  # the max over [i, i + h]: what the bound must cover
    resolved = np.arange(1, max(1, history - h))  # origins whose window ended inside the history
    period = PER_DAY_S // tick_s
    alpha = baselines.tune_ewma_alpha(busy[:history], h, history - 1)
    ewma = np.concatenate([[float(pool_gpus)], baselines.ewma_levels(busy, alpha)[:-1]])  # level at i - 1
    seas = np.full(len(busy), np.nan)
    seas[period:] = need[: len(busy) - period]  # max over [i - P, i - P + h]: ended by i
    families: dict[str, tuple[FloatArray, FloatArray, bool]] = {  # base, threshold, multiplicative
        "persistence x (1+k)": (last, _mult(last, need), True),
        "persistence + k": (last, need - last, False),
        f"ewma(alpha={alpha:g}) x (1+k)": (ewma, _mult(ewma, need), True),
        "yesterday's window max x (1+k)": (seas, _mult(seas, need), True),
        "static k": (np.zeros(len(busy)), need, False),
    }
    best: tuple[float, str, FloatArray] | None = None
    for name, (base, th, mult) in families.items():
        ok = resolved[~np.isnan(th[resolved]) & ~np.isnan(base[resolved])]
        if len(ok) < rk.min_windows(risk) or len(ok) < 0.5 * len(resolved):
            continue
        k = rk.conformal_upper(th[ok], risk)
        if math.isinf(k) or math.isnan(k):
            continue
        with np.errstate(invalid="ignore"):
            line = base * (1 + k) if mult else base + k
        line = np.where(np.isnan(line), float(pool_gpus), np.ceil(np.clip(line, 0, None) - 1e-9))
        reserve = float(np.mean(line[ok]))
        if best is None or reserve < best[0]:
            best = (reserve, f"{name}, k={k:.3g}", line)
    if best is None:
        return np.full(len(busy), float(pool_gpus)), "none fits the history: the whole pool"
    return best[2], best[1]


def baseline(
    busy: FloatArray, horizons_s: tuple[int, ...], tick_s: int, history: int, pool_gpus: int, risk: float
) -> Bounds:
    cols, notes = [], []
    for h in horizons_s:
        col, note = _tuned(busy, h // tick_s, tick_s, history, pool_gpus, risk)
        cols.append(col)
        notes.append(f"{h // 60}m: {note}")
    return Bounds("baseline", horizons_s, np.stack(cols, axis=1), "; ".join(notes))
