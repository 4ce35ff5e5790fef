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


def reduce(resp: ForecastResponse, quantile: str, risk: str = "") -> PoolForecast:
    """Keep (horizon, what serving may need) per point, sorted by horizon
    (:func:`rose_common.forecast_risk.serving_points`, the planner's reduction too): the window bound
    at ``risk`` when every point carries it (a bound over [generated_at, generated_at + horizon],
    which is what the idle window checks), else the upper-quantile demand; with the reply's time, so
    horizons count from it."""
    points, basis = forecast_risk.serving_points(resp, quantile, risk)
    return PoolForecast(
        pool=resp.pool, points=points, stale=resp.stale, basis=basis, generated_at=resp.generated_at.timestamp()
    )


class ForecastCache(forecast_client.ForecastCache[PoolForecast]):
    """The shared forecast cache, reducing every reply with :func:`reduce` at ``risk`` / ``quantile``."""

    def __init__(self, source: forecast_client.ForecastSource, *, quantile: str, risk: str = "", **kwargs: Any) -> None:
        super().__init__(source, reduce=functools.partial(reduce, quantile=quantile, risk=risk), **kwargs)
