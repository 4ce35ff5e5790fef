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
