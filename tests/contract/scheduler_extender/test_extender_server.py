"""The extender over real HTTP on 127.0.0.1: verbs, errors, health, metrics, forecast backends."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rose_common.forecast_client import ForecastError, HttpForecastSource, StaticFileForecastSource
from scheduler_extender import policy
from scheduler_extender.forecast import ForecastCache
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.model import PodInfo, PodKind
from scheduler_extender.server import METRICS_ROUTES, Extender, ExtenderServer
from tests.support.extender_fixtures import T0, Recorder, args_body, cluster_cache, forecast, pod, preempt_body


class PendingPods:
    """Test double for the API server's view of preemptors (the contract tier runs no API
    server; the e2e tier checks the real lookup): these pods are pending at these priorities."""

    def __init__(self, **priority_by_name: int) -> None:
        self.priority = priority_by_name

    def get(self, namespace: str, name: str) -> PodInfo | None:
        if name not in self.priority:
            return None
        return PodInfo(namespace, name, f"u-{name}", PodKind.SERVING, priority=self.priority[name])


_OPEN: list[http.client.HTTPConnection] = []


def connect(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    _OPEN.append(conn)
    return conn


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else None


@pytest.fixture
def server() -> Iterator[tuple[ExtenderServer, Recorder]]:
    cache = cluster_cache(
        {"p": ["n1", "n2"]},
        gpus=2,
        objects=[
            ("Pod", pod("rl", "uid-rl", node_name="n1", job="j")),
            ("Pod", pod("batch", "uid-batch", node_name="n2")),
        ],
    )
    rec = Recorder()
    srv = ExtenderServer(Extender(cache, suspender=rec, preemptors=PendingPods(s=1000)), "127.0.0.1", 0).start()
    try:
        yield srv, rec
    finally:
        srv.stop()


def test_verbs_over_http_keep_alive(server: tuple[ExtenderServer, Recorder]) -> None:
    srv, rec = server
    conn = connect(srv.port)
    code, reply = post(conn, "/filter", args_body(pod("s", "u-s", serving=True), ["n1", "n2", "zz"]))
    assert code == 200 and reply["NodeNames"] == ["n1", "n2", "zz"]
    code, reply = post(conn, "/prioritize", args_body(pod("s", "u-s", serving=True), ["n1", "n2"]))
    assert code == 200 and reply == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 10}]
    # preempt: n1's victim is the RL worker, n2's a batch pod → n2 only, nothing suspended
    code, reply = post(
        conn, "/preempt", preempt_body(pod("s", "u-s", serving=True), {"n1": ["uid-rl"], "n2": ["uid-batch"]})
    )
    assert code == 200
    assert reply == {"NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "uid-batch"}], "NumPDBViolations": 0}}}
    assert rec.uids == []
    code, reply = post(conn, "/preempt", preempt_body(pod("s", "u-s", serving=True), {"n1": ["uid-rl"]}))
    assert code == 200 and reply == {"NodeNameToMetaVictims": {}} and rec.uids == ["uid-rl"]
    # a URL prefix in front of the verb works too (urlPrefix http://host/scheduler)
    code, _ = post(conn, "/scheduler/filter", args_body(pod("s", "u-s"), ["n1"]))
    assert code == 200
    conn.close()


def test_client_errors_are_4xx_with_message(server: tuple[ExtenderServer, Recorder]) -> None:
    srv, _ = server
    conn = connect(srv.port)
    code, reply = post(conn, "/filter", b'{"Pod": {"metadata": {"name": 5}}, "NodeNames": "n1"')
    assert code == 400 and reply["Error"].startswith("invalid request body")
    code, reply = post(conn, "/filter", b'{"Pod": {}, "NodeNames": ["n1", 7]}')
    assert code == 400 and "NodeNames.1" in reply["Error"]
    code, reply = post(conn, "/bind", b"{}")
    assert code == 404 and "unknown path" in reply["Error"]
    conn.request("GET", "/filter")
    resp = conn.getresponse()
    assert resp.status == 405
    resp.read()
    conn.close()
    small = ExtenderServer(srv.extender, "127.0.0.1", 0, max_body=100).start()
    try:
        conn = connect(small.port)
        code, reply = post(conn, "/filter", b" " * 101)
        assert code == 413 and "exceeds" in reply["Error"]
        conn.close()
    finally:
        small.stop()
    # still serving correct answers
    conn = connect(srv.port)
    code, reply = post(conn, "/prioritize", args_body(pod("s", "u-s", serving=True), ["n1"]))
    assert code == 200 and reply == [{"Host": "n1", "Score": 10}]


def test_health_ready_and_metrics(server: tuple[ExtenderServer, Recorder]) -> None:
    srv, _ = server
    conn = connect(srv.port)
    post(conn, "/filter", args_body(pod("w", "u-w", job="j"), ["n1", "n2"]))
    for path, status in (("/healthz", 200), ("/readyz", 200), ("/metrics", 404)):
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == status, path
        resp.read()
    # /metrics on its own listener, which serves no verb
    msrv = ExtenderServer(srv.extender, "127.0.0.1", 0, routes=METRICS_ROUTES).start()
    try:
        mconn = connect(msrv.port)
        assert post(mconn, "/preempt", b"{}")[0] == 404
        mconn = connect(msrv.port)
        mconn.request("GET", "/metrics")
        text = mconn.getresponse().read().decode()
    finally:
        msrv.stop()
    for name in (
        'rose_extender_request_duration_seconds_bucket{le="0.005",verb="filter"}',
        'rose_extender_requests_total{code="200",verb="filter"} 1.0',
        'rose_extender_requests_total{code="400",verb="preempt"} 0.0',
        'rose_extender_filter_nodes_total{pod_kind="rl-worker",result="passed"}',
        "rose_extender_forecast_fallback_total 1.0",  # one pool, no forecast backend
        'rose_extender_suspend_requests_total{result="error"} 0.0',
        'rose_extender_preempt_victims_total{action="suspended"} 0.0',
        'rose_extender_cache_objects{kind="Node"} 2.0',
        "rose_extender_cache_synced 1.0",
    ):
        assert name in text, name


def test_readyz_is_503_until_the_cache_synced() -> None:
    from scheduler_extender.cache import ClusterCache

    srv = ExtenderServer(Extender(ClusterCache()), "127.0.0.1", 0).start()
    try:
        conn = connect(srv.port)
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 503
    finally:
        srv.stop()


class _Predictor(BaseHTTPRequestHandler):
    """A loopback HTTP endpoint speaking the predictor's reply format, to test our client."""

    delay_s = 0.0
    bodies: dict[str, bytes] = {}
    queries: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        type(self).queries.append(self.path)
        time.sleep(self.delay_s)
        pool = self.path.split("pool=")[1].split("&")[0]
        body = self.bodies.get(pool)
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")


def test_http_backend_contract_timeout_and_fallback(tmp_path: Path) -> None:
    handler = type("H", (_Predictor,), {"delay_s": 0.0, "bodies": {}, "queries": []})
    handler.bodies["p"] = forecast("p", {600: 0, 1800: 0, 3600: 0}).model_dump_json().encode()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        src = HttpForecastSource(url, timeout_s=0.3)
        assert src.fetch("p").pool == "p"
        assert "horizon=10m%2C30m%2C60m" in handler.queries[0]
        with pytest.raises(ForecastError):
            src.fetch("missing")
        metrics = ExtenderMetrics("http")
        fc = ForecastCache(src, quantile="0.9", refresh_s=60, max_age_s=60, on_fetch=metrics.on_forecast_fetch)
        assert fc.get("p") is None  # nothing fetched yet: caller falls back, never waits
        fc.refresh_once()
        got = fc.get("p")
        assert got is not None and got.points == ((600, 0.0), (1800, 0.0), (3600, 0.0))
        # a slow predictor costs at most the timeout, in the background refresher only
        handler.delay_s = 1.0
        t0 = time.monotonic()
        with pytest.raises(ForecastError):
            src.fetch("p")
        assert time.monotonic() - t0 < 0.9
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_static_file_backend_steers_rl_workers_to_the_long_idle_pool(tmp_path: Path) -> None:
    path = tmp_path / "forecasts.json"
    items = [
        json.loads(forecast("busy", {600: 7, 1800: 8, 3600: 8}).model_dump_json()),
        json.loads(forecast("quiet", {600: 0, 1800: 0, 3600: 1}).model_dump_json()),
    ]
    path.write_text(json.dumps({"forecasts": items}))
    src = StaticFileForecastSource(path)
    fc = ForecastCache(src, quantile="0.9", refresh_s=60, max_age_s=60)
    fc.want(["busy", "quiet"])
    fc.refresh_once()
    cache = cluster_cache({"busy": ["b1", "b2"], "quiet": ["q1", "q2"]}, gpus=4)
    ext = Extender(cache, forecasts=fc, cfg=policy.PolicyConfig(default_min_run_s=600), clock=T0.timestamp)
    srv = ExtenderServer(ext, "127.0.0.1", 0).start()
    try:
        conn = connect(srv.port)
        code, reply = post(conn, "/filter", args_body(pod("w", "u-w", job="j"), ["b1", "q1", "b2", "q2"]))
        assert code == 200
        assert reply["NodeNames"] == ["b1", "q1", "b2", "q2"]  # busy pool: 1 GPU free for 600 s
        code, scores = post(conn, "/prioritize", args_body(pod("w", "u-w", job="j"), ["b1", "q1"]))
        by_host = {s["Host"]: s["Score"] for s in scores}
        assert by_host["q1"] > by_host["b1"]
    finally:
        srv.stop()
    # a broken file is a clear error, not a crash
    path.write_text("{not json")
    time.sleep(0.01)
    import os

    os.utime(path, (time.time() + 5, time.time() + 5))
    with pytest.raises(ForecastError, match="expected a JSON list"):
        src.fetch("busy")
