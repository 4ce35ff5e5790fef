"""HTTP: ``GET /v1/forecast?pool=P&horizon=30m[,60m]``, ``/metrics``, ``/healthz``, ``/readyz``.

I/O boundary: the listening socket and its connections; requests only read the service's cached
forecast (no Prometheus call, no fit on the request path). Bad input gets a 4xx with a JSON
``{"error": ...}`` that says what to fix.

The server is sized for its API (small GET requests, no bodies) and bounded everywhere
(:class:`Limits`): a real listen backlog; at most ``max_connections`` connections at once, and at
most ``max_connections_per_client`` from one client address (one more is answered 503 and
closed); when every slot is taken, a new connection takes the slot of a parked one (a keep-alive
connection waiting for its next request; the longest parked of the client holding the most), so
connections that send one request now and then cannot hold the server (issue 22 §5); a
keep-alive connection idle for ``idle_timeout`` is closed; the
request line and headers must arrive within ``request_timeout`` (slowloris: 408 and close) and
fit ``max_header_bytes`` / ``max_headers`` (431 and close); a body is read and discarded up to
``max_body_bytes`` (413 and close beyond), so a GET with a body is answered once; a client
that does not read its answer for ``write_timeout`` is dropped. Every refusal counts in
``rose_predictor_http_refused_total{reason}``; a client that goes away is a debug log line,
never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from predictor.series import format_duration, parse_durations
from predictor.service import PredictorService

log = logging.getLogger("rose.predictor")


@dataclass(frozen=True)
class Limits:
    """Every bound the HTTP server enforces (seconds and bytes)."""

    backlog: int = 128
    max_connections: int = 256
    max_connections_per_client: int = 64  # one client address's share of max_connections
    idle_timeout: float = 30.0
    request_timeout: float = 10.0
    write_timeout: float = 10.0
    max_request_line: int = 4096
    max_header_bytes: int = 16384
    max_headers: int = 64
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


class _Refused(Exception):
    """A request the server will not serve: answered ``code`` with a JSON error, then closed."""

    def __init__(self, code: int, reason: str, msg: str) -> None:
        super().__init__(msg)
        self.code, self.reason, self.msg = code, reason, msg


class _ClientGone(Exception):
    """The client closed the connection or stayed idle past the keep-alive timeout."""


_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")


class _DeadlineReader:
    """Reads a request head and body from a socket with a whole-request deadline and size caps.

    A per-``recv`` timeout alone would let a slowloris client (one byte every few seconds)
    hold a connection forever; here the timeout of each ``recv`` is what is left of the deadline.
    """

    def __init__(self, sock: socket.socket, limits: Limits) -> None:
        self.sock = sock
        self.limits = limits
        self.buf = bytearray()

    def _recv(self, timeout: float) -> bytes:
        if timeout <= 0:
            raise TimeoutError
        self.sock.settimeout(timeout)
        return self.sock.recv(65536)

    def wait_for_request(self) -> None:
        """Block until a request starts (its first byte); _ClientGone on EOF or idle timeout."""
        while not self.buf.lstrip(b"\r\n"):
            try:
                chunk = self._recv(self.limits.idle_timeout)
            except (TimeoutError, ConnectionError, OSError):
                raise _ClientGone from None
            if not chunk:
                raise _ClientGone
            self.buf += chunk
        del self.buf[: len(self.buf) - len(self.buf.lstrip(b"\r\n"))]

    def _fill(self, deadline: float, what: str) -> None:
        """One more chunk of the request before ``deadline``: 408 when late, _ClientGone on EOF."""
        try:
            chunk = self._recv(deadline - time.monotonic())
        except TimeoutError:
            raise _Refused(
                408, "slow_request", f"{what} not complete within {self.limits.request_timeout:g}s"
            ) from None
        except OSError:
            raise _ClientGone from None
        if not chunk:
            raise _ClientGone
        self.buf += chunk

    def read_head(self, deadline: float) -> bytes:
        """The request line and headers (terminating blank line included), within the limits."""
        while (m := _END_OF_HEAD.search(self.buf)) is None:
            self._check_head_size(len(self.buf))
            self._fill(deadline, "request headers")
        self._check_head_size(m.end())
        head = bytes(self.buf[: m.end()])
        del self.buf[: m.end()]
        if head.count(b"\n") - 2 > self.limits.max_headers:
            raise _Refused(431, "too_many_headers", f"more than {self.limits.max_headers} header fields")
        return head

    def _check_head_size(self, size: int) -> None:
        lim = self.limits
        line_end = self.buf.find(b"\n")
        if (line_end < 0 and size > lim.max_request_line) or line_end > lim.max_request_line:
            raise _Refused(414, "request_line_too_long", f"request line over {lim.max_request_line} bytes")
        if size > lim.max_header_bytes:
            raise _Refused(431, "headers_too_large", f"request headers over {lim.max_header_bytes} bytes")

    def discard_body(self, length: int, deadline: float) -> None:
        """Read and drop ``length`` body bytes, so the next request on the connection starts clean."""
        while len(self.buf) < length:
            self._fill(deadline, "request body")
        del self.buf[:length]


class _Handler(BaseHTTPRequestHandler):
    server: PredictorHTTPServer
    protocol_version = "HTTP/1.1"
    # headers and body go out as separate writes: without TCP_NODELAY, Nagle + delayed ACK
    # add ~40 ms to every keep-alive request
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.reader = _DeadlineReader(self.connection, self.server.limits)

    def handle_one_request(self) -> None:
        """One request: read it within the limits, answer it, or refuse it and close."""
        self.close_connection = True
        try:
            self._wait_parked()
            deadline = time.monotonic() + self.server.limits.request_timeout
            if not self._parse(self.reader.read_head(deadline)):
                return
            self._take_body(deadline)
        except _ClientGone:
            return
        except _Refused as r:
            self._refuse(r)
            return
        self.connection.settimeout(self.server.limits.write_timeout)
        if self.command != "GET":
            self.close_connection = True
            self._send(405, _err(f"method {self.command} not allowed; use GET"), "application/json", Allow="GET")
            return
        self.do_GET()

    def _wait_parked(self) -> None:
        """Wait for the next request as a parked connection: a new client may take this slot
        (:meth:`PredictorHTTPServer.evict_parked` shuts the socket down) until its first byte."""
        if self.reader.buf.lstrip(b"\r\n"):
            self.reader.wait_for_request()  # a pipelined request is already here
            return
        self.server.park(self.connection)
        try:
            self.reader.wait_for_request()
        finally:
            if not self.server.unpark(self.connection):
                raise _ClientGone  # its slot went to another client (a keep-alive close race)

    def _parse(self, head: bytes) -> bool:
        """``BaseHTTPRequestHandler.parse_request`` on an already bounded head (False: answered)."""
        line, _, rest = head.partition(b"\n")
        self.raw_requestline = line + b"\n"
        self.rfile = BytesIO(rest)
        self.connection.settimeout(self.server.limits.write_timeout)  # parse errors are answered
        return self.parse_request()  # sets close_connection from the version and Connection header

    def _take_body(self, deadline: float) -> None:
        lim = self.server.limits
        if "Transfer-Encoding" in self.headers:
            raise _Refused(400, "body", "Transfer-Encoding is not accepted: this API takes no request body")
        raw = self.headers.get("Content-Length", "0").strip()
        if not raw.isdigit():
            raise _Refused(400, "body", f"bad Content-Length {raw[:40]!r}")
        if int(raw) > lim.max_body_bytes:
            raise _Refused(413, "body_too_large", f"request body over {lim.max_body_bytes} bytes; this API takes none")
        self.reader.discard_body(int(raw), deadline)

    def _refuse(self, r: _Refused) -> None:
        self.server.refused.labels(r.reason).inc()
        self.close_connection = True
        _answer_and_close(self.connection, r.code, r.msg, self.server.limits.write_timeout)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors found by ``parse_request`` (bad request line, version): JSON, then close."""
        self.server.refused.labels("malformed").inc()
        self.close_connection = True
        self.request_version = "HTTP/1.1"  # a status line and headers even for an unparsable request line
        phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else "error"
        self._send(code, _err(f"{message or phrase}{': ' + explain if explain else ''}"), "application/json")

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

    def _send(self, code: int, body: bytes, ctype: str, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # access logs are metrics (rose_forecast_requests_total), not log lines


def _answer_and_close(sock: socket.socket, code: int, msg: str, timeout: float) -> None:
    """A complete HTTP/1.1 error answer written straight to the socket (best effort)."""
    body = _err(msg)
    head = (
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if code == 503:
        head += "Retry-After: 1\r\n"
    try:
        sock.settimeout(timeout)
        sock.sendall(head.encode() + b"\r\n" + body)
    except OSError:
        pass


def _refused_counter(registry: CollectorRegistry) -> Counter:
    name = "rose_predictor_http_refused"
    existing = getattr(registry, "_names_to_collectors", {}).get(name + "_total")
    if isinstance(existing, Counter):
        return existing
    return Counter(
        name,
        "HTTP requests or connections the predictor refused, by reason (limits, timeouts, malformed)",
        ["reason"],
        registry=registry,
    )


class PredictorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], service: PredictorService, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.request_queue_size = self.limits.backlog  # listen(backlog) in server_activate
        self.service = service
        self.refused = _refused_counter(service.metrics.registry)
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self._conn_lock = threading.Lock()
        self._per_client: dict[str, int] = {}  # connections open per client address
        self._parked: dict[socket.socket, tuple[float, str]] = {}  # waiting for a request: since, client
        self._client_of: dict[socket.socket, str] = {}
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def _refuse_connection(self, request: Any, reason: str, msg: str) -> None:
        self.refused.labels(reason).inc()
        _answer_and_close(request, 503, msg, 1.0)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection: at most ``max_connections_per_client`` from one address, and
        at most ``max_connections`` in all, a parked connection giving its slot up for a new one;
        beyond, 503 and close."""
        client = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        lim = self.limits
        with self._conn_lock:
            if self._per_client.get(client, 0) >= lim.max_connections_per_client:
                full = True
            else:
                full = False
                self._per_client[client] = self._per_client.get(client, 0) + 1
                self._client_of[request] = client
        if full:
            self._refuse_connection(request, "too_many_client_connections",
                                    f"more than {lim.max_connections_per_client} connections from {client}; "
                                    "reuse one (keep-alive) or retry")  # fmt: skip
            return
        if not self._slots.acquire(blocking=False) and not (self.evict_parked() and self._slots.acquire(timeout=1.0)):
            self._forget(request)
            self._refuse_connection(request, "too_many_connections",
                                    f"more than {lim.max_connections} connections; retry")  # fmt: skip
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)
            self._slots.release()

    def _forget(self, request: Any) -> None:
        with self._conn_lock:
            self._parked.pop(request, None)
            client = self._client_of.pop(request, None)
            if client is not None:
                left = self._per_client.get(client, 1) - 1
                if left > 0:
                    self._per_client[client] = left
                else:
                    self._per_client.pop(client, None)

    def park(self, conn: socket.socket) -> None:
        """``conn`` waits for its next request: its slot may go to a new connection."""
        with self._conn_lock:
            self._parked[conn] = (time.monotonic(), self._client_of.get(conn, ""))

    def unpark(self, conn: socket.socket) -> bool:
        """``conn`` has a request (or is done); False when its slot was taken meanwhile."""
        with self._conn_lock:
            return self._parked.pop(conn, None) is not None

    def evict_parked(self) -> bool:
        """Close one parked connection (of the client with the most connections, the longest
        parked first) so a new connection gets its slot; False when none is parked."""
        with self._conn_lock:
            if not self._parked:
                return False
            victim = min(self._parked, key=lambda c: (-self._per_client.get(self._parked[c][1], 0), self._parked[c][0]))
            del self._parked[victim]
        self.refused.labels("parked_connection_evicted").inc()
        with contextlib.suppress(OSError):  # its handler's recv returns: the thread ends, the slot frees
            victim.shutdown(socket.SHUT_RDWR)
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is a debug line; anything else one JSON error line, no traceback dump."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("client went away", extra={"client": str(client_address), "err": repr(exc)})
        else:
            log.error("request handler failed", extra={"client": str(client_address), "err": repr(exc)})


def serve_in_thread(server: PredictorHTTPServer) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="predictor-http", daemon=True)
    t.start()
    log.info("serving forecasts", extra={"url": server.url})
    return t


__all__ = ["HTTPStatus", "Limits", "PredictorHTTPServer", "answer_forecast", "serve_in_thread"]
