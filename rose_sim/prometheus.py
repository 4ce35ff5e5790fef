"""Serving demand from Prometheus: ``rose simulate --prometheus URL --query Q --start T --end T --step D``.

I/O boundary: the one range query, through the predictor's own ingestion
(:class:`predictor.ingest.PrometheusSource`: prometheus-api-client, long ranges split under
Prometheus's 11,000-point limit, the answer put on the step grid with a missing step a gap, never
a zero). What comes back is handed to :func:`rose_sim.inputs.demand_from_values` exactly as a CSV
series is, so the two forms of the same series give the same simulation. :func:`parse_time` is
pure. Every refusal is a one-line :class:`SimInputError`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np

from predictor.ingest import IngestError, PrometheusSource
from predictor.series import parse_duration
from rose_sim.inputs import Demand, SimInputError, demand_from_values


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:500]


def parse_time(text: str, now: float, flag: str) -> int:
    """``--start`` / ``--end``: epoch seconds, ISO-8601 (UTC unless it says), ``now`` or ``now-<duration>``."""
    t = text.strip()
    if t == "now" or t.startswith("now-"):
        if t == "now":
            return int(now)
        try:
            return int(now) - parse_duration(t[4:])
        except ValueError as e:
            raise SimInputError(f"{flag} {text!r}: {e}") from None
    try:
        v = float(t)
    except ValueError:
        pass
    else:
        if not math.isfinite(v) or v < 0:
            raise SimInputError(f"{flag} {text!r}: epoch seconds must be a finite number >= 0")
        return int(v)
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise SimInputError(
            f"{flag} {text!r}: give epoch seconds, ISO-8601 (e.g. 2026-11-01T00:00:00Z), now or now-21d"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp())


def load_prometheus(url: str, query: str, start: int, end: int, step: int, **kw: Any) -> Demand:
    """The range query's values on ``[start, end]`` every ``step`` seconds → :func:`demand_from_values`."""
    if not url.startswith(("http://", "https://")):
        raise SimInputError(f"--prometheus {url!r}: give the server's base URL, e.g. http://127.0.0.1:9090")
    if not query.strip():
        raise SimInputError("--query is empty: give the PromQL of the serving demand, one series")
    if step <= 0:
        raise SimInputError(f"--step must be > 0, got {step}s")
    if end <= start:
        raise SimInputError(f"--end ({end}) must be after --start ({start})")
    try:
        series = PrometheusSource(url, timeout_seconds=30.0).range(query, start, end, step)
    except IngestError as e:
        raise SimInputError(_one_line(str(e))) from None
    if not np.any(~np.isnan(series.values)):
        raise SimInputError(
            f"query {query!r} returned no samples between {datetime.fromtimestamp(start, UTC):%Y-%m-%dT%H:%M:%SZ} "
            f"and {datetime.fromtimestamp(end, UTC):%Y-%m-%dT%H:%M:%SZ} at step {step}s"
        )
    return demand_from_values(series.start, series.values, series.step, **kw)
