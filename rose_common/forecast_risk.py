"""A predictor reply read at the operator's target risk, for the extender and the planner.

I/O boundary: none (pure functions of :mod:`rose_common.forecast_api` models). When the predictor
serves risks (``rose predictor serve --risks``), each point carries, per risk, the GPUs serving
may need over the whole window [now, now + horizon] (``gpus_needed``, or ``window_max`` when the
pool's unit is GPUs). A consumer configured with ``--risk`` uses that when every point of the
reply carries it, and its ``--quantile`` series otherwise (older predictors, or a predictor
serving other risks): backward compatible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rose_common.forecast_api import ForecastPoint, ForecastResponse

__all__ = ["at_risk", "risk_key", "serving_points", "upper_demand"]


def risk_key(text: str) -> str:
    """``--risk`` as the wire's key ("0.010" → "0.01"); "" (no risk) stays "".

    Raises ``ValueError`` saying what to write when it is not a share in (0, 0.5)."""
    text = str(text).strip()
    if not text:
        return ""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 0.5:
        raise ValueError(f"--risk must be a share of windows in (0, 0.5), e.g. 0.01, got {text!r}")
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _is(key: str, risk: str) -> bool:
    """Whether a reply's key names ``risk`` (a key that is no risk names none)."""
    try:
        return risk_key(key) == risk
    except ValueError:
        return False


def _point_at_risk(point: ForecastPoint, risk: str, unit: str) -> float | None:
    for key, value in (point.gpus_needed or {}).items():
        if _is(key, risk):
            return float(value)
    if unit == "gpus":
        for key, bound in (point.window_max or {}).items():
            if _is(key, risk):
                return float(bound)
    return None


def at_risk(resp: ForecastResponse, risk: str) -> tuple[tuple[int, float], ...] | None:
    """``(horizon seconds, GPUs serving may need over [now, now + horizon] at risk)`` per point,
    sorted by horizon; ``None`` when ``risk`` is "" or some point does not carry it (the caller
    then uses its quantile series). ``gpus_needed`` first, else ``window_max`` in a GPU unit."""
    if not risk or not resp.points:
        return None
    out = []
    for point in resp.points:
        value = _point_at_risk(point, risk, resp.unit)
        if value is None:
            return None
        out.append((point.horizon_seconds, value))
    return tuple(sorted(out))


def upper_demand(quantiles: Mapping[str, float], wanted: str) -> float | None:
    """The wanted quantile, else the highest one given (the conservative side)."""
    if wanted in quantiles:
        return quantiles[wanted]
    best: tuple[float, float] | None = None
    for level, value in quantiles.items():
        try:
            q = float(level)
        except ValueError:
            continue
        if best is None or q > best[0]:
            best = (q, value)
    return None if best is None else best[1]


def serving_points(resp: ForecastResponse, quantile: str, risk: str = "") -> tuple[tuple[tuple[int, float], ...], str]:
    """``((horizon s, GPUs serving may need), ...)`` sorted by horizon, and what they are: the window
    bounds at ``risk`` when every point carries them (basis ``"risk R"``), else each point's
    ``quantile`` (:func:`upper_demand`; basis ``"quantile"``). The one reduction of a reply that the
    extender's filter and the planner's grants both judge a new lent claim on
    (``rose_common.lending.new_claim_room`` / ``idle_window``)."""
    windows = at_risk(resp, risk)
    if windows:
        return windows, f"risk {risk}"
    points = []
    for point in resp.points:
        demand = upper_demand(point.quantiles, quantile)
        if demand is not None:
            points.append((point.horizon_seconds, float(demand)))
    return tuple(sorted(points)), "quantile"
