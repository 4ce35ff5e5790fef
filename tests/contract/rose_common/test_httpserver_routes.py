"""rose_common.httpserver's own answers over real loopback HTTP: probes as the component defines
them, 404/405 with JSON errors, a handler that raises (a JSON 500, the server keeps serving), the
overload answer once every slot is held by a request in progress, and refusals counted."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from rose_common import httpserver


@pytest.fixture
def served() -> Iterator[tuple[httpserver.BoundedServer, dict[str, bool], CollectorRegistry]]:
    state = {"ready": False}
    registry = CollectorRegistry()
    refused = httpserver.refusals_counter(registry, "rose_test_http_refused")

    def boom(_: httpserver.Request) -> httpserver.Reply:
        raise RuntimeError("handler bug")

    table = {
        **httpserver.probe_routes(
            healthy=httpserver.always_ok,
            ready=lambda: (state["ready"], "ok" if state["ready"] else "not synced yet"),
            registry=registry,
        ),
        ("POST", "/boom"): boom,
        ("POST", "/echo"): lambda req: httpserver.Reply(200, req.body),
    }
    routes = httpserver.Routes(table, on_refused=lambda r: refused.labels(r).inc())
    limits = httpserver.Limits(max_connections=2, idle_timeout=1.0, request_timeout=1.0, max_body_bytes=16)
    srv = httpserver.serve(("127.0.0.1", 0), routes, limits, name="test")
    try:
        yield srv, state, registry
    finally:
        srv.stop()


def _get(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, http.client.HTTPResponse]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request(method, path, body=body)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r


def test_probes_routes_and_errors(served: tuple[httpserver.BoundedServer, dict[str, bool], CollectorRegistry]) -> None:
    srv, state, _ = served
    assert _get(srv.port, "GET", "/healthz")[:2] == (200, b"ok\n")
    assert _get(srv.port, "GET", "/readyz")[:2] == (503, b"not synced yet\n")
    state["ready"] = True
    assert _get(srv.port, "GET", "/readyz")[:2] == (200, b"ok\n")
    code, body, resp = _get(srv.port, "DELETE", "/healthz")
    assert code == 405 and resp.getheader("Allow") == "GET" and "use GET" in json.loads(body)["error"]
    code, body, _ = _get(srv.port, "GET", "/nope")
    assert code == 404 and "/healthz" in json.loads(body)["error"]
    code, body, _ = _get(srv.port, "POST", "/boom", b"{}")
    assert code == 500 and json.loads(body) == {"error": "internal error: RuntimeError"}
    assert _get(srv.port, "POST", "/echo", b"still up")[:2] == (200, b"still up")
    code, body, _ = _get(srv.port, "POST", "/echo", b"x" * 17)
    assert code == 413 and "over 16 bytes" in json.loads(body)["error"]


def test_overload_is_a_503_with_retry_after(
    served: tuple[httpserver.BoundedServer, dict[str, bool], CollectorRegistry],
) -> None:
    srv, _, registry = served
    busy = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(2)]
    for s in busy:  # requests in progress: not parked, so their slots cannot be taken
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
    time.sleep(0.3)
    code, body, resp = _get(srv.port, "GET", "/healthz")
    assert code == 503 and resp.getheader("Retry-After") == "1" and "connections" in json.loads(body)["error"]
    for s in busy:
        s.close()
    # one client address holding every slot: its share (max_connections_per_client 0 = all slots) is the bound hit
    counted = {r: registry.get_sample_value("rose_test_http_refused_total", {"reason": r}) for r in httpserver.REASONS}
    assert {r: n for r, n in counted.items() if n} == {"too_many_client_connections": 1.0}


def test_a_client_that_closes_and_reconnects_at_once_is_not_refused() -> None:
    """CI flake of the ninth session: a client closed its connection and opened the next before the
    server's thread had noticed the close, and got 503 for a connection it no longer held. Each
    connection here holds the only slot; 300 in a row reproduced it ~40 times before the fix."""
    routes = httpserver.Routes({("GET", "/x"): lambda _: httpserver.Reply(200, b"ok")})
    srv = httpserver.serve(("127.0.0.1", 0), routes, httpserver.Limits(max_connections=1), name="test")
    try:
        codes = [_get(srv.port, "GET", "/x")[0] for _ in range(300)]
    finally:
        srv.stop()
    assert codes.count(200) == 300, {c: codes.count(c) for c in set(codes)}
