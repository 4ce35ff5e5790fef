"""The predictor's HTTP server under hostile or heavy clients, over real sockets on 127.0.0.1.

Each test reproduces a finding of issue 11 (Medium 4, Low) against the real server: a short
listen backlog, idle and slowloris connections held forever, megabytes of headers accepted, a
GET with a body answered twice, unbounded connections, an overflowing ``horizon=`` dropping the
connection, disconnects printing tracebacks, a client that never reads holding a thread; and the
bounded load test (64 clients).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.predictor_load import run_load
from predictor.generator import generate
from predictor.series import Series
from predictor.server import Limits, PredictorHTTPServer, serve_in_thread
from predictor.service import PoolConfig, PredictorService, Settings
from tests.support.predictor_fixtures import small_config

QUICK = Limits(idle_timeout=1.0, request_timeout=1.0, write_timeout=2.0)


class StaticSource:
    """An explicit in-memory stand-in for Prometheus (the e2e test uses the real one)."""

    def __init__(self, series: Series) -> None:
        self.series = series

    def range(self, query: str, start: int, end: int, step: int) -> Series:
        t = np.arange(start, end + 1, step)
        idx = (t - self.series.start) // self.series.step
        ok = (idx >= 0) & (idx < len(self.series))
        v = np.full(len(t), np.nan)
        v[ok] = self.series.values[idx[ok]]
        return Series(start=start, step=step, values=v)


@pytest.fixture(scope="module")
def service() -> PredictorService:
    series = generate(days=3, step=600, seed=5)
    settings = Settings(step=600, history=3 * 86400, max_data_age=900.0, model=small_config(horizons=(1800,)))
    svc = PredictorService(
        [PoolConfig(name="pool-a", query="q", capacity=48)],
        StaticSource(series),
        settings,
        clock=lambda: series.end + 10.0,
    )
    svc.refresh()
    assert svc.forecast("pool-a") is not None
    return svc


def _start(svc: PredictorService, limits: Limits | None = QUICK) -> PredictorHTTPServer:
    srv = PredictorHTTPServer(("127.0.0.1", 0), svc, limits) if limits else PredictorHTTPServer(("127.0.0.1", 0), svc)
    serve_in_thread(srv)
    return srv


@pytest.fixture
def server(service: PredictorService) -> Iterator[PredictorHTTPServer]:
    srv = _start(service)
    yield srv
    srv.shutdown()
    srv.server_close()


def _connect(srv: PredictorHTTPServer, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=timeout)


def _read_all(s: socket.socket, wait: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``wait`` passes)."""
    s.settimeout(wait)
    out = b""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        out += chunk
    return out


def _status_and_json(raw: bytes) -> tuple[int, dict[str, str]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_listen_backlog_holds_64_simultaneous_connects(service: PredictorService) -> None:
    srv = PredictorHTTPServer(("127.0.0.1", 0), service)  # not serving: connects wait in the backlog
    try:
        socks = [_connect(srv, timeout=0.5) for _ in range(64)]  # backlog 5 drops SYNs: a connect times out
        for s in socks:
            s.close()
    finally:
        srv.server_close()


def test_idle_keepalive_connection_is_closed(server: PredictorHTTPServer) -> None:
    with _connect(server) as s:
        t0 = time.monotonic()
        assert _read_all(s, wait=4.0) == b""  # closed, without an answer
        assert time.monotonic() - t0 < 3.0


def test_slowloris_headers_get_408_and_close(server: PredictorHTTPServer) -> None:
    with _connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        for i in range(12):  # one header line every 0.25 s: each recv is quick, the request never ends
            time.sleep(0.25)
            try:
                s.sendall(f"X-Slow-{i}: y\r\n".encode())
            except OSError:
                break
        code, body = _status_and_json(_read_all(s))
        assert code == 408 and "not complete within 1s" in body["error"]
        assert time.monotonic() - t0 < 3.5


def test_slow_body_gets_408(server: PredictorHTTPServer) -> None:
    with _connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
        code, body = _status_and_json(_read_all(s))
        assert code == 408 and "request body" in body["error"]


@pytest.mark.parametrize(
    ("headers", "code", "match"),
    [
        ([f"X-Big-{i}: {'a' * 1000}" for i in range(64)], 431, "over 16384 bytes"),  # 64 KB (6 MB took)
        ([f"X-{i}: a" for i in range(65)], 431, "more than 64 header fields"),
    ],
)
def test_header_size_and_count_limits(service: PredictorService, headers: list[str], code: int, match: str) -> None:
    srv = _start(service, None)  # the default limits
    try:
        with _connect(srv) as s:
            s.sendall(("GET /healthz HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode())
            got, body = _status_and_json(_read_all(s))
            assert got == code and match in body["error"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_get_with_body_over_keepalive_is_answered_once(server: PredictorHTTPServer) -> None:
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled)
        raw = _read_all(s, wait=3.0)  # the server closes the idle connection after 1 s
    assert raw.count(b"HTTP/1.1 200") == 1, raw


def test_connections_are_bounded(service: PredictorService) -> None:
    srv = _start(service, Limits(max_connections=2, idle_timeout=5.0))
    try:
        held = [_connect(srv), _connect(srv)]
        for h in held:  # inside a request (not parked between requests): their slots are not given up
            h.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.2)
        with _connect(srv) as s:
            code, body = _status_and_json(_read_all(s, wait=2.0))
        assert code == 503 and "more than 2 connections" in body["error"]
        for h in held:
            h.close()
    finally:
        srv.shutdown()
        srv.server_close()


def _request(srv: PredictorHTTPServer, raw: bytes) -> tuple[int, dict[str, str]]:
    with _connect(srv) as s:
        s.sendall(raw)
        return _status_and_json(_read_all(s))


def test_huge_horizon_is_a_400(server: PredictorHTTPServer) -> None:
    code, body = _request(
        server, b"GET /v1/forecast?pool=pool-a&horizon=" + b"9" * 309 + b"m HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert code == 400 and "horizon too large" in body["error"]


@pytest.mark.parametrize(
    ("raw", "code", "match"),
    [
        (b"POST /v1/forecast HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "use GET"),
        (b"GARBAGE\r\n\r\n", 400, "Bad request syntax"),
        (b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "takes no request body"),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: 99999\r\n\r\n", 413, "over 4096 bytes"),
    ],
)
def test_clean_json_4xx(server: PredictorHTTPServer, raw: bytes, code: int, match: str) -> None:
    got, body = _request(server, raw)
    assert got == code and match in body["error"]


def test_client_disconnect_leaves_no_traceback(server: PredictorHTTPServer, capfd: pytest.CaptureFixture[str]) -> None:
    s = _connect(server)
    s.sendall(b"GET /healthz HTTP/1.1\r\n")  # half a request, then a reset
    time.sleep(0.2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(0.5)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
    with _connect(server) as c:  # and the server keeps serving
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_all(c).startswith(b"HTTP/1.1 200")


def test_64_concurrent_clients_no_reset_no_5xx(service: PredictorService) -> None:
    srv = _start(service, None)
    try:
        res = run_load("127.0.0.1", srv.server_address[1], "/v1/forecast?pool=pool-a", clients=64, requests=5)
    finally:
        srv.shutdown()
        srv.server_close()
    print("load:", res.summary())
    assert not res.errors and set(res.statuses) == {200} and sum(res.statuses.values()) == 64 * 5, res.summary()


def _wait_until_not_established(s: socket.socket, deadline_s: float) -> None:
    """Without reading: until the peer closed or reset the connection (TCP_INFO's state, Linux).

    A fixed sleep would race the server on a loaded machine: it may not have filled the send
    buffers (and started its write timeout) before the client starts draining.
    """
    established = 1
    end = time.monotonic() + deadline_s
    while s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == established:
        assert time.monotonic() < end, f"the server still holds, after {deadline_s:g}s, a client that does not read"
        time.sleep(0.05)


def test_a_client_that_never_reads_is_dropped(server: PredictorHTTPServer) -> None:
    with _connect(server) as c:  # one answer's size sizes the flood
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        one = len(_read_all(c))
    # pipelined /metrics requests whose answers need 4x the largest send buffer the kernel may
    # grow to (net.ipv4.tcp_wmem max), so the server's send must block whatever the answer's size
    wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    n = max(3000, 4 * wmem_max // one + 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.server_address[1]))
    with s:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # dropped already: checked below
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * n)
        _wait_until_not_established(s, deadline_s=120.0)  # the server's send blocked write_timeout: it gave up
        s.settimeout(5.0)
        raw, closed = b"", False
        while not closed:  # drain: EOF, or a reset (the server closed with our requests unread)
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            except TimeoutError:
                break
            raw += chunk
            closed = not chunk
    assert closed, "the server still holds the connection of a client that does not read"
    assert raw.count(b"HTTP/1.1 200") < n


def _park(srv: PredictorHTTPServer, source: str, n: int) -> list[socket.socket]:
    """``n`` keep-alive connections from ``source`` that each got one answer and now wait (the
    issue 22 §5 load: one request per 25 s keeps a connection inside the idle timeout)."""
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=5.0, source_address=(source, 0))
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(65536)
        except OSError:
            pass
        held.append(s)
    return held


def _forecasts(srv: PredictorHTTPServer, n: int) -> list[int]:
    codes = []
    for _ in range(n):
        with _connect(srv) as s:  # from 127.0.0.1
            s.sendall(b"GET /v1/forecast?pool=pool-a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = _read_all(s)
            codes.append(int(raw.split()[1]) if raw else 0)
    return codes


def test_one_client_cannot_take_every_slot(service: PredictorService) -> None:
    """Issue 22 §5: 256 parked keep-alive connections of one pod held every slot, and a
    legitimate client got 40/40 x 503; now one address holds at most its share."""
    srv = _start(service, None)  # the default limits: 256 connections
    held: list[socket.socket] = []
    try:
        held = _park(srv, "127.0.0.2", 256)
        codes = _forecasts(srv, 40)
        assert codes == [200] * 40, codes
        refused = srv.refused.labels("too_many_client_connections")._value.get()
        assert refused == 256 - srv.limits.max_connections_per_client
    finally:
        for s in held:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_parked_connections_give_their_slot_to_a_new_client(service: PredictorService) -> None:
    """Many addresses, each within its share, park every slot: a new client still gets answered,
    taking the slot of a parked connection (closed by the server; its client reconnects)."""
    srv = _start(service, None)
    held: list[socket.socket] = []
    try:
        for i in range(4):  # 4 x 64 = the default 256 slots, each address within its default share
            held += _park(srv, f"127.0.0.{i + 2}", 64)
        t0 = time.monotonic()
        codes = _forecasts(srv, 40)
        assert codes == [200] * 40, codes
        assert time.monotonic() - t0 < 20.0
        assert srv.refused.labels("parked_connection_evicted")._value.get() >= 1
    finally:
        for s in held:
            s.close()
        srv.shutdown()
        srv.server_close()
