"""The trainer's rollout service and the rollout worker's client: stdlib HTTP/1.1, no torch.

The trainer runs :class:`RolloutService` (a thread in its process): a :class:`~rose_sdk.rollout_queue.PromptQueue`
and the current policy weights (an opaque, versioned blob: ``torch.save`` of a ``state_dict`` in
the integrations). Rollout workers use :class:`RolloutClient`: pull the weights, lease prompts,
return completions, release their leases. Endpoints (JSON bodies unless said):

=========================  ==================================================================
``GET  /v1/weights``       the current weights (``application/octet-stream``), its version in
                           ``X-Rose-Policy-Version``; 404 before the first publish
``GET  /v1/version``       ``{"version": v}`` (``null`` before the first publish)
``POST /v1/lease``         ``{"worker", "max", "wait_s"}`` → ``{"version", "done", "prompts":
                           [{"id", "text", "seed"}]}``; waits up to ``wait_s`` (≤ 30) for work;
                           ``done``: the trainer finished (the worker may exit)
``POST /v1/complete``      ``{"worker", "completions": [{"id", "version", "token_ids", "text"}]}``
                           → ``{"accepted", "duplicate", "stale"}``
``POST /v1/release``       ``{"worker"}`` → ``{"released": n}``
``GET  /v1/status``        ``{"version", "done", "outstanding", "leased": {worker: n}, "workers", "counters"}``
``GET  /metrics``          Prometheus text: the queue's counters, pulls, version, leased, pending
``GET  /healthz``          ``ok`` (no token)
=========================  ==================================================================

Why HTTP and not gRPC: the weights are one large blob (a real policy is gigabytes); gRPC caps a
message at 4 MiB by default and would need chunked streaming and stubs in the SDK's
distribution, while an HTTP body streams with a Content-Length and the standard library serves
it. The rest is five small JSON calls.

Security: every call but ``/healthz`` needs ``Authorization: Bearer <token>``, the job's shared
token (``ROSE_ROLLOUT_TOKEN``, or the file ``ROSE_ROLLOUT_TOKEN_FILE``: put it in a Secret),
compared in constant time; the service binds to one address (the pod IP in a cluster, loopback by
default), not to every interface. Bounded: request bodies (``max_body_bytes``, 4 MiB: 413 above),
concurrent connections (``max_connections``, 64: 503 above), idle connections (closed after
``idle_timeout_s``); the client refuses a weights body above ``max_weights_bytes``. The token
authenticates the job's own workers; it does not encrypt (the weights cross the pod network in
clear — put the pods in one namespace behind a NetworkPolicy, as ``docs/integrations.md`` says).

A connection's close requeues the leases taken over it (a killed worker's prompts return at
once); a worker that hangs with its connection open loses its leases at ``lease_s``.
"""

from __future__ import annotations

import hmac
import http.client
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rose_sdk.rollout_queue import Completion, Prompt, PromptQueue, QueueError, completion_from_json, prompt_seed

log = logging.getLogger("rose_sdk.rollout")

TOKEN_ENV = "ROSE_ROLLOUT_TOKEN"
TOKEN_FILE_ENV = "ROSE_ROLLOUT_TOKEN_FILE"
TRAINER_ADDR_ENV = "ROSE_TRAINER_ADDR"
MAX_WAIT_S = 30.0
VERSION_HEADER = "X-Rose-Policy-Version"


class RolloutError(RuntimeError):
    """A rollout-service call failed (the message says which and why)."""


def token_from_env(env: dict[str, str] | None = None) -> str:
    """The job's shared token: ``ROSE_ROLLOUT_TOKEN``, else the contents of ``ROSE_ROLLOUT_TOKEN_FILE``."""
    env = dict(os.environ) if env is None else env
    tok = env.get(TOKEN_ENV, "")
    if not tok and env.get(TOKEN_FILE_ENV):
        with open(env[TOKEN_FILE_ENV], encoding="utf-8") as f:
            tok = f.read().strip()
    if not tok:
        raise RolloutError(f"no rollout token: set {TOKEN_ENV} or {TOKEN_FILE_ENV} (the job's shared Secret)")
    return tok


def _check_token(token: str) -> str:
    if len(token) < 16:
        raise RolloutError("the rollout token must be at least 16 characters (a random per-job secret)")
    return token


@dataclass
class ServiceStats:
    weight_pulls: int = 0
    weight_bytes_served: int = 0
    refused_auth: int = 0
    refused_busy: int = 0
    refused_bad_request: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    service: RolloutService

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.service._slots.acquire(blocking=False):
            self.service.stats.refused_busy += 1
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            finally:
                self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a worker killed mid-request resets its connection: expected, its leases are requeued
        log.debug("rollout http: connection from %s ended with an error", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.service._slots.release()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        svc = self.server.service
        super().setup()
        self.connection.settimeout(svc.idle_timeout_s)  # an idle connection is closed (its leases requeued)
        self.conn_id = next(svc._conn_ids)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.service._disconnected(self.conn_id)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("rollout http request", extra={"line": format % args})

    # ------------------------------------------------------------------ plumbing

    def _send(
        self, code: int, body: bytes, ctype: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, json.dumps(obj).encode())

    def _error(self, code: int, msg: str) -> None:
        if code == 400:
            self.server.service.stats.refused_bad_request += 1
        self._json(code, {"error": msg})

    def _authorized(self) -> bool:
        svc = self.server.service
        got = self.headers.get("Authorization", "")
        if got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), svc._token.encode()):
            return True
        svc.stats.refused_auth += 1
        self._drain()
        self._error(401, "missing or wrong rollout token (Authorization: Bearer <ROSE_ROLLOUT_TOKEN>)")
        return False

    def _length(self) -> int:
        try:
            return int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return -1

    def _drain(self) -> None:
        n = self._length()
        if 0 < n <= self.server.service.max_body_bytes:
            self.rfile.read(n)
        elif n != 0:
            self.close_connection = True

    def _body(self) -> dict[str, Any] | None:
        n = self._length()
        if n < 0 or n > self.server.service.max_body_bytes:
            self.close_connection = True
            self._error(413, f"request body must be 0..{self.server.service.max_body_bytes} bytes, got {n}")
            return None
        try:
            obj = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            self._error(400, "request body is not JSON")
            return None
        if not isinstance(obj, dict):
            self._error(400, "request body must be a JSON object")
            return None
        worker = obj.get("worker")
        if not isinstance(worker, str) or not worker or len(worker) > 253:
            self._error(400, "the request needs 'worker': a non-empty string (at most 253 characters)")
            return None
        return obj

    # ------------------------------------------------------------------ endpoints

    def do_GET(self) -> None:
        svc = self.server.service
        if self.path == "/healthz":
            self._send(200, b"ok", "text/plain")
            return
        if not self._authorized():
            return
        if self.path == "/v1/version":
            self._json(200, {"version": svc.weights_version})
        elif self.path == "/v1/weights":
            version, blob = svc._weights_snapshot()
            if version is None:
                self._error(404, "no weights published yet")
                return
            svc._count_pull(len(blob))
            self._send(200, blob, "application/octet-stream", {VERSION_HEADER: str(version)})
        elif self.path == "/v1/status":
            self._json(200, svc.status())
        elif self.path == "/metrics":
            self._send(200, svc.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._error(404, f"no such endpoint: GET {self.path}")

    def do_POST(self) -> None:
        svc = self.server.service
        if not self._authorized():
            return
        if self.path not in ("/v1/lease", "/v1/complete", "/v1/release"):
            self._drain()
            self._error(404, f"no such endpoint: POST {self.path}")
            return
        req = self._body()
        if req is None:
            return
        worker = req["worker"]
        try:
            if self.path == "/v1/lease":
                n, wait_s = req.get("max", 1), req.get("wait_s", 0.0)
                if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1024:
                    raise QueueError("'max' must be an integer in 1..1024")
                if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or wait_s < 0:
                    raise QueueError("'wait_s' must be a number >= 0")
                version, prompts = svc._lease(worker, n, min(float(wait_s), MAX_WAIT_S), self.conn_id)
                body = {"version": version, "done": svc.done, "prompts": [p.__dict__ for p in prompts]}
                self._json(200, body)
            elif self.path == "/v1/complete":
                raw = req.get("completions")
                if not isinstance(raw, list):
                    raise QueueError("'completions' must be a list")
                self._json(200, svc._complete([completion_from_json(c, worker) for c in raw]))
            else:
                self._json(200, {"released": svc._release(worker)})
        except QueueError as e:
            self._error(400, str(e))


class RolloutService:
    """The trainer's side: a prompt queue with leases and the versioned policy weights, served over
    HTTP on ``host:port`` (``port=0``: any free one; :attr:`address` says which).

    ``job_seed``: the seed of every prompt's sample is :func:`prompt_seed` (job_seed, id, version).
    """

    def __init__(
        self,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        job_seed: int = 0,
        lease_s: float = 60.0,
        max_body_bytes: int = 4 << 20,
        max_connections: int = 64,
        idle_timeout_s: float = 300.0,
    ) -> None:
        self._token = _check_token(token)
        self.job_seed = int(job_seed)
        self.queue = PromptQueue(lease_s=lease_s)
        self.max_body_bytes = max_body_bytes
        self.idle_timeout_s = idle_timeout_s
        self.stats = ServiceStats()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._conn_ids = itertools.count(1)
        self._cv = threading.Condition()
        self._version: int | None = None
        self._blob = b""
        self._done = False
        self._workers_seen: dict[str, float] = {}
        self._conn_worker: dict[int, str] = {}  # open connections that leased, and their worker
        self._told_done: set[str] = set()  # workers that got a lease reply saying the trainer is done
        self.first_completion_at: dict[str, float] = {}  # worker → time.monotonic() of its first accepted sample
        self._httpd = _Server((host, port), _Handler)
        self._httpd.service = self
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> RolloutService:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rose-rollout-service", daemon=True)
        self._thread.start()
        log.info("rollout service on %s (lease %.0f s)", self.address, self.queue.lease_s)
        return self

    def finish(self) -> None:
        """The trainer is done: leases answer ``done`` from now on (workers exit)."""
        with self._cv:
            self._done = True
            self._cv.notify_all()

    @property
    def done(self) -> bool:
        return self._done

    def wait_drained(self, timeout: float = 30.0) -> bool:
        """After :meth:`finish`: wait until every worker with an open connection has been told that
        the trainer is done (so none sees its connection reset when the trainer exits). False at
        ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not set(self._conn_worker.values()) <= self._told_done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._cv:
            self._cv.notify_all()

    def __enter__(self) -> RolloutService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the trainer's calls

    @property
    def weights_version(self) -> int | None:
        with self._cv:
            return self._version

    def publish_weights(self, version: int, blob: bytes) -> None:
        """Make ``blob`` the policy weights of ``version`` (increasing). Refused while a round of an
        older version is unfinished: its workers would sample from weights it was not meant for."""
        with self._cv:
            if self._version is not None and version <= self._version:
                raise RolloutError(f"policy version must increase: {version} after {self._version}")
            open_rounds = [v for v in self.queue.outstanding() if v != version]
            if open_rounds:
                raise RolloutError(f"rounds {open_rounds} are unfinished: finish them before publishing {version}")
            self._version, self._blob = version, bytes(blob)
            self._cv.notify_all()
        log.info("policy version %d published (%d bytes)", version, len(blob))

    def submit_round(self, prompts: Sequence[tuple[str, str]]) -> int:
        """A round of ``(id, text)`` prompts for the current weights' version (its seeds from
        ``job_seed``); returns the version."""
        with self._cv:
            if self._version is None:
                raise RolloutError("publish the weights before submitting prompts")
            v = self._version
            self.queue.submit(v, [Prompt(pid, text, prompt_seed(self.job_seed, pid, v)) for pid, text in prompts])
            self._cv.notify_all()
        return v

    def wait_round(
        self, version: int, timeout: float | None = None, *, log_every_s: float = 30.0
    ) -> dict[str, Completion]:
        """Block until every prompt of the round is completed; its completions by prompt id.
        Logs what it waits for every ``log_every_s``; RolloutError at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        next_log = time.monotonic() + log_every_s
        with self._cv:
            while not self.queue.round_done(version):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    left = self.queue.outstanding().get(version, 0)
                    raise RolloutError(f"round {version}: {left} prompts not completed within {timeout} s")
                if now >= next_log:
                    log.warning(
                        "round %d: waiting for %d completions (%d leased; workers seen in the last minute: %d)",
                        version,
                        self.queue.outstanding().get(version, 0),
                        self.queue.leased_now,
                        self._active_workers(now),
                    )
                    next_log = now + log_every_s
                self.queue.expire(now)
                wait = min(1.0, next_log - now, *(() if deadline is None else (deadline - now,)))
                self._cv.wait(max(wait, 0.01))
            return self.queue.take(version)

    # ------------------------------------------------------------------ metrics

    def status(self) -> dict[str, Any]:
        """The queue now: version, done, outstanding prompts per version, leases per worker, counters."""
        with self._cv:
            leased: dict[str, int] = {}
            for ls in self.queue.leases():
                leased[ls.worker] = leased.get(ls.worker, 0) + 1
            return {
                "version": self._version,
                "done": self._done,
                "outstanding": {str(v): n for v, n in self.queue.outstanding().items()},
                "leased": leased,
                "workers": sorted(w for w, t in self._workers_seen.items() if time.monotonic() - t < 60.0),
                "counters": self.queue.counters.as_dict(),
                "weight_pulls": self.stats.weight_pulls,
            }

    def metrics_text(self) -> str:
        with self._cv:
            c = self.queue.counters.as_dict()
            lines = [
                "# HELP rose_rollout_prompts_total Prompts through the rollout queue, by outcome.",
                "# TYPE rose_rollout_prompts_total counter",
                *(f'rose_rollout_prompts_total{{outcome="{k}"}} {v}' for k, v in c.items()),
                "# HELP rose_rollout_weight_pulls_total Policy weights served to rollout workers.",
                "# TYPE rose_rollout_weight_pulls_total counter",
                f"rose_rollout_weight_pulls_total {self.stats.weight_pulls}",
                "# TYPE rose_rollout_weight_bytes_total counter",
                f"rose_rollout_weight_bytes_total {self.stats.weight_bytes_served}",
                "# HELP rose_rollout_refused_total Requests refused, by reason.",
                "# TYPE rose_rollout_refused_total counter",
                f'rose_rollout_refused_total{{reason="auth"}} {self.stats.refused_auth}',
                f'rose_rollout_refused_total{{reason="busy"}} {self.stats.refused_busy}',
                f'rose_rollout_refused_total{{reason="bad_request"}} {self.stats.refused_bad_request}',
                "# TYPE rose_rollout_policy_version gauge",
                f"rose_rollout_policy_version {-1 if self._version is None else self._version}",
                "# TYPE rose_rollout_leased gauge",
                f"rose_rollout_leased {self.queue.leased_now}",
                "# TYPE rose_rollout_pending gauge",
                f"rose_rollout_pending {self.queue.pending_now}",
                "# TYPE rose_rollout_workers gauge",
                f"rose_rollout_workers {self._active_workers(time.monotonic())}",
            ]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ the handler's calls

    def _active_workers(self, now: float) -> int:
        return sum(1 for t in self._workers_seen.values() if now - t < 60.0)

    def _weights_snapshot(self) -> tuple[int | None, bytes]:
        with self._cv:
            return self._version, self._blob

    def _count_pull(self, n: int) -> None:
        with self._cv:
            self.stats.weight_pulls += 1
            self.stats.weight_bytes_served += n

    def _lease(self, worker: str, n: int, wait_s: float, conn: int) -> tuple[int | None, list[Prompt]]:
        deadline = time.monotonic() + wait_s
        with self._cv:
            self._conn_worker[conn] = worker
            while True:
                now = time.monotonic()
                self._workers_seen[worker] = now
                got = self.queue.lease(worker, n, now, conn=conn)
                if got:
                    return got[0].version, [ls.prompt for ls in got]
                if now >= deadline or self._done:
                    if self._done:
                        self._told_done.add(worker)
                        self._cv.notify_all()
                    return self._version, []
                self._cv.wait(min(deadline - now, 1.0))

    def _complete(self, completions: list[Completion]) -> dict[str, int]:
        with self._cv:
            got = self.queue.complete(completions)
            if got["accepted"] and completions:
                self.first_completion_at.setdefault(completions[0].worker, time.monotonic())
            self._cv.notify_all()
        if got["duplicate"] or got["stale"]:
            log.info("completions refused: %d duplicate, %d stale", got["duplicate"], got["stale"])
        return got

    def _release(self, worker: str) -> int:
        with self._cv:
            n = self.queue.release(worker)
            self._cv.notify_all()
        if n:
            log.info("worker %s released %d leases", worker, n)
        return n

    def _disconnected(self, conn: int) -> None:
        with self._cv:
            n = self.queue.disconnect(conn)
            self._conn_worker.pop(conn, None)
            self._cv.notify_all()
        if n:
            log.info("connection %d closed: %d leases back in the queue", conn, n)


@dataclass(frozen=True)
class LeaseReply:
    """What a lease returns: the prompts' policy version, the prompts (maybe none), and whether the
    trainer has finished."""

    version: int | None
    prompts: list[Prompt]
    done: bool


class RolloutClient:
    """A rollout worker's side: one persistent HTTP/1.1 connection to the trainer's service at
    ``address`` (``host:port``; default ``ROSE_TRAINER_ADDR``), authenticated with ``token``
    (default :func:`token_from_env`). Not thread-safe: one per worker loop."""

    def __init__(
        self,
        address: str | None = None,
        *,
        worker: str,
        token: str | None = None,
        timeout_s: float = 60.0,
        max_weights_bytes: int = 64 << 30,
    ) -> None:
        address = address or os.environ.get(TRAINER_ADDR_ENV, "")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RolloutError(f"the trainer's address must be host:port (set {TRAINER_ADDR_ENV}), got {address!r}")
        self.host, self.port = host.strip("[]"), int(port)
        self.worker = worker
        self._token = _check_token(token if token is not None else token_from_env())
        self.timeout_s = timeout_s
        self.max_weights_bytes = max_weights_bytes
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        retry: bool = True,
    ) -> tuple[http.client.HTTPResponse, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout_s)
            else:
                self._conn.timeout = timeout or self.timeout_s
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(self._conn.timeout)
            try:
                self._conn.request(method, path, body=data, headers=headers)
                resp = self._conn.getresponse()
                n = int(resp.getheader("Content-Length") or 0)
                if path == "/v1/weights" and n > self.max_weights_bytes:
                    self.close()
                    raise RolloutError(f"the weights are {n} bytes, above max_weights_bytes={self.max_weights_bytes}")
                payload = resp.read(n) if n else resp.read()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt or not retry:
                    raise RolloutError(f"{method} {path} to {self.host}:{self.port}: {e}") from e
                continue
            if resp.status != 200:
                try:
                    msg = json.loads(payload).get("error", "")
                except ValueError:
                    msg = payload[:200].decode(errors="replace")
                raise RolloutError(f"{method} {path}: HTTP {resp.status}: {msg}")
            return resp, payload
        raise AssertionError("unreachable")

    def version(self) -> int | None:
        _, payload = self._request("GET", "/v1/version")
        v = json.loads(payload)["version"]
        return None if v is None else int(v)

    def weights(self) -> tuple[int, bytes]:
        """The current policy weights: ``(version, blob)``."""
        resp, payload = self._request("GET", "/v1/weights", timeout=max(self.timeout_s, 600.0))
        return int(resp.getheader(VERSION_HEADER) or -1), payload

    def lease(self, n: int = 1, wait_s: float = 5.0) -> LeaseReply:
        """Up to ``n`` prompts (one version), waiting up to ``wait_s`` for some. A failed
        connection is not retried here (its leases are requeued by the service)."""
        body = {"worker": self.worker, "max": n, "wait_s": wait_s}
        _, payload = self._request("POST", "/v1/lease", body, timeout=self.timeout_s + wait_s, retry=False)
        d = json.loads(payload)
        prompts = [Prompt(p["id"], p["text"], int(p["seed"])) for p in d["prompts"]]
        return LeaseReply(d["version"], prompts, bool(d.get("done", False)))

    def complete(self, version: int, results: Sequence[tuple[str, Sequence[int], str]]) -> dict[str, int]:
        """Return ``(prompt id, token ids, text)`` results for ``version``; the service's counts.
        Retried once on a broken connection (a repeat is refused as a duplicate, not counted)."""
        rows = [{"id": pid, "version": version, "token_ids": list(ids), "text": text} for pid, ids, text in results]
        _, payload = self._request("POST", "/v1/complete", {"worker": self.worker, "completions": rows})
        return {k: int(v) for k, v in json.loads(payload).items()}

    def release(self) -> int:
        """Give back every lease this worker holds."""
        _, payload = self._request("POST", "/v1/release", {"worker": self.worker})
        return int(json.loads(payload)["released"])

    def status(self) -> dict[str, Any]:
        _, payload = self._request("GET", "/v1/status")
        d: dict[str, Any] = json.loads(payload)
        return d

    def metrics(self) -> str:
        _, payload = self._request("GET", "/metrics")
        return payload.decode()


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (for tests and local runs)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
