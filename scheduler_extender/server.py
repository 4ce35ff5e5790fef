"""The HTTP surface: ``POST /filter``, ``/prioritize``, ``/preempt``; ``GET /healthz``, ``/readyz``;
``GET /metrics`` on a listener of its own.

I/O boundary: sockets in, bytes out; the API server only through the injected ``Suspender`` and
``PreemptorLookup`` (``kube.py``). :class:`Extender` translates wire JSON to plain data, calls
the pure policy and translates back; a bounded ``ThreadingHTTPServer`` carries it (HTTP/1.1
keep-alive, as Go's client uses) with the limits of :class:`ServerLimits` (body, headers, idle
and slow-request timeouts, connections, backlog). Client errors get a 4xx with a JSON
``{"Error": "..."}`` message; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import logging
import operator
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import pydantic_core
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from scheduler_extender import policy, wire
from scheduler_extender.cache import ClusterCache
from scheduler_extender.metrics import VERBS, ExtenderMetrics
from scheduler_extender.model import PodInfo, PodKind, PoolForecast, Snapshot

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = wire.max_body_bytes()


class ClientError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Suspender(Protocol):
    def request(self, pod: PodInfo, reason: str, preemptor: PodInfo) -> None:
        """Ask the node agent to suspend ``pod`` for ``preemptor`` (asynchronous; never raises)."""
        ...


class PreemptorLookup(Protocol):
    def get(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as the API server has it now (None: not found); raises when it cannot tell."""
        ...


class ForecastLookup(Protocol):
    def get(self, pool: str) -> PoolForecast | None: ...


class NoForecasts:
    """No forecast backend configured: every pool uses the conservative fallback."""

    def get(self, pool: str) -> PoolForecast | None:
        return None


def _validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False)[:5]:
        loc = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - len(parts)
    tail = f" (+{more} more)" if more > 0 else ""
    return "invalid request body: " + "; ".join(parts) + tail


_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii
_LOGGED_REFUSALS = 5  # log lines per preempt call (the metric counts them all)
_UID: Callable[[wire.MetaPod], str] = operator.itemgetter("UID")


def _dumps(obj: Any) -> bytes:
    """Compact JSON, encoded by pydantic-core (Rust; ~4x faster than the stdlib encoder on a
    500-node preempt reply). Strings it cannot encode as UTF-8 (lone surrogates from hostile
    ``\\ud800`` escapes) go through the stdlib, which escapes them."""
    try:
        return pydantic_core.to_json(obj)
    except ValueError:  # PydanticSerializationError
        return json.dumps(obj, separators=(",", ":")).encode()


def _pod_info(pod: wire.V1Pod, cfg: policy.PolicyConfig) -> PodInfo:
    meta = pod.metadata
    return policy.pod_info(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        labels=meta.labels,
        annotations=meta.annotations,
        owners=[(o.kind, o.name) for o in meta.owner_references or []],
        node=pod.spec.node_name,
        priority=pod.spec.priority,
        termination_grace_s=pod.spec.termination_grace_period_seconds,
        claim_count=len(pod.spec.resource_claims or []),
        cfg=cfg,
    )


class Extender:
    """Verb handlers: bytes in, (status, bytes) out."""

    def __init__(
        self,
        cache: ClusterCache,
        *,
        forecasts: ForecastLookup | None = None,
        suspender: Suspender | None = None,
        preemptors: PreemptorLookup | None = None,
        cfg: policy.PolicyConfig | None = None,
        metrics: ExtenderMetrics | None = None,
        ready: Callable[[], bool] | None = None,
        capture_dir: Path | None = None,
        capture_limit: int = 20,
    ) -> None:
        self.cache = cache
        self.forecasts: ForecastLookup = forecasts or NoForecasts()
        self.suspender = suspender
        self.preemptors = preemptors
        self.cfg = cfg or policy.PolicyConfig()
        self.metrics = metrics or ExtenderMetrics()
        self._ready = ready or (lambda: cache.synced)
        # Debug aid: keep the first bodies of each verb (how the golden test files were captured).
        self._capture_dir = capture_dir
        self._capture_limit = capture_limit
        self._captured: dict[str, int] = dict.fromkeys(VERBS, 0)
        self._capture_lock = threading.Lock()

    # --------------------------------------------------------------------------- helpers
    def ready(self) -> bool:
        return self._ready()

    def _windows(self, pod: PodInfo, snapshot: Snapshot) -> dict[str, policy.PoolOutlook]:
        lookups = {p: self.forecasts.get(p) for p in snapshot.pools}
        windows, fallbacks = policy.pool_outlooks(snapshot, lookups, pod.gpus, self.cfg)
        if fallbacks:
            self.metrics.forecast_fallback.inc(len(fallbacks))
        return windows

    @staticmethod
    def _parse_args(body: bytes) -> wire.ExtenderArgs:
        try:
            return wire.ExtenderArgs.model_validate_json(body)
        except ValidationError as err:
            raise ClientError(400, _validation_message(err)) from None

    @staticmethod
    def _names(args: wire.ExtenderArgs) -> list[str]:
        if args.NodeNames is not None:
            return args.NodeNames
        if args.Nodes is not None and args.Nodes.items is not None:
            out = []
            for i, item in enumerate(args.Nodes.items):
                meta = item.get("metadata")
                name = meta.get("name") if isinstance(meta, dict) else None
                if not isinstance(name, str):
                    raise ClientError(400, f"invalid request body: Nodes.items.{i}.metadata.name must be a string")
                out.append(name)
            return out
        return []

    # --------------------------------------------------------------------------- verbs
    def _node_call(
        self, body: bytes
    ) -> tuple[wire.ExtenderArgs, list[str], PodInfo, Snapshot, dict[str, policy.PoolOutlook]]:
        """What filter and prioritize both start from: the parsed call, its node names, the pod,
        the cache's snapshot and (RL workers only) each pool's idle window for the pod."""
        args = self._parse_args(body)
        names = self._names(args)
        pod = _pod_info(args.Pod, self.cfg)
        snapshot = self.cache.snapshot()
        windows = self._windows(pod, snapshot) if pod.kind is PodKind.RL else {}
        return args, names, pod, snapshot, windows

    def filter(self, body: bytes) -> bytes:
        args, names, pod, snapshot, windows = self._node_call(body)
        decision = policy.filter_nodes(pod, names, snapshot, windows, self.cfg)
        kind = pod.kind.value
        m = self.metrics.filter_nodes
        m.labels(kind, "passed").inc(len(decision.passed))
        if decision.failed:
            m.labels(kind, "failed").inc(len(decision.failed))
        if decision.unresolvable:
            m.labels(kind, "unresolvable").inc(len(decision.unresolvable))
        reply: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": decision.passed,
            "FailedNodes": decision.failed,
            "FailedAndUnresolvableNodes": decision.unresolvable,
            "Error": "",
        }
        if args.NodeNames is None and args.Nodes is not None:
            keep = set(decision.passed)
            items = [it for it in args.Nodes.items or [] if it["metadata"]["name"] in keep]
            reply["Nodes"] = {"metadata": args.Nodes.metadata or {}, "items": items}
        return _dumps(reply)

    def prioritize(self, body: bytes) -> bytes:
        _, names, pod, snapshot, windows = self._node_call(body)
        scores = policy.prioritize_nodes(pod, names, snapshot, windows, self.cfg)
        self.metrics.prioritize_calls.labels(pod.kind.value).inc()
        # A bare array of {"Host","Score"} (HostPriorityList), built directly: names are
        # JSON-escaped by the C encoder, so hostile names still give valid JSON.
        enc = _encode_str
        parts = [f'{{"Host":{enc(h)},"Score":{s}}}' for h, s in zip(names, scores, strict=True)]
        return ("[" + ",".join(parts) + "]").encode()

    @staticmethod
    def _candidates(args: wire.ExtenderPreemptionArgs) -> dict[str, tuple[list[str], int]]:
        """node → (victim UIDs, NumPDBViolations). Full victims are reduced to their UIDs: what a
        victim is comes from the watch-fed cache, never from the request body."""
        candidates: dict[str, tuple[list[str], int]] = {}
        meta = args.NodeNameToMetaVictims
        if meta is not None:
            uid_of = _UID
            for node, mv in meta.items():
                candidates[node] = (list(map(uid_of, mv.get("Pods") or ())), mv.get("NumPDBViolations", 0))
        elif args.NodeNameToVictims is not None:
            for node, v in args.NodeNameToVictims.items():
                candidates[node] = ([p.metadata.uid for p in v.Pods or []], v.NumPDBViolations)
        total = sum(len(u) for u, _ in candidates.values())
        if total > wire.MAX_VICTIMS_PER_CALL:
            raise ClientError(413, f"{total} victims exceed the limit of {wire.MAX_VICTIMS_PER_CALL} per call")
        return candidates

    def _preemptor(self, pod: wire.V1Pod) -> tuple[PodInfo | None, str]:
        """The preemptor as the API server knows it, and why it may not suspend anything ("" = it
        may): it must be a pending pod with the UID the call names; its priority is the API's."""
        meta = pod.metadata
        if self.preemptors is None:
            return None, "no preemptor lookup configured"
        try:
            found = self.preemptors.get(meta.namespace, meta.name)
        except Exception as err:  # the API server unreachable: suspend nothing (fail closed)
            return None, f"preemptor lookup failed: {err}"
        return found, policy.verify_preemptor(meta.uid, found)

    def preempt(self, body: bytes) -> bytes:
        try:
            args = wire.ExtenderPreemptionArgs.model_validate_json(body)
        except ValidationError as err:
            raise ClientError(400, _validation_message(err)) from None
        candidates = self._candidates(args)
        snapshot = self.cache.snapshot()
        rl_uids = snapshot.rl_pods if snapshot.rl_pods is not None else snapshot.pods
        needs_check = any(not rl_uids.keys().isdisjoint(u) for u, _ in candidates.values())
        found, why = self._preemptor(args.Pod) if needs_check else (None, "")
        priority = found.priority if found is not None and not why else None
        decision = policy.preempt(candidates, snapshot, priority)
        self._record_preempt(args.Pod, candidates, decision, why)
        if decision.suspend and found is not None:
            self._request_suspends(found, decision.suspend)
        meta = args.NodeNameToMetaVictims
        out: dict[str, Any] = {}
        for node, (uids, pdb) in decision.victims.items():
            given = meta.get(node) if meta is not None else None
            if given is not None and candidates[node][0] == uids:
                # unchanged: the request's own victim list goes back as it came
                out[node] = {"Pods": given.get("Pods") or [], "NumPDBViolations": pdb}
            else:
                out[node] = {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
        return _dumps({"NodeNameToMetaVictims": out})

    def _record_preempt(
        self,
        pod: wire.V1Pod,
        candidates: dict[str, tuple[list[str], int]],
        decision: policy.PreemptDecision,
        why: str,
    ) -> None:
        m = self.metrics
        total = sum(len(u) for u, _ in candidates.values())
        kept = sum(len(u) for u, _ in decision.victims.values())
        m.preempt_victims.labels("kept").inc(kept)
        m.preempt_victims.labels("suspended").inc(len(decision.suspend))
        m.preempt_victims.labels("unknown").inc(decision.kept_unknown)
        m.preempt_nodes.labels("kept").inc(len(decision.victims))
        m.preempt_nodes.labels("dropped").inc(len(candidates) - len(decision.victims))
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        for node, (reason, message) in sorted(decision.refused.items())[:_LOGGED_REFUSALS]:
            log.warning(
                "preemption victims not suspended",
                extra={"pod": key, "node": node, "reason": reason, "why": why or message},
            )
        # one increment per reason, not per node: 500 refused candidates cost 1.5 ms one by one
        for reason, count in Counter(reason for reason, _ in decision.refused.values()).items():
            m.preempt_refused.labels(reason).inc(count)
        if decision.suspend:
            log.info(
                "preemption turned into suspension",
                extra={
                    "pod": key,
                    "victims": total,
                    "suspend": [p.key for p in decision.suspend],
                    "nodes": sorted(decision.victims),
                },
            )

    def _request_suspends(self, preemptor: PodInfo, victims: list[PodInfo]) -> None:
        """Ask for each victim (a pod from the cache) to be suspended, once per victim."""
        for victim in victims:
            if victim.suspend_requested:
                continue
            self.cache.mark_suspend_requested(victim.uid)
            if self.suspender is None:
                self.metrics.suspend_requests.labels("error").inc()
                log.error("no suspender configured", extra={"pod": victim.key})
                continue
            self.suspender.request(
                victim,
                f"kube-scheduler proposed it as a preemption victim for "
                f"{preemptor.namespace}/{preemptor.name}; suspending instead of evicting",
                preemptor,
            )

    def handle(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """Dispatch one verb call; never raises."""
        start = time.perf_counter()
        try:
            if verb == "filter":
                out = 200, self.filter(body)
            elif verb == "prioritize":
                out = 200, self.prioritize(body)
            else:
                out = 200, self.preempt(body)
        except ClientError as err:
            out = err.code, _dumps({"Error": err.message})
        except RecursionError:
            out = 400, _dumps({"Error": "invalid request body: nested too deeply"})
        except Exception as err:
            log.exception("extender verb failed", extra={"verb": verb, "err": str(err)})
            out = 500, _dumps({"Error": f"internal error: {type(err).__name__}: {err}"})
        self.metrics.latency.labels(verb).observe(time.perf_counter() - start)
        self.metrics.requests.labels(verb, str(out[0])).inc()
        if self._capture_dir is not None:
            self._capture(verb, body, out)
        return out

    def _capture(self, verb: str, body: bytes, out: tuple[int, bytes]) -> None:
        assert self._capture_dir is not None
        with self._capture_lock:
            n = self._captured[verb]
            if n >= self._capture_limit:
                return
            self._captured[verb] = n + 1
        self._capture_dir.mkdir(parents=True, exist_ok=True)
        (self._capture_dir / f"{verb}-{n:03d}-request.json").write_bytes(body)
        (self._capture_dir / f"{verb}-{n:03d}-reply-{out[0]}.json").write_bytes(out[1])


ROUTE_VERBS = "verbs"  # POST /filter, /prioritize, /preempt
ROUTE_HEALTH = "health"  # GET /healthz, /readyz
ROUTE_METRICS = "metrics"  # GET /metrics
VERB_ROUTES = frozenset({ROUTE_VERBS, ROUTE_HEALTH})
METRICS_ROUTES = frozenset({ROUTE_METRICS, ROUTE_HEALTH})


@dataclass(frozen=True)
class ServerLimits:
    """What one client may cost the server. Memory is bounded by ``max_connections`` times
    (``max_header_bytes`` + ``max_body``); no connection is held longer than ``idle_timeout_s``
    between requests or ``read_timeout_s`` to send one request (slowloris)."""

    max_body: int = DEFAULT_MAX_BODY
    max_header_bytes: int = 16 * 1024
    max_headers: int = 64
    idle_timeout_s: float = 60.0  # longer than Go's idle keep-alive (90 s) is pointless, shorter is fine
    read_timeout_s: float = 10.0  # request line, headers and body
    max_connections: int = 128
    backlog: int = 128

    def __post_init__(self) -> None:
        for name in ("max_body", "max_header_bytes", "max_headers", "max_connections", "backlog"):
            if getattr(self, name) < 1:
                raise ValueError(f"server limit {name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "read_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"server limit {name} must be in (0, 3600] seconds, got {getattr(self, name)}")


class _HeaderBudget:
    """``rfile`` as the header parser sees it: at most ``budget`` bytes in all, else LineTooLong
    (which the handler turns into 431)."""

    def __init__(self, raw: Any, budget: int) -> None:
        self._raw = raw
        self._left = budget

    def readline(self, limit: int = -1) -> bytes:
        cap = self._left + 1 if limit < 0 else min(limit, self._left + 1)
        line: bytes = self._raw.readline(cap)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong("header block")
        return line


class _Deadlines:
    """One thread that closes connections past their deadline: idle keep-alive connections and
    requests that do not arrive in time (slow headers or body). ``socket.shutdown`` wakes the
    handler thread blocked in ``recv``, which then ends the connection."""

    def __init__(self, on_expired: Callable[[], None]) -> None:
        self._due: dict[socket.socket, float] = {}
        self._mu = threading.Lock()
        self._on_expired = on_expired
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="extender-http-deadlines", daemon=True).start()

    def arm(self, sock: socket.socket, seconds: float) -> None:
        with self._mu:
            self._due[sock] = time.monotonic() + seconds

    def disarm(self, sock: socket.socket) -> None:
        with self._mu:
            self._due.pop(sock, None)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._mu:
                late = [s for s, due in self._due.items() if due <= now]
                for sock in late:
                    del self._due[sock]
            for sock in late:
                self._on_expired()
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle + the client's delayed
    # ACK add ~40 ms to every keep-alive call.
    disable_nagle_algorithm = True
    server_version = "rose-scheduler-extender"
    extender: Extender
    limits: ServerLimits
    routes: frozenset[str]
    deadlines: _Deadlines
    verb_slots: threading.BoundedSemaphore

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr access logs
        return

    def setup(self) -> None:
        super().setup()
        # a backstop under the deadline thread: no single recv/send blocks longer than this
        self.connection.settimeout(self.limits.idle_timeout_s + self.limits.read_timeout_s)

    def handle_one_request(self) -> None:
        self.deadlines.arm(self.connection, self.limits.idle_timeout_s)
        try:
            super().handle_one_request()
        finally:
            self.deadlines.disarm(self.connection)

    def parse_request(self) -> bool:
        """The request line has arrived: the rest of the request must follow within the read
        timeout, in at most ``max_header_bytes`` of at most ``max_headers`` headers."""
        self.deadlines.arm(self.connection, self.limits.read_timeout_s)
        raw = self.rfile
        self.rfile = _HeaderBudget(raw, self.limits.max_header_bytes)  # type: ignore[assignment]
        try:
            ok = super().parse_request()
        finally:
            self.rfile = raw
        if ok and len(self.headers) > self.limits.max_headers:
            self.send_error(431, f"more than {self.limits.max_headers} headers")
            return False
        return ok

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error the stdlib raises (bad request line, headers too large...) as JSON, and the
        connection closed: what follows a malformed request cannot be trusted."""
        reason = "headers-too-large" if code in (413, 414, 431) else "bad-request"
        self.extender.metrics.http_rejected.labels(reason).inc()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._send(code, _dumps({"Error": message or self.responses.get(code, ("error",))[0]}))

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _verb(self) -> str | None:
        if ROUTE_VERBS not in self.routes:
            return None
        path = self.path.split("?", 1)[0].rstrip("/")
        last = path.rsplit("/", 1)[-1]
        return last if last in VERBS else None

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering an error (and closing the connection)."""
        length_raw = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length_raw is None:
            self.close_connection = True
            self._send(411, _dumps({"Error": "Content-Length required"}))
            return None
        try:
            length = int(length_raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._send(400, _dumps({"Error": f"bad Content-Length {length_raw!r}"}))
            return None
        if length > self.limits.max_body:
            self.extender.metrics.http_rejected.labels("body-too-large").inc()
            self.close_connection = True
            self._send(413, _dumps({"Error": f"body of {length} bytes exceeds the limit of {self.limits.max_body}"}))
            return None
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away (or its deadline passed) mid-body
            self.close_connection = True
            return None
        return body

    def do_POST(self) -> None:
        verb = self._verb()
        body = self._read_body()
        if body is None:
            return
        self.deadlines.disarm(self.connection)  # the request is in; the reply has no deadline
        if verb is None:
            self._send(404, _dumps({"Error": f"unknown path {self.path!r}; POST /filter, /prioritize or /preempt"}))
            return
        with self.verb_slots:
            code, out = self.extender.handle(verb, body)
        self._send(code, out)

    def do_GET(self) -> None:
        if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
            # a GET has no body: close after the answer, so its bytes are never read as a request
            self.close_connection = True
        self.deadlines.disarm(self.connection)
        path = self.path.split("?", 1)[0]
        if path == "/healthz" and ROUTE_HEALTH in self.routes:
            self._send(200, b"ok", "text/plain")
        elif path == "/readyz" and ROUTE_HEALTH in self.routes:
            ok = self.extender.ready()
            self._send(200 if ok else 503, b"ok" if ok else b"not ready: cache or forecasts", "text/plain")
        elif path == "/metrics" and ROUTE_METRICS in self.routes:
            self._update_gauges()
            self._send(200, generate_latest(self.extender.metrics.registry), CONTENT_TYPE_LATEST)
        elif self._verb() is not None:
            self._send(405, _dumps({"Error": "use POST"}))
        else:
            self._send(404, _dumps({"Error": f"unknown path {path!r}"}))

    def _update_gauges(self) -> None:
        m = self.extender.metrics
        for kind, count in self.extender.cache.counts().items():
            m.cache_objects.labels(kind).set(count)
        m.cache_synced.set(1 if self.extender.cache.synced else 0)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them: the accept loop waits for a
    free slot (new connections wait in the listen backlog, not reset). A client that goes away
    mid-call is logged as one line, not a traceback."""

    daemon_threads = True
    block_on_close = False
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        self.slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # reset, broken pipe, timed out: the client's side
            log.debug("client connection ended", extra={"client": str(client_address), "err": repr(err)})
            return
        log.error("http handler failed", extra={"client": str(client_address), "err": repr(err)})


def settle_heap() -> None:
    """Move every object alive now (the cache: tens of thousands of long-lived objects) into the
    collector's permanent generation, so full GC passes stop scanning them: they otherwise show
    up as tens of milliseconds of p99 latency on large clusters. Call it once the cache has
    synced, and now and then as it grows."""
    gc.freeze()


class ExtenderServer:
    """A running HTTP server around an :class:`Extender` (background thread), serving ``routes``
    (the verbs and health by default; ``METRICS_ROUTES`` for the metrics listener)."""

    def __init__(
        self,
        extender: Extender,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int | None = None,
        *,
        limits: ServerLimits | None = None,
        routes: frozenset[str] = VERB_ROUTES,
        verb_concurrency: int = 8,
    ) -> None:
        limits = limits or ServerLimits()
        if max_body is not None:
            limits = replace(limits, max_body=max_body)
        self.limits = limits
        self.deadlines = _Deadlines(lambda: extender.metrics.http_rejected.labels("timeout").inc())
        handler = type(
            "Handler",
            (_Handler,),
            {
                "extender": extender,
                "limits": limits,
                "routes": routes,
                "deadlines": self.deadlines,
                "verb_slots": threading.BoundedSemaphore(verb_concurrency),
            },
        )
        server_cls = type(
            "Server",
            (_BoundedServer,),
            {"request_queue_size": limits.backlog, "slots": threading.BoundedSemaphore(limits.max_connections)},
        )
        self.httpd = server_cls((host, port), handler)
        self.extender = extender
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.httpd.server_address[0]
        host_s = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host_s}:{self.port}"

    def start(self) -> ExtenderServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="extender-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.deadlines.stop()
