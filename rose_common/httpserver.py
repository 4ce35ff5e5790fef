"""The one bounded HTTP/1.1 server every ROSE component serves through (extender, predictor,
orchestrator readiness, controller and driver health and metrics).

I/O boundary: a listening socket and its connections, a thread per connection. What a component
answers is its :class:`Routes` (``(method, path)`` → handler, plus an optional fallback); what
``/healthz`` and ``/readyz`` mean is its own (:func:`probe_routes`); ``/metrics`` is its registry.

Bounded everywhere (:class:`Limits`):

- **Overload, one rule**: at most ``max_connections`` connections at once (and at most
  ``max_connections_per_client`` from one address). When every slot is taken, a new connection
  takes the slot of a *parked* one (a keep-alive connection waiting for its next request: the
  longest parked of the client holding the most), so clients that send a request now and then
  cannot hold the server; when none is parked, the new connection is answered ``503`` with
  ``Retry-After: 1`` and a JSON error, then closed — never queued without bound, never reset.
  The listen backlog (``backlog``) only absorbs a burst of connects between two accepts.
- **Slow clients**: a keep-alive connection idle for ``idle_timeout`` is closed; the request line,
  headers and body must arrive within ``request_timeout`` of the request's first byte, however
  slowly they drip (a whole-request deadline, not a per-``recv`` timeout): ``408`` and close; a
  client that does not read its answer within ``write_timeout`` is reset.
- **Sizes**: request line ``max_request_line`` (414), headers ``max_header_bytes`` and
  ``max_headers`` (431), body ``max_body_bytes`` (413, refused from its Content-Length before it
  is read); a chunked body is refused (400): every caller sends Content-Length.
- **Errors** are JSON (``error_body``; the extender's ``{"Error": …}``, else ``{"error": …}``) and
  close the connection after a malformed request; a client that goes away is a debug log line,
  never a traceback. Every refusal calls ``on_refused(reason)`` (reasons: :data:`REASONS`), which
  the component turns into its metric.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

log = logging.getLogger(__name__)

REASONS = (
    "too_many_connections",  # every slot busy, none parked: 503
    "too_many_client_connections",  # one address over its share: 503
    "parked_connection_evicted",  # a parked keep-alive connection gave its slot to a new one
    "idle_timeout",  # a keep-alive connection idle past idle_timeout: closed
    "write_timeout",  # a client that did not read its answer within write_timeout: reset
    "slow_request",  # request not complete within request_timeout: 408
    "request_line_too_long",  # 414
    "headers_too_large",  # 431
    "too_many_headers",  # 431
    "body_too_large",  # 413
    "body",  # bad Content-Length or Transfer-Encoding: 400
    "malformed",  # request line or version the parser refuses: 400 / 505
)


@dataclass(frozen=True)
class Limits:
    """Every bound the server enforces (seconds, bytes, counts)."""

    backlog: int = 128
    max_connections: int = 128
    max_connections_per_client: int = 0  # 0: max_connections (one client may use every slot)
    idle_timeout: float = 60.0
    request_timeout: float = 10.0
    write_timeout: float = 10.0
    max_request_line: int = 8192
    max_header_bytes: int = 16384
    max_headers: int = 64
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("backlog", "max_connections", "max_request_line", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"server limit {name} must be >= 1, got {getattr(self, name)}")
        if self.max_connections_per_client < 0 or self.max_body_bytes < 0:
            raise ValueError("server limits max_connections_per_client and max_body_bytes must be >= 0")
        for name in ("idle_timeout", "request_timeout", "write_timeout"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"server limit {name} must be in (0, 3600] seconds, got {getattr(self, name)}")

    @property
    def per_client(self) -> int:
        return self.max_connections_per_client or self.max_connections


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    query: str
    headers: Message
    body: bytes


@dataclass(frozen=True)
class Reply:
    code: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after this answer


Handler = Callable[[Request], Reply]


def json_error(key: str = "error") -> Callable[[str], bytes]:
    """An error body ``{key: message}``."""
    return lambda msg: json.dumps({key: msg}).encode()


def text(code: int, body: str) -> Reply:
    return Reply(code, body.encode(), "text/plain; charset=utf-8")


Check = Callable[[], tuple[bool, str]]


def probe_routes(
    *, healthy: Check | None = None, ready: Check | None = None, registry: CollectorRegistry | None = None
) -> dict[tuple[str, str], Handler]:
    """``GET /healthz`` (liveness), ``/readyz`` (readiness) and ``/metrics`` as the component defines
    them: each check says (ok, why); 200 with its text when ok, else 503. Omitted: not served."""
    routes: dict[tuple[str, str], Handler] = {}

    def probe(check: Check) -> Handler:
        def answer(_: Request) -> Reply:
            ok, why = check()
            return text(200 if ok else 503, why + "\n")

        return answer

    if healthy is not None:
        routes["GET", "/healthz"] = probe(healthy)
    if ready is not None:
        routes["GET", "/readyz"] = probe(ready)
    if registry is not None:
        routes["GET", "/metrics"] = lambda _: Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
    return routes


def refusals_counter(registry: CollectorRegistry, name: str) -> Counter:
    """``<name>_total{reason}``: every refusal of the server (the :data:`REASONS`), registered once
    per registry (a second server on the same registry counts into the same series)."""
    existing = getattr(registry, "_names_to_collectors", {}).get(name + "_total")
    if isinstance(existing, Counter):
        return existing
    helptext = "HTTP requests or connections the server refused, by reason (limits, timeouts, malformed)"
    return Counter(name, helptext, ["reason"], registry=registry)


def always_ok(_: Request | None = None) -> tuple[bool, str]:
    return True, "ok"


@dataclass(frozen=True)
class Routes:
    """What a server answers: exact ``(method, path)`` routes, then ``fallback`` (None → 404/405)."""

    table: Mapping[tuple[str, str], Handler]
    fallback: Handler | None = None
    error_body: Callable[[str], bytes] = field(default_factory=json_error)
    on_refused: Callable[[str], None] = field(default=lambda reason: None)

    def answer(self, req: Request) -> Reply:
        handler = self.table.get((req.method, req.path))
        if handler is not None:
            return handler(req)
        if self.fallback is not None:
            return self.fallback(req)
        allowed = sorted(m for m, p in self.table if p == req.path)
        if allowed:
            msg = f"method {req.method} not allowed on {req.path}; use {', '.join(allowed)}"
            return Reply(405, self.error_body(msg), headers={"Allow": ", ".join(allowed)})
        paths = sorted({p for _, p in self.table})
        return Reply(404, self.error_body(f"unknown path {req.path!r}; try {', '.join(paths)}"))


class _Refused(Exception):
    """A request the server will not serve: answered ``code`` with a JSON error, then closed."""

    def __init__(self, code: int, reason: str, msg: str) -> None:
        super().__init__(msg)
        self.code, self.reason, self.msg = code, reason, msg


class _ClientGone(Exception):
    """The client closed the connection or stayed idle past the keep-alive timeout."""


_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
# How long the accept loop waits for the thread of a connection whose peer has closed to end (it
# holds its slot until then). Milliseconds normally; 1 s was too short on a 2-core CI machine whose
# niced test lane shared the CPU with two others (1 of 300 reconnects refused). Live connections
# are never waited for: a flood still gets its 503 at once.
CLOSING_WAIT_S = 3.0


class _DeadlineReader:
    """Reads a request head and body from a socket with a whole-request deadline and size caps:
    the timeout of each ``recv`` is what is left of the deadline, so a client dripping one byte
    at a time cannot hold the connection past it."""

    def __init__(self, sock: socket.socket, limits: Limits, on_refused: Callable[[str], None]) -> None:
        self.sock = sock
        self.limits = limits
        self.buf = bytearray()
        self._on_refused = on_refused

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
            except TimeoutError:
                self._on_refused("idle_timeout")
                raise _ClientGone from None
            except OSError:
                raise _ClientGone from None
            if not chunk:
                raise _ClientGone
            self.buf += chunk
        del self.buf[: len(self.buf) - len(self.buf.lstrip(b"\r\n"))]

    def _fill(self, deadline: float, what: str) -> None:
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

    def read_body(self, length: int, deadline: float) -> bytes:
        while len(self.buf) < length:
            self._fill(deadline, "request body")
        body = bytes(self.buf[:length])
        del self.buf[:length]
        return body


class _Handler(BaseHTTPRequestHandler):
    server: BoundedServer
    protocol_version = "HTTP/1.1"
    # headers and body go out as separate writes: without TCP_NODELAY, Nagle + the client's
    # delayed ACK add ~40 ms to every keep-alive request
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.reader = _DeadlineReader(self.connection, self.server.limits, self.server.routes.on_refused)

    def handle_one_request(self) -> None:
        """One request: read it within the limits, answer it, or refuse it and close."""
        self.close_connection = True
        try:
            self._wait_parked()
            deadline = time.monotonic() + self.server.limits.request_timeout
            if not self._parse(self.reader.read_head(deadline)):
                return
            body = self._take_body(deadline)
        except _ClientGone:
            return
        except _Refused as r:
            self._refuse(r)
            return
        self.connection.settimeout(self.server.limits.write_timeout)
        url = urlsplit(self.path)
        req = Request(self.command, url.path, url.query, self.headers, body)
        try:
            reply = self.server.routes.answer(req)
        except Exception as err:  # a handler bug: a JSON 500, the server keeps serving
            log.exception("http handler failed", extra={"path": url.path, "err": repr(err)})
            reply = Reply(500, self.server.routes.error_body(f"internal error: {type(err).__name__}"))
        if reply.close or (self.command == "GET" and body):
            self.close_connection = True  # a GET with a body: answered once, then closed
        try:
            self._send(reply)
        except TimeoutError:
            self._drop_slow_reader()

    def _drop_slow_reader(self) -> None:
        """The client did not read its answer within ``write_timeout``: reset the connection (a
        graceful close would leave the unsent answer queued in the kernel for a reader that never
        comes)."""
        self.server.routes.on_refused("write_timeout")
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def _wait_parked(self) -> None:
        """Wait for the next request as a parked connection: a new client may take this slot
        (:meth:`BoundedServer.evict_parked` shuts the socket down) until its first byte."""
        if self.reader.buf.lstrip(b"\r\n"):
            self.reader.wait_for_request()  # a pipelined request is already here
            return
        self.server.park(self.connection)
        try:
            self.reader.wait_for_request()
        finally:
            if not self.server.unpark(self.connection):
                raise _ClientGone  # its slot went to another client

    def _parse(self, head: bytes) -> bool:
        """``BaseHTTPRequestHandler.parse_request`` on an already bounded head (False: answered)."""
        line, _, rest = head.partition(b"\n")
        self.raw_requestline = line + b"\n"
        self.rfile = BytesIO(rest)
        self.connection.settimeout(self.server.limits.write_timeout)  # parse errors are answered
        return self.parse_request()  # sets close_connection from the version and Connection header

    def _take_body(self, deadline: float) -> bytes:
        lim = self.server.limits
        if "Transfer-Encoding" in self.headers:
            raise _Refused(
                400,
                "body",
                "Transfer-Encoding is not accepted: this server takes no request body, or one with Content-Length",
            )
        raw = self.headers.get("Content-Length", "0").strip()
        if not raw.isdigit():
            raise _Refused(400, "body", f"bad Content-Length {raw[:40]!r}")
        if int(raw) > lim.max_body_bytes:
            raise _Refused(
                413, "body_too_large", f"request body of {raw} bytes exceeds the limit: over {lim.max_body_bytes} bytes"
            )
        return self.reader.read_body(int(raw), deadline)

    def _refuse(self, r: _Refused) -> None:
        self.server.routes.on_refused(r.reason)
        self.close_connection = True
        answer_and_close(
            self.connection, r.code, self.server.routes.error_body(r.msg), self.server.limits.write_timeout
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors found by ``parse_request`` (bad request line, version): JSON, then close."""
        self.server.routes.on_refused("malformed")
        self.close_connection = True
        self.request_version = "HTTP/1.1"  # a status line and headers even for an unparsable request line
        phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else "error"
        msg = f"{message or phrase}{': ' + explain if explain else ''}"
        self._send(Reply(code, self.server.routes.error_body(msg)))

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.code)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # access logs are metrics, not log lines


def _peer_closed(sock: socket.socket) -> bool:
    """The peer of ``sock`` has closed, or the socket is closed already: a peek at the raw stream
    (under TLS too: the plain socket's recv, not the TLS layer's) reads end-of-stream."""
    poller = select.poll()
    try:
        poller.register(sock.fileno(), select.POLLIN)
    except ValueError:  # fileno -1: closed by its thread
        return True
    if not poller.poll(0):
        return False  # nothing to read: alive (a recv on a socket with a timeout would wait)
    try:
        return socket.socket.recv(sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, TimeoutError):
        return False
    except OSError:
        return True


def answer_and_close(sock: socket.socket, code: int, body: bytes, timeout: float) -> None:
    """A complete HTTP/1.1 error answer written straight to the socket (best effort)."""
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


class BoundedServer(ThreadingHTTPServer):
    """The server: a thread per connection within :class:`Limits` (see the module docstring)."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self, address: tuple[str, int], routes: Routes, limits: Limits | None = None, name: str = "http"
    ) -> None:
        self.limits = limits or Limits()
        self.routes = routes
        self.name = name
        self.request_queue_size = self.limits.backlog  # listen(backlog) in server_activate
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self._conn_lock = threading.Lock()
        self._conn_gone = threading.Condition(self._conn_lock)  # notified when a connection's thread ends
        self._per_client: dict[str, int] = {}  # connections open per client address
        self._parked: dict[socket.socket, tuple[float, str]] = {}  # waiting for a request: since, client
        self._client_of: dict[socket.socket, str] = {}
        self._thread: threading.Thread | None = None
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.server_address[0]
        host_s = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host_s}:{self.port}"

    def start(self) -> BoundedServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close the listener; open connections end at their next deadline."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
        self.server_close()

    def connections(self) -> int:
        with self._conn_lock:
            return len(self._client_of)

    def _refuse_connection(self, request: Any, reason: str, msg: str) -> None:
        self.routes.on_refused(reason)
        answer_and_close(request, 503, self.routes.error_body(msg), 1.0)
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection within the overload rule (module docstring); beyond, 503."""
        client = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        lim = self.limits
        registered = self._register(request, client) or (
            self._await_closing(client) and self._register(request, client)
        )
        if not registered:
            msg = f"more than {lim.per_client} connections from {client}; reuse one (keep-alive) or retry"
            self._refuse_connection(request, "too_many_client_connections", msg)
            return
        if not self._take_slot(request):
            self._forget(request)
            self._refuse_connection(
                request, "too_many_connections", f"more than {lim.max_connections} connections; retry"
            )
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._forget(request)
            raise

    def _register(self, request: Any, client: str) -> bool:
        """Count ``request`` against its client's share; False when the share is full."""
        with self._conn_lock:
            if self._per_client.get(client, 0) >= self.limits.per_client:
                return False
            self._per_client[client] = self._per_client.get(client, 0) + 1
            self._client_of[request] = client
            return True

    def _take_slot(self, request: Any) -> bool:
        """A free slot for ``request``, else a parked connection's, else one a closing connection
        (another than ``request``) is about to free."""
        if self._slots.acquire(blocking=False):
            return True
        if self.evict_parked() or self._await_closing(None, skip=request):
            return self._slots.acquire(timeout=CLOSING_WAIT_S)
        return False

    def _await_closing(self, client: str | None, skip: Any = None) -> bool:
        """Connections (of ``client``; None: any; never ``skip``, the new connection itself, whose
        thread has not started) whose peer has already closed hold their slot
        until their thread notices: wait up to ``CLOSING_WAIT_S`` for those threads to end. A client that closes
        a connection and opens the next at once is not refused for the one it just closed; live
        connections are never waited for (False: none was closing)."""
        with self._conn_lock:
            mine = [s for s, c in self._client_of.items() if s is not skip and (client is None or c == client)]
        closing = [s for s in mine if _peer_closed(s)]
        deadline = time.monotonic() + CLOSING_WAIT_S
        with self._conn_gone:
            while any(s in self._client_of for s in closing) and (left := deadline - time.monotonic()) > 0:
                self._conn_gone.wait(left)
        return bool(closing)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)
            self._slots.release()

    def _forget(self, request: Any) -> None:
        with self._conn_lock:
            self._conn_gone.notify_all()
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
        self.routes.on_refused("parked_connection_evicted")
        with contextlib.suppress(OSError):  # its handler's recv returns: the thread ends, the slot frees
            victim.shutdown(socket.SHUT_RDWR)
        return True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is a debug line; anything else one error line, no traceback dump."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("client went away", extra={"client": str(client_address), "err": repr(exc)})
        else:
            log.error("http connection failed", extra={"client": str(client_address), "err": repr(exc)})


def serve(address: tuple[str, int], routes: Routes, limits: Limits | None = None, name: str = "http") -> BoundedServer:
    """Bind ``address`` and serve ``routes`` in a background thread (OSError when the port is taken)."""
    return BoundedServer(address, routes, limits, name).start()


def serve_probes(
    address: tuple[str, int],
    *,
    registry: CollectorRegistry,
    name: str,
    healthy: Check = always_ok,
    ready: Check | None = None,
    limits: Limits | None = None,
) -> BoundedServer:
    """A component's operations listener: ``/metrics`` from ``registry``, ``/healthz`` and
    ``/readyz`` as the component defines them (``ready`` omitted: as ``healthy``), refusals in
    ``rose_<name>_http_refused_total{reason}``; served in a background thread."""
    refused = refusals_counter(registry, f"rose_{name}_http_refused")
    table = probe_routes(healthy=healthy, ready=ready or healthy, registry=registry)
    return serve(address, Routes(table, on_refused=lambda r: refused.labels(r).inc()), limits or Limits(), name)
