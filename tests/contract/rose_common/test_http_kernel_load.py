"""The bounded load test against every component's server (rose_common.httpserver), over real
loopback sockets: 64 concurrent keep-alive clients, slow clients dripping header bytes, and
half-sent requests, all at once. No reset, no 5xx beyond the documented overload answer (503 with
Retry-After), the slow and half-sent connections closed by the server, and no thread left behind.

Each server is built the way its component builds it (the extender's and predictor's server
classes, the orchestrator's ``http_server``, the controller's and driver's ``serve_probes`` with
their own readiness), with 1 s timeouts so the test stays cheap.
"""

from __future__ import annotations

import http.client
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from rose_common import httpserver
from rose_common.informer import Listed
from tests.support.extender_fixtures import cluster_cache

CLIENTS = 64
CALLS = 5
SLOW = 4  # clients dripping a header byte every 0.2 s
HALF = 4  # requests sent up to the middle of their headers, then nothing
TIMEOUT_S = 1.0


@dataclass
class Served:
    port: int
    path: str
    stop: Callable[[], None]


def _extender() -> Served:
    from scheduler_extender.server import Extender, ExtenderServer, ServerLimits

    limits = ServerLimits(idle_timeout_s=TIMEOUT_S, read_timeout_s=TIMEOUT_S)
    srv = ExtenderServer(Extender(cluster_cache({"pool-a": ["n1", "n2"]})), "127.0.0.1", 0, limits=limits).start()
    return Served(srv.port, "/readyz", srv.stop)


def _predictor() -> Served:
    import numpy as np

    from predictor.generator import generate
    from predictor.series import Series
    from predictor.server import Limits, PredictorHTTPServer, serve_in_thread
    from predictor.service import PoolConfig, PredictorService, Settings
    from tests.support.predictor_fixtures import small_config

    series = generate(days=2, step=600, seed=3)

    class StaticSource:
        """An explicit in-memory stand-in for Prometheus (the predictor's e2e test uses the real one)."""

        def range(self, query: str, start: int, end: int, step: int) -> Series:
            t = np.arange(start, end + 1, step)
            idx = (t - series.start) // series.step
            ok = (idx >= 0) & (idx < len(series))
            v = np.full(len(t), np.nan)
            v[ok] = series.values[idx[ok]]
            return Series(start=start, step=step, values=v)

    settings = Settings(step=600, history=2 * 86400, max_data_age=900.0, model=small_config(horizons=(1800,)))
    svc = PredictorService(
        [PoolConfig(name="pool-a", query="q", capacity=48)],
        StaticSource(),
        settings,
        clock=lambda: series.end + 10.0,
    )
    svc.refresh()
    limits = Limits(idle_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S, write_timeout=2.0)
    srv = PredictorHTTPServer(("127.0.0.1", 0), svc, limits)
    serve_in_thread(srv)

    def stop() -> None:
        srv.shutdown()
        srv.server_close()

    return Served(srv.port, "/v1/forecast?pool=pool-a", stop)


def _orchestrator() -> Served:
    from timeslice.orchestrator import Orchestrator
    from timeslice.server import http_server
    from timeslice.store import MemoryStore

    srv = http_server(Orchestrator(MemoryStore()), ("127.0.0.1", 0), timeout_s=TIMEOUT_S)
    return Served(srv.port, "/readyz", srv.stop)


def _controller() -> Served:
    listed = Listed(("ElasticRLJobs", "Pods"))
    for kind in ("ElasticRLJobs", "Pods"):
        listed.wrap(kind, lambda items: None)([])  # what the informers' first lists do
    limits = httpserver.Limits(idle_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    srv = httpserver.serve_probes(
        ("127.0.0.1", 0), registry=CollectorRegistry(), name="controller", ready=listed.ready, limits=limits
    )
    return Served(srv.port, "/readyz", srv.stop)


def _driver() -> Served:
    from dra_driver.cli import DriverHealth

    health = DriverHealth(registered=True, loop_every_s=30.0)
    limits = httpserver.Limits(idle_timeout=TIMEOUT_S, request_timeout=TIMEOUT_S)
    srv = httpserver.serve_probes(
        ("127.0.0.1", 0),
        registry=CollectorRegistry(),
        name="driver",
        healthy=health.alive,
        ready=health.ready,
        limits=limits,
    )
    return Served(srv.port, "/healthz", srv.stop)


SERVERS: dict[str, Callable[[], Served]] = {
    "extender": _extender,
    "predictor": _predictor,
    "orchestrator": _orchestrator,
    "controller": _controller,
    "driver": _driver,
}


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    resets: list[str] = field(default_factory=list)  # resets, and fresh connections closed unanswered
    overload_without_retry_after: int = 0
    reconnects: int = 0  # an idle keep-alive connection the server closed (any client retries those)
    mu: threading.Lock = field(default_factory=threading.Lock)


def _client(port: int, path: str, start: threading.Barrier, tally: Tally) -> None:
    start.wait()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    done = 0
    answered_here = False  # this connection has had an answer (it was parked since)
    while done < CALLS:
        t0 = time.perf_counter()
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
        except http.client.RemoteDisconnected as err:
            conn.close()
            if not answered_here:  # a fresh connection closed unanswered: not the overload answer
                with tally.mu:
                    tally.resets.append(repr(err))
                return
            with tally.mu:  # closed while parked (its slot went to a new client): any client retries
                tally.reconnects += 1
            answered_here = False
            continue
        except (ConnectionResetError, BrokenPipeError, TimeoutError) as err:
            with tally.mu:
                tally.resets.append(repr(err))
            conn.close()
            return
        with tally.mu:
            tally.latencies.append(time.perf_counter() - t0)
            tally.codes.append(resp.status)
            if resp.status == 503 and resp.getheader("Retry-After") is None:
                tally.overload_without_retry_after += 1
        answered_here = True
        if resp.status == 503 or resp.getheader("Connection", "").lower() == "close":
            conn.close()
            answered_here = False
        done += 1
    conn.close()


def _closed_by_server(s: socket.socket, within_s: float, drip: bytes = b"") -> bool:
    deadline = time.monotonic() + within_s
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if drip:
                s.sendall(drip)
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


@pytest.fixture(params=sorted(SERVERS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Served]]:
    srv = SERVERS[request.param]()
    try:
        yield request.param, srv
    finally:
        srv.stop()


def test_bounded_load(served: tuple[str, Served]) -> None:
    name, srv = served
    time.sleep(0.2)  # the server's own threads are up
    before = threading.active_count()
    half = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(HALF)]
    for s in half:
        s.sendall(f"GET {srv.path} HTTP/1.1\r\nHost: x\r\n".encode())
    slow = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(SLOW)]
    for s in slow:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
    slow_closed: list[bool] = []
    drippers = [
        threading.Thread(target=lambda s=s: slow_closed.append(_closed_by_server(s, 10.0, drip=b"X"))) for s in slow
    ]
    tally = Tally()
    start = threading.Barrier(CLIENTS)
    clients = [threading.Thread(target=_client, args=(srv.port, srv.path, start, tally)) for _ in range(CLIENTS)]
    for t in drippers + clients:
        t.start()
    for t in clients + drippers:
        t.join(60)
    half_closed = [_closed_by_server(s, 10.0) for s in half]
    for s in half + slow:
        s.close()
    lat = sorted(tally.latencies)
    p99 = statistics.quantiles(lat, n=100)[98] * 1000 if len(lat) > 1 else 0.0
    print(
        f"{name}: {len(lat)} answers ({tally.codes.count(503)} overload 503s), p50 {statistics.median(lat) * 1000:.1f}"
        f" ms, p99 {p99:.1f} ms, reconnects {tally.reconnects}"
    )
    assert not tally.resets, tally.resets[:3]
    assert len(tally.codes) == CLIENTS * CALLS
    assert {c for c in tally.codes if c >= 500} <= {503} and tally.overload_without_retry_after == 0
    assert tally.codes.count(200) >= CLIENTS, "most answers are real answers, not overload refusals"
    assert all(half_closed) and all(slow_closed) and len(slow_closed) == SLOW
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= before, [t.name for t in threading.enumerate()]
