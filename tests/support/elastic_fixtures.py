"""Forecast files for the ElasticRLJob end-to-end tests: the controller's (and extender's)
``static-file`` backend reads them; a test rewrites one atomically to move the forecast."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from rose_common.forecast_api import ForecastPoint, ForecastResponse


def forecast(pool: str, need: float) -> dict[str, Any]:
    """A fresh forecast for ``pool``: serving needs ``need`` GPUs (p90) over the next hour."""
    now = dt.datetime.now(dt.UTC)
    points = [
        ForecastPoint(horizon_seconds=h, timestamp=now + dt.timedelta(seconds=h), quantiles={"0.9": need})
        for h in (600, 1800, 3600)
    ]
    resp = ForecastResponse(
        pool=pool,
        model_version="e2e",
        generated_at=now,
        last_observation_at=now,
        data_age_seconds=0.0,
        stale=False,
        current=need,
        points=points,
    )
    out: dict[str, Any] = json.loads(resp.model_dump_json())
    return out


def write_forecasts(path: Path, needs: dict[str, float]) -> None:
    """Replace the file atomically (a new mtime: every reader re-reads it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"forecasts": [forecast(p, n) for p, n in needs.items()]}))
    tmp.replace(path)
