"""HTTP: ``GET /v1/forecast?pool=P&horizon=30m[,60m]``, ``/metrics``, ``/healthz``, ``/readyz``.

I/O boundary: the listening socket and its connections, through :mod:`rose_common.httpserver`
(the one bounded server: its overload rule, slow-client timeouts, size limits and JSON errors);
requests only read the service's cached forecast (no Prometheus call, no fit on the request
path). Bad input gets a 4xx with a JSON ``{"error": ...}`` that says what to fix.

The bounds are sized for this API (:class:`Limits`: small GET requests, a body of at most 4 KiB
read and discarded, so a GET with a body is answered once; 64 connections per client address).
``/readyz``: every pool has an answer (a forecast or its safe bound; after a restart, loaded
models answer before any refit: ``service.plan_refresh``). Every refusal counts in
``rose_predictor_http_refused_total{reason}`` (the kernel's reasons).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs

from prometheus_client import Counter

from predictor.series import format_duration, parse_durations
from predictor.service import PredictorService
from rose_common import httpserver

log = logging.getLogger("rose.predictor")


@dataclass(frozen=True)
class Limits(httpserver.Limits):
    """The kernel's bounds sized for this API (small GET requests, no bodies)."""

    max_connections: int = 256
    max_connections_per_client: int = 64  # one client address's share of max_connections
    idle_timeout: float = 30.0
    max_request_line: int = 4096
    max_body_bytes: int = 4096


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
        except OverflowError:
            return 400, _err(f"horizon too large; available: {[format_duration(h) for h in available]}")
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


def _routes(svc: PredictorService, refused: Counter) -> httpserver.Routes:
    def forecast(req: httpserver.Request) -> httpserver.Reply:
        t0 = time.perf_counter()
        code, body = answer_forecast(svc, req.query)
        svc.metrics.requests.labels(str(code)).inc()
        svc.metrics.request_seconds.observe(time.perf_counter() - t0)
        return httpserver.Reply(code, body)

    def ready() -> tuple[bool, str]:
        ok = all(st.response is not None for st in svc.pools.values())
        return ok, "ready" if ok else "not ready"

    def other(req: httpserver.Request) -> httpserver.Reply:
        if req.method != "GET":
            msg = f"method {req.method} not allowed; use GET"
            return httpserver.Reply(405, _err(msg), headers={"Allow": "GET"}, close=True)
        return httpserver.Reply(404, _err(f"no such path {req.path}; try /v1/forecast?pool=P"))

    table = {
        ("GET", "/v1/forecast"): forecast,
        **httpserver.probe_routes(healthy=httpserver.always_ok, ready=ready, registry=svc.metrics.registry),
    }
    return httpserver.Routes(table, fallback=other, error_body=_err, on_refused=lambda r: refused.labels(r).inc())


class PredictorHTTPServer(httpserver.BoundedServer):
    """The predictor's API on the :mod:`rose_common.httpserver` kernel."""

    def __init__(self, address: tuple[str, int], service: PredictorService, limits: Limits | None = None) -> None:
        self.service = service
        self.refused = httpserver.refusals_counter(service.metrics.registry, "rose_predictor_http_refused")
        super().__init__(address, _routes(service, self.refused), limits or Limits(), name="predictor")


def serve_in_thread(server: PredictorHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="predictor-http", daemon=True)
    t.start()
    log.info("serving forecasts", extra={"url": server.url})
    return t


__all__ = ["HTTPStatus", "Limits", "PredictorHTTPServer", "answer_forecast", "serve_in_thread"]
