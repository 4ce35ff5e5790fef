"""The extender's view of serving-demand forecasts: each predictor reply reduced to the policy's
:class:`~scheduler_extender.model.PoolForecast`: at the configured risk (the GPUs serving may need
over each window, ``gpus_needed``, when the reply carries it; issue 14 §3), else at the
configured quantile.

Pure reduction plus a thin subclass; the fetching, timeout and background refresh (the I/O) are
:mod:`rose_common.forecast_client`'s. Scheduling never waits on a backend: the cache is read
without I/O; a pool without a fresh forecast gets ``None`` and the policy's conservative
fallback (counted in ``rose_extender_forecast_fallback_total``).
"""

from __future__ import annotations

import functools
from typing import Any

from rose_common import forecast_client, forecast_risk
from rose_common.forecast_api import ForecastResponse
from scheduler_extender.model import PoolForecast
from scheduler_extender.policy import upper_demand


def reduce(resp: ForecastResponse, quantile: str, risk: str = "") -> PoolForecast:
    """Keep (horizon, what serving may need) per point, sorted by horizon: the window bound at
    ``risk`` when every point carries it (a bound over [now, now + horizon], which is what the idle
    window checks), else the upper-quantile demand."""
    windows = forecast_risk.at_risk(resp, risk)
    if windows:
        return PoolForecast(pool=resp.pool, points=windows, stale=resp.stale, basis=f"risk {risk}")
    points: list[tuple[int, float]] = []
    for point in resp.points:
        demand = upper_demand(point.quantiles, quantile)
        if demand is not None:
            points.append((point.horizon_seconds, demand))
    points.sort()
    return PoolForecast(pool=resp.pool, points=tuple(points), stale=resp.stale)


class ForecastCache(forecast_client.ForecastCache[PoolForecast]):
    """The shared forecast cache, reducing every reply with :func:`reduce` at ``risk`` / ``quantile``."""

    def __init__(self, source: forecast_client.ForecastSource, *, quantile: str, risk: str = "", **kwargs: Any) -> None:
        super().__init__(source, reduce=functools.partial(reduce, quantile=quantile, risk=risk), **kwargs)
