"""Ingestion from Prometheus (the only module that talks to it), and a bounded history buffer.

Range queries go through ``prometheus-api-client``; long ranges are split so that no query asks
for more than :data:`MAX_POINTS_PER_QUERY` points (Prometheus refuses more than 11,000). The
answer is put on the fixed step grid: a step Prometheus returns nothing for stays NaN (a gap),
never a zero. Note that Prometheus itself carries a sample forward for up to its lookback
delta (5 minutes by default); wrap the query in ``last_over_time(...[<step>])`` or shorten the
server's ``--query.lookback-delta`` if shorter gaps must show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from predictor.series import FloatArray, Series

MAX_POINTS_PER_QUERY = 10_000


class IngestError(RuntimeError):
    """The query failed or returned something the predictor cannot use; the message says what."""


def grid_from_result(result: list[dict[str, Any]], start: int, end: int, step: int, query: str) -> FloatArray:
    """Prometheus ``matrix`` result → values on the grid ``start, start+step, ... <= end`` (NaN = none)."""
    n = (end - start) // step + 1
    out = np.full(n, np.nan)
    if not result:
        return out
    if len(result) > 1:
        labels = [r.get("metric", {}) for r in result[:3]]
        raise IngestError(
            f"query {query!r} returned {len(result)} series (e.g. {labels}); "
            "aggregate it to one series per pool, e.g. sum(...)"
        )
    for ts, raw in result[0].get("values", []):
        i = round((float(ts) - start) / step)
        if 0 <= i < n:
            try:
                v = float(raw)
            except (TypeError, ValueError):
                continue
            out[i] = v if math.isfinite(v) else np.nan
    return out


class PrometheusSource:
    """Range queries against one Prometheus server."""

    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        self.url = url
        self._client = PrometheusConnect(
            url=url,
            disable_ssl=False,
            retry=Retry(total=1, backoff_factor=0.2, status_forcelist=[502, 503, 504]),
            timeout=timeout_seconds,
        )

    def range(self, query: str, start: int, end: int, step: int) -> Series:
        """Values of ``query`` on the grid ``[start, end]`` of ``step`` seconds (start aligned to step)."""
        start = start - start % step
        end = end - end % step
        if end < start:
            raise IngestError(f"empty range: end {end} before start {start}")
        parts: list[FloatArray] = []
        chunk = MAX_POINTS_PER_QUERY * step
        t = start
        while t <= end:
            t_end = min(end, t + chunk - step)
            try:
                result = self._client.custom_query_range(
                    query,
                    start_time=datetime.fromtimestamp(t, UTC),
                    end_time=datetime.fromtimestamp(t_end, UTC),
                    step=str(step),
                )
            except Exception as e:  # requests / client errors: name them, keep serving
                raise IngestError(f"range query to {self.url} failed: {e}") from e
            parts.append(grid_from_result(result, t, t_end, step, query))
            t = t_end + step
        return Series(start=start, step=step, values=np.concatenate(parts))


@dataclass
class HistoryBuffer:
    """The last ``capacity`` steps of one metric: memory stays bounded however long it runs."""

    step: int
    capacity: int
    start: int = 0
    values: FloatArray | None = None

    def merge(self, new: Series) -> None:
        """Add (or overwrite with) ``new``'s points; keeps only the newest ``capacity`` steps."""
        if new.step != self.step:
            raise ValueError(f"step {new.step}s does not match the buffer's {self.step}s")
        if self.values is None or len(self.values) == 0:
            self.start, self.values = new.start, new.values.copy()
        else:
            lo = min(self.start, new.start)
            hi = max(self.start + self.step * len(self.values), new.start + self.step * len(new))
            out = np.full((hi - lo) // self.step, np.nan)
            a = (self.start - lo) // self.step
            out[a : a + len(self.values)] = self.values
            b = (new.start - lo) // self.step
            seg = out[b : b + len(new)]
            known = ~np.isnan(new.values)
            seg[known] = new.values[known]
            self.start, self.values = lo, out
        if len(self.values) > self.capacity:
            drop = len(self.values) - self.capacity
            self.values = self.values[drop:].copy()
            self.start += drop * self.step

    def series(self, name: str = "series") -> Series | None:
        if self.values is None or len(self.values) == 0:
            return None
        return Series(start=self.start, step=self.step, values=self.values, name=name)

    @property
    def end(self) -> int | None:
        return None if self.values is None else self.start + self.step * (len(self.values) - 1)

    def last_observed(self) -> tuple[int, float] | None:
        """(time, value) of the newest non-gap point."""
        if self.values is None:
            return None
        idx = np.flatnonzero(~np.isnan(self.values))
        if len(idx) == 0:
            return None
        i = int(idx[-1])
        return self.start + i * self.step, float(self.values[i])
