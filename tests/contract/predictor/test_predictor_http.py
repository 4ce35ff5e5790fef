"""Real HTTP on 127.0.0.1: the forecast API, /metrics, and ingestion through prometheus-api-client."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from predictor import ingest
from predictor.generator import generate
from predictor.ingest import IngestError, PrometheusSource
from predictor.series import Series
from predictor.server import PredictorHTTPServer, serve_in_thread
from predictor.service import PoolConfig, PredictorService, Settings
from predictor.store import ModelStore
from rose_common.forecast_api import ForecastResponse
from tests.support.predictor_fixtures import small_config


class StaticSource:
    """An explicit in-memory stand-in for Prometheus (the e2e test uses the real one)."""

    def __init__(self, series: Series) -> None:
        self.series = series
        self.calls = 0

    def range(self, query: str, start: int, end: int, step: int) -> Series:
        self.calls += 1
        s = self.series
        t = np.arange(start, end + 1, step)
        idx = (t - s.start) // s.step
        ok = (idx >= 0) & (idx < len(s))
        v = np.full(len(t), np.nan)
        v[ok] = s.values[idx[ok]]
        return Series(start=start, step=step, values=v)


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        body, code = e.read(), e.code
    try:
        return code, json.loads(body)
    except json.JSONDecodeError:
        return code, body.decode()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, PredictorService, list[float]]]:
    series = generate(days=4, step=600, seed=11)
    clock = [float(series.end) + 10.0]
    settings = Settings(step=600, history=4 * 86400, max_data_age=900.0, model=small_config(horizons=(600, 1800)))
    pools = [PoolConfig(name="pool-a", query="sum(busy)", capacity=48), PoolConfig(name="pool-b", query="q")]
    store = ModelStore(tmp_path_factory.mktemp("models"))
    svc = PredictorService(pools, StaticSource(series), settings, store, clock=lambda: clock[0])
    srv = PredictorHTTPServer(("127.0.0.1", 0), svc)
    serve_in_thread(srv)
    try:
        yield srv.url, svc, clock
    finally:
        srv.shutdown()
        srv.server_close()


def test_forecast_api(running: tuple[str, PredictorService, list[float]]) -> None:
    url, svc, clock = running
    code, _ = _get(url + "/readyz")
    assert code == 503  # nothing computed yet
    svc.refresh()
    assert _get(url + "/readyz")[0] == 200
    code, body = _get(url + "/v1/forecast?pool=pool-a&horizon=30m")
    assert code == 200, body
    r = ForecastResponse.model_validate(body)
    assert r.pool == "pool-a" and r.unit == "gpus" and not r.stale
    assert [p.horizon_seconds for p in r.points] == [1800]
    assert r.model_version.startswith("pool-a-")
    assert svc.store is not None
    assert (svc.store.root / "pool-a" / f"{r.model_version}.pkl").exists()  # persisted and versioned
    q = r.points[0].quantiles
    assert 0 < q["0.5"] <= q["0.9"]
    code, body = _get(url + "/v1/forecast?pool=pool-a")
    assert [p["horizon_seconds"] for p in body["points"]] == [600, 1800]

    # /metrics exports the same numbers
    code, text = _get(url + "/metrics")
    assert code == 200
    assert f'rose_forecast_demand{{horizon="30m",pool="pool-a",quantile="0.9"}} {q["0.9"]}' in text
    assert 'rose_forecast_stale{pool="pool-a"} 0.0' in text
    assert 'rose_forecast_requests_total{code="200"} 2.0' in text

    # data goes old → stale and the capacity as a safe upper bound
    clock[0] += 3600
    svc.source.series = Series(start=0, step=600, values=np.zeros(1))  # type: ignore[attr-defined]
    svc.refresh()
    code, body = _get(url + "/v1/forecast?pool=pool-a&horizon=10m")
    r = ForecastResponse.model_validate(body)
    assert r.stale and r.points[0].quantiles == {"0.5": 48.0, "0.9": 48.0}
    assert r.data_age_seconds is not None and r.data_age_seconds > 900
    _, text = _get(url + "/metrics")
    assert 'rose_forecast_stale{pool="pool-a"} 1.0' in text


@pytest.mark.parametrize(
    ("query", "code", "match"),
    [
        ("", 400, "exactly one pool"),
        ("pool=nope", 404, "unknown pool 'nope'"),
        ("pool=pool-a&horizon=45m", 400, "not served; available"),
        ("pool=pool-a&horizon=soon", 400, "bad duration"),
    ],
)
def test_bad_requests(running: tuple[str, PredictorService, list[float]], query: str, code: int, match: str) -> None:
    url, svc, _ = running
    if svc.forecast("pool-a") is None:
        svc.refresh()
    got, body = _get(url + "/v1/forecast?" + query)
    assert got == code
    assert match in body["error"]
    assert _get(url + "/v1/forecast?pool=pool-a")[0] == 200  # keeps serving


class _FakePrometheusAPI(BaseHTTPRequestHandler):
    """Answers /api/v1/query_range like Prometheus (a value for every other step)."""

    calls: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        u = urlsplit(self.path)
        q = parse_qs(u.query)
        type(self).calls.append(q)
        if q["query"][0] == "broken(":
            body = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()
            self.send_response(400)
        else:
            start, end, step = int(q["start"][0]), int(q["end"][0]), int(float(q["step"][0]))
            values = [[t, str(t / 60)] for t in range(start, end + 1, step) if (t // step) % 2 == 0]
            data = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_prometheus_source_chunks_and_keeps_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakePrometheusAPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(ingest, "MAX_POINTS_PER_QUERY", 7)
        _FakePrometheusAPI.calls.clear()
        src = PrometheusSource(f"http://127.0.0.1:{srv.server_address[1]}", timeout_seconds=2)
        s = src.range("sum(x)", 6000, 6000 + 60 * 19, 60)
        assert len(s) == 20 and s.start == 6000
        assert len(_FakePrometheusAPI.calls) == 3  # 20 points in chunks of at most 7
        assert s.values[0] == 100.0
        assert np.isnan(s.values[1])  # missing step stays a gap
        with pytest.raises(IngestError, match=r"range query .* failed"):
            src.range("broken(", 0, 600, 60)
    finally:
        srv.shutdown()
        srv.server_close()
