"""HTTP: ``GET /v1/forecast?pool=P&horizon=30m[,60m]``, ``/metrics``, ``/healthz``, ``/readyz``.

Requests only read the service's cached forecast (no Prometheus call, no fit on the request
path). Bad input gets a 4xx with a JSON ``{"error": ...}`` that says what to fix.
"""

from __future__ import annotations

import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from predictor import logs
from predictor.series import format_duration, parse_durations
from predictor.service import PredictorService


def answer_forecast(service: PredictorService, query: str) -> tuple[int, bytes]:
    """The pure part of ``GET /v1/forecast``: status code and JSON body."""
    params = parse_qs(query, keep_blank_values=True)
    pools = params.get("pool", [])
    if len(pools) != 1 or not pools[0]:
        return 400, _err("give exactly one pool, e.g. /v1/forecast?pool=pool-a&horizon=30m")
    pool = pools[0]
    if pool not in service.pools:
        return 404, _err(f"unknown pool {pool!r}; known pools: {sorted(service.pools)}")
    available = list(service.settings.model.horizons)
    wanted = available
    if "horizon" in params:
        try:
            wanted = parse_durations(",".join(params["horizon"]))
        except ValueError as e:
            return 400, _err(str(e))
        missing = [h for h in wanted if h not in available]
        if missing:
            return 400, _err(
                f"horizon(s) {[format_duration(h) for h in missing]} not served; "
                f"available: {[format_duration(h) for h in available]}"
            )
    resp = service.forecast(pool)
    if resp is None:
        detail = service.pools[pool].error or "no forecast computed yet"
        return 503, _err(f"pool {pool!r} has no forecast: {detail}")
    if wanted != available:
        resp = resp.model_copy(update={"points": [p for p in resp.points if p.horizon_seconds in wanted]})
    return 200, resp.model_dump_json().encode()


def _err(msg: str) -> bytes:
    return json.dumps({"error": msg}).encode()


class _Handler(BaseHTTPRequestHandler):
    server: PredictorHTTPServer
    protocol_version = "HTTP/1.1"
    # headers and body go out as separate writes: without TCP_NODELAY, Nagle + delayed ACK
    # add ~40 ms to every keep-alive request
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        svc = self.server.service
        url = urlsplit(self.path)
        if url.path == "/v1/forecast":
            t0 = time.perf_counter()
            code, body = answer_forecast(svc, url.query)
            svc.metrics.requests.labels(str(code)).inc()
            svc.metrics.request_seconds.observe(time.perf_counter() - t0)
            self._send(code, body, "application/json")
        elif url.path == "/metrics":
            self._send(200, generate_latest(svc.metrics.registry), CONTENT_TYPE_LATEST)
        elif url.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif url.path == "/readyz":
            ready = all(st.response is not None for st in svc.pools.values())
            self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n", "text/plain")
        else:
            self._send(404, _err(f"no such path {url.path}; try /v1/forecast?pool=P"), "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # access logs are metrics (rose_forecast_requests_total), not log lines


class PredictorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], service: PredictorService) -> None:
        super().__init__(address, _Handler)
        self.service = service

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def serve_in_thread(server: PredictorHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="predictor-http", daemon=True)
    t.start()
    logs.info("serving forecasts", url=server.url)
    return t


__all__ = ["HTTPStatus", "PredictorHTTPServer", "answer_forecast", "serve_in_thread"]
