"""The HTTP surface: ``POST /filter``, ``/prioritize``, ``/preempt``; ``GET /healthz``, ``/readyz``,
``/metrics``.

:class:`Extender` translates wire JSON to plain data, calls the pure policy and translates back;
the stdlib ``ThreadingHTTPServer`` carries it (HTTP/1.1 keep-alive, as Go's client uses). Client
errors get a 4xx with a JSON ``{"Error": "..."}`` message; the server keeps serving.
"""

from __future__ import annotations

import gc
import json
import logging
import operator
import threading
import time
from collections.abc import Callable
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

DEFAULT_MAX_BODY = 64 * 1024 * 1024


class ClientError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Suspender(Protocol):
    def request(self, pod: PodInfo, reason: str) -> None:
        """Ask the node agent to suspend ``pod`` (asynchronous; never raises)."""
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
        cfg: policy.PolicyConfig | None = None,
        metrics: ExtenderMetrics | None = None,
        ready: Callable[[], bool] | None = None,
        capture_dir: Path | None = None,
        capture_limit: int = 20,
    ) -> None:
        self.cache = cache
        self.forecasts: ForecastLookup = forecasts or NoForecasts()
        self.suspender = suspender
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

    def preempt(self, body: bytes) -> bytes:
        try:
            args = wire.ExtenderPreemptionArgs.model_validate_json(body)
        except ValidationError as err:
            raise ClientError(400, _validation_message(err)) from None
        preemptor = _pod_info(args.Pod, self.cfg)
        extra: dict[str, PodInfo] = {}
        candidates: dict[str, tuple[list[str], int]] = {}
        meta = args.NodeNameToMetaVictims
        if meta is not None:
            uid_of = _UID
            for node, mv in meta.items():
                candidates[node] = (list(map(uid_of, mv.get("Pods") or ())), mv.get("NumPDBViolations", 0))
        elif args.NodeNameToVictims is not None:
            for node, v in args.NodeNameToVictims.items():
                uids = []
                for p in v.Pods or []:
                    info = _pod_info(p, self.cfg)
                    extra[info.uid] = info
                    uids.append(info.uid)
                candidates[node] = (uids, v.NumPDBViolations)
        snapshot = self.cache.snapshot()
        decision = policy.preempt(candidates, snapshot, extra)
        m = self.metrics
        total = sum(len(u) for u, _ in candidates.values())
        kept = sum(len(u) for u, _ in decision.victims.values())
        m.preempt_victims.labels("kept").inc(kept)
        m.preempt_victims.labels("suspended").inc(len(decision.suspend))
        m.preempt_victims.labels("unknown").inc(decision.kept_unknown)
        m.preempt_nodes.labels("kept").inc(len(decision.victims))
        m.preempt_nodes.labels("dropped").inc(len(candidates) - len(decision.victims))
        if decision.suspend:
            log.info(
                "preemption turned into suspension",
                extra={
                    "pod": f"{preemptor.namespace}/{preemptor.name}",
                    "victims": total,
                    "suspend": [p.key for p in decision.suspend],
                    "nodes": sorted(decision.victims),
                },
            )
        for victim in decision.suspend:
            if victim.suspend_requested:
                continue
            self.cache.mark_suspend_requested(victim.uid)
            if self.suspender is None:
                m.suspend_requests.labels("error").inc()
                log.error("no suspender configured", extra={"pod": victim.key})
                continue
            self.suspender.request(
                victim,
                f"kube-scheduler proposed it as a preemption victim for "
                f"{preemptor.namespace}/{preemptor.name}; suspending instead of evicting",
            )
        out: dict[str, Any] = {}
        for node, (uids, pdb) in decision.victims.items():
            given = meta.get(node) if meta is not None else None
            if given is not None and candidates[node][0] == uids:
                # unchanged: the request's own victim list goes back as it came
                out[node] = {"Pods": given.get("Pods") or [], "NumPDBViolations": pdb}
            else:
                out[node] = {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
        return _dumps({"NodeNameToMetaVictims": out})

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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle + the client's delayed
    # ACK add ~40 ms to every keep-alive call.
    disable_nagle_algorithm = True
    server_version = "rose-scheduler-extender"
    extender: Extender
    max_body: int

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr access logs
        return

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _verb(self) -> str | None:
        path = self.path.split("?", 1)[0].rstrip("/")
        last = path.rsplit("/", 1)[-1]
        return last if last in VERBS else None

    def do_POST(self) -> None:
        verb = self._verb()
        length_raw = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length_raw is None:
            self.close_connection = True
            self._send(411, _dumps({"Error": "Content-Length required"}))
            return
        try:
            length = int(length_raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._send(400, _dumps({"Error": f"bad Content-Length {length_raw!r}"}))
            return
        if length > self.max_body:
            self.close_connection = True
            self._send(413, _dumps({"Error": f"body of {length} bytes exceeds the limit of {self.max_body}"}))
            return
        body = self.rfile.read(length)
        if verb is None:
            self._send(404, _dumps({"Error": f"unknown path {self.path!r}; POST /filter, /prioritize or /preempt"}))
            return
        code, out = self.extender.handle(verb, body)
        self._send(code, out)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok", "text/plain")
        elif path == "/readyz":
            ok = self.extender.ready()
            self._send(200 if ok else 503, b"ok" if ok else b"not ready: cache or forecasts", "text/plain")
        elif path == "/metrics":
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


def settle_heap() -> None:
    """Move every object alive now (the cache: tens of thousands of long-lived objects) into the
    collector's permanent generation, so full GC passes stop scanning them: they otherwise show
    up as tens of milliseconds of p99 latency on large clusters. Call it once the cache has
    synced, and now and then as it grows."""
    gc.freeze()


class ExtenderServer:
    """A running HTTP server around an :class:`Extender` (background thread)."""

    def __init__(
        self, extender: Extender, host: str = "127.0.0.1", port: int = 0, max_body: int = DEFAULT_MAX_BODY
    ) -> None:
        handler = type("Handler", (_Handler,), {"extender": extender, "max_body": max_body})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
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
