"""rose_common.forecast_client without a network: the static-file backend, the backend factory,
and the cache (reduce per reply, maximum age, fetch results for the metric, background refresh)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rose_common.forecast_api import ForecastResponse
from rose_common.forecast_client import (
    ForecastCache,
    ForecastError,
    HttpForecastSource,
    StaticFileForecastSource,
    make_source,
)
from tests.support.extender_fixtures import forecast


def _file(path: Path, *pools: str) -> Path:
    path.write_text(json.dumps([json.loads(forecast(p, {600: 1}).model_dump_json()) for p in pools]))
    return path


def test_make_source_names_what_is_missing(tmp_path: Path) -> None:
    assert make_source("none") is None
    assert isinstance(make_source("http", url="http://p:8080"), HttpForecastSource)
    assert isinstance(make_source("static-file", path=str(tmp_path / "f.json")), StaticFileForecastSource)
    with pytest.raises(ValueError, match="needs the predictor URL"):
        make_source("http")
    with pytest.raises(ValueError, match="needs the forecast file"):
        make_source("static-file")
    with pytest.raises(ValueError, match="unknown forecast backend 'magic': use one of http, static-file, none"):
        make_source("magic")
    with pytest.raises(ValueError, match="must start with http"):
        HttpForecastSource("predictor:8080", timeout_s=1)


def test_static_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = _file(tmp_path / "f.json", "a")
    src = StaticFileForecastSource(path)
    assert src.fetch("a").pool == "a"
    with pytest.raises(ForecastError, match="has no pool 'b'"):
        src.fetch("b")
    _file(path, "a", "b")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert src.fetch("b").pool == "b"
    with pytest.raises(ForecastError, match="forecast file"):
        StaticFileForecastSource(tmp_path / "missing.json").fetch("a")


def test_cache_reduces_ages_and_reports_fetches(tmp_path: Path) -> None:
    now = [100.0]
    results: list[str] = []
    src = StaticFileForecastSource(_file(tmp_path / "f.json", "a"))

    def reduce(resp: ForecastResponse) -> int:
        return len(resp.points)

    cache = ForecastCache(src, reduce=reduce, refresh_s=60, max_age_s=30, on_fetch=results.append, clock=lambda: now[0])
    assert cache.get("a") is None, "nothing fetched yet: the caller falls back without waiting"
    cache.want(["b"])
    cache.refresh_once()
    assert cache.get("a") == 1 and cache.get("b") is None
    assert sorted(results) == ["error", "ok"]
    now[0] += 31
    assert cache.get("a") is None, "older than max_age_s"


def test_background_refresh_fetches_newly_wanted_pools(tmp_path: Path) -> None:
    cache = ForecastCache(
        StaticFileForecastSource(_file(tmp_path / "f.json", "a")),
        reduce=lambda r: r.pool,
        refresh_s=3600,
        max_age_s=3600,
    )
    cache.start()
    try:
        cache.get("a")  # asks for the pool: wakes the refresher at once, not after refresh_s
        deadline = time.monotonic() + 5
        while cache.get("a") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.get("a") == "a"
    finally:
        cache.stop()


def test_attempted_tells_when_every_known_pool_was_fetched_once(tmp_path: Path) -> None:
    """The extender's readiness: a pool nobody asked for yet has not been fetched, so a call for it
    would decide on the fallback; once fetched (even with an error), it counts as attempted."""
    cache = ForecastCache(
        StaticFileForecastSource(_file(tmp_path / "f.json", "a")), reduce=lambda r: r.pool, refresh_s=60, max_age_s=60
    )
    assert cache.attempted([]) and not cache.attempted(["a"])
    cache.want(["a", "b"])
    assert not cache.attempted(["a", "b"]), "wanted is not fetched"
    cache.refresh_once()  # "a" ok, "b" missing from the file: an error, but attempted
    assert cache.attempted(["a", "b"]) and not cache.attempted(["a", "c"])
