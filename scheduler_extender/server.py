"""The HTTP surface: ``POST /filter``, ``/prioritize``, ``/preempt``; ``GET /healthz``, ``/readyz``;
``GET /metrics`` on a listener of its own.

I/O boundary: sockets in, bytes out; the API server only through the injected ``Suspender`` and
``PreemptorLookup`` (``kube.py``). :class:`Extender` translates wire JSON to plain data, calls
the pure policy and translates back; :mod:`rose_common.httpserver` carries it (HTTP/1.1
keep-alive, as Go's client uses; its overload rule, slow-client timeouts and size limits, here
named by :class:`ServerLimits`). Client errors get a 4xx with a JSON ``{"Error": "..."}``
message; the server keeps serving.
"""

from __future__ import annotations

import gc
import json
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pydantic_core
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from rose_common import httpserver
from scheduler_extender import policy, shares, wire
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
_HOST_PREFIXES_MAX = 65_536  # node names' encoded reply prefixes kept (a 5,000-node cluster: 5,000)
_SCORE_SUFFIX = tuple(f"{s}}}" for s in range(wire.MAX_EXTENDER_PRIORITY + 1))  # scores are clamped to 0..10
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


def _claim_names(pod: wire.V1Pod) -> list[str]:
    """The ResourceClaims a pod uses: named in its spec, or generated from a template (its status)."""
    out = [c.resource_claim_name for c in pod.spec.resource_claims or [] if c.resource_claim_name]
    out += [c.resource_claim_name for c in pod.status.resource_claim_statuses or [] if c.resource_claim_name]
    return out


def _pod_info(pod: wire.V1Pod, cfg: policy.PolicyConfig, cache: ClusterCache | None = None) -> PodInfo:
    """The pod as the policy sees it; an RL pod's GPU shares come from its claims in ``cache``."""
    info = _pod_fields(pod, cfg)
    if cache is not None and info.kind is PodKind.RL:
        claims = _claim_names(pod)
        requested = cache.share_requests(info.namespace, claims)
        if requested:
            return replace(info, shares=requested)
        if cache.claims_allocated(info.namespace, claims):
            return replace(info, claims_allocated=True)
    return info


def _pod_fields(pod: wire.V1Pod, cfg: policy.PolicyConfig) -> PodInfo:
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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self._clock = clock  # wall clock: a forecast reply's horizons count from its generated_at
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
        self._host_prefixes: dict[str, str] = {}

    # --------------------------------------------------------------------------- helpers
    def ready(self) -> bool:
        return self._ready()

    def _windows(self, pod: PodInfo, snapshot: Snapshot) -> dict[str, policy.PoolOutlook]:
        lookups = {p: self.forecasts.get(p) for p in snapshot.pools}
        now = self._clock()  # a reply's horizons count from its generated_at (rose_common.lending)
        if pod.shares:
            self.metrics.share_calls.inc()
            windows, fallbacks = shares.share_outlooks(snapshot, lookups, pod.shares, self.cfg, now)
        else:
            windows, fallbacks = policy.pool_outlooks(snapshot, lookups, pod.gpus, self.cfg, now)
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
        pod = _pod_info(args.Pod, self.cfg, self.cache)
        snapshot = self.cache.snapshot()
        windows = self._windows(pod, snapshot) if pod.kind is PodKind.RL else {}
        return args, names, pod, snapshot, windows

    def filter(self, body: bytes) -> bytes:
        args, names, pod, snapshot, windows = self._node_call(body)
        judge = shares.filter_nodes if pod.shares else policy.filter_nodes
        decision = judge(pod, names, snapshot, windows, self.cfg)
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
        score = shares.prioritize_nodes if pod.shares else policy.prioritize_nodes
        scores = score(pod, names, snapshot, windows, self.cfg)
        self.metrics.prioritize_calls.labels(pod.kind.value).inc()
        # A bare array of {"Host","Score"} (HostPriorityList), built directly: names are
        # JSON-escaped by the C encoder, so hostile names still give valid JSON. Each name's
        # '{"Host":"…","Score":' is kept (node names repeat in every call: 0.42 instead of 0.71 ms
        # for 5,000 names), at most _HOST_PREFIXES_MAX of them, all dropped when full.
        if len(self._host_prefixes) > _HOST_PREFIXES_MAX:
            self._host_prefixes = {}
        known = self._host_prefixes.get
        prefix = self._host_prefix
        parts = [(known(h) or prefix(h)) + _SCORE_SUFFIX[s] for h, s in zip(names, scores, strict=True)]
        return ("[" + ",".join(parts) + "]").encode()

    def _host_prefix(self, name: str) -> str:
        out = self._host_prefixes[name] = f'{{"Host":{_encode_str(name)},"Score":'
        return out

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
    """What one client may cost the server (the extender's names for :class:`httpserver.Limits`).
    Memory is bounded by ``max_connections`` times (``max_header_bytes`` + ``max_body``); no
    connection is held longer than ``idle_timeout_s`` between requests or ``read_timeout_s`` to
    send one request (slowloris)."""

    max_body: int = DEFAULT_MAX_BODY
    max_header_bytes: int = 16 * 1024
    max_headers: int = 64
    idle_timeout_s: float = 60.0  # longer than Go's idle keep-alive (90 s) is pointless, shorter is fine
    read_timeout_s: float = 10.0  # request line, headers and body
    max_connections: int = 128
    backlog: int = 128

    def kernel(self) -> httpserver.Limits:
        return httpserver.Limits(
            backlog=self.backlog,
            max_connections=self.max_connections,
            idle_timeout=self.idle_timeout_s,
            request_timeout=self.read_timeout_s,
            write_timeout=self.read_timeout_s,
            max_request_line=self.max_header_bytes,
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
            max_body_bytes=self.max_body,
        )

    def __post_init__(self) -> None:
        self.kernel()  # the kernel's checks, one line each


# the kernel's refusal reasons as rose_extender_http_rejected_total{reason} labels
_REJECTED = {
    "idle_timeout": "timeout",
    "slow_request": "timeout",
    "request_line_too_long": "headers-too-large",
    "headers_too_large": "headers-too-large",
    "too_many_headers": "headers-too-large",
    "body_too_large": "body-too-large",
    "too_many_connections": "overloaded",
    "too_many_client_connections": "overloaded",
    "parked_connection_evicted": "parked-evicted",
}


def _error(msg: str) -> bytes:
    return _dumps({"Error": msg})


def _routes(extender: Extender, routes: frozenset[str], verb_slots: threading.BoundedSemaphore) -> httpserver.Routes:
    """The extender's answers on the kernel: verbs by the path's last segment (kube-scheduler
    appends the verb to ``urlPrefix``), liveness, readiness (the cache and forecasts) and metrics."""
    table: dict[tuple[str, str], httpserver.Handler] = {}
    if ROUTE_HEALTH in routes:

        def ready() -> tuple[bool, str]:
            ok = extender.ready()
            return ok, "ok" if ok else "not ready: cache or forecasts"

        table.update(httpserver.probe_routes(healthy=lambda: (True, "ok"), ready=ready))
    if ROUTE_METRICS in routes:

        def metrics(_: httpserver.Request) -> httpserver.Reply:
            m = extender.metrics
            for kind, count in extender.cache.counts().items():
                m.cache_objects.labels(kind).set(count)
            m.cache_synced.set(1 if extender.cache.synced else 0)
            return httpserver.Reply(200, generate_latest(m.registry), CONTENT_TYPE_LATEST)

        table["GET", "/metrics"] = metrics

    def verbs(req: httpserver.Request) -> httpserver.Reply:
        last = req.path.rstrip("/").rsplit("/", 1)[-1]
        if ROUTE_VERBS not in routes or last not in VERBS:
            return httpserver.Reply(404, _error(f"unknown path {req.path!r}; POST /filter, /prioritize or /preempt"))
        if req.method != "POST":
            return httpserver.Reply(405, _error("use POST"), headers={"Allow": "POST"})
        with verb_slots:
            code, out = extender.handle(last, req.body)
        return httpserver.Reply(code, out)

    rejected = extender.metrics.http_rejected
    return httpserver.Routes(
        table,
        fallback=verbs,
        error_body=_error,
        on_refused=lambda reason: rejected.labels(_REJECTED.get(reason, "bad-request")).inc(),
    )


def settle_heap() -> None:
    """Move every object alive now (the cache: tens of thousands of long-lived objects) into the
    collector's permanent generation, so full GC passes stop scanning them: they otherwise show
    up as tens of milliseconds of p99 latency on large clusters. Call it once the cache has
    synced, and now and then as it grows."""
    gc.freeze()


class ExtenderServer:
    """A running :mod:`rose_common.httpserver` server around an :class:`Extender` (background
    thread), serving ``routes`` (the verbs and health by default; ``METRICS_ROUTES`` for the
    metrics listener)."""

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
        self.extender = extender
        table = _routes(extender, routes, threading.BoundedSemaphore(verb_concurrency))
        self.httpd = httpserver.BoundedServer((host, port), table, limits.kernel(), name="extender")

    @property
    def port(self) -> int:
        return self.httpd.port

    @property
    def url(self) -> str:
        return self.httpd.url

    def start(self) -> ExtenderServer:
        self.httpd.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.stop()
