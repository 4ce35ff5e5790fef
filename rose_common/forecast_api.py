"""Wire models of the predictor's HTTP API (``GET /v1/forecast``), shared by its clients."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class ForecastPoint(BaseModel):
    """The forecast for one horizon: quantiles of serving demand at ``timestamp``."""

    model_config = ConfigDict(extra="forbid")

    horizon_seconds: int = Field(ge=0)
    timestamp: datetime
    # quantile level as a string ("0.5", "0.9") → predicted value (in the pool's unit)
    quantiles: dict[str, float]
    # Optional, absent unless the predictor serves target risks (``--risks``): per risk ("0.01")
    # an upper bound on the MAXIMUM demand over [last observation, timestamp], exceeded in at
    # most that share of windows (calibrated online); when stale, the same safe bound as above.
    window_max: dict[str, float] | None = None
    # the same in GPUs, ceil(window_max / capacity_per_gpu), when the pool's capacity per GPU is
    # configured: the GPUs serving may need over the window at that risk (lend the rest)
    gpus_needed: dict[str, int] | None = None


class ForecastResponse(BaseModel):
    """``GET /v1/forecast?pool=P&horizon=30m[,60m]`` reply."""

    model_config = ConfigDict(extra="forbid")

    pool: str
    unit: str = "gpus"
    model_version: str
    generated_at: datetime
    # last observation used, and how old it was when the forecast was made
    last_observation_at: datetime | None
    data_age_seconds: float | None
    # True when data is missing or older than the configured limit: the quantiles are then
    # a safe upper bound (e.g. the pool's capacity), never a silent guess.
    stale: bool
    current: float | None
    points: list[ForecastPoint]
