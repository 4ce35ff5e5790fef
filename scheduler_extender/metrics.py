"""Prometheus metrics of the extender (prefix ``rose_extender_``), every label series pre-set to zero."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler_extender.model import POD_KINDS

VERBS = ("filter", "prioritize", "preempt")
REFUSE_REASONS = ("preemptor-unverified", "not-outranked", "wrong-node", "victim-cap")
WITHDRAW_REASONS = ("preemptor-bound", "preemptor-gone", "ttl")
HTTP_REJECT_REASONS = ("body-too-large", "headers-too-large", "timeout", "bad-request")
CODES = ("200", "400", "404", "405", "411", "413", "500")
FILTER_RESULTS = ("passed", "failed", "unresolvable")
VICTIM_ACTIONS = ("kept", "suspended", "unknown")
NODE_RESULTS = ("kept", "dropped")
OK_ERROR = ("ok", "error")
CACHE_KINDS = ("Node", "Pod", "ResourceClaim", "ResourceSlice")
# Sub-millisecond resolution: the goal is p99 <= 5 ms per call.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
    1.0,
    2.0,
)


class ExtenderMetrics:
    """One registry per server instance (tests run several servers in one process)."""

    def __init__(self, forecast_backend: str = "none") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram(
            "rose_extender_request_duration_seconds",
            "Time to answer one extender call, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "rose_extender_requests_total",
            "Extender calls by verb and HTTP status.",
            ["verb", "code"],
            registry=r,
        )
        self.filter_nodes = Counter(
            "rose_extender_filter_nodes_total",
            "Filter decisions per node, by pod kind and result.",
            ["pod_kind", "result"],
            registry=r,
        )
        self.prioritize_calls = Counter(
            "rose_extender_prioritize_calls_total", "Prioritize calls by pod kind.", ["pod_kind"], registry=r
        )
        self.preempt_victims = Counter(
            "rose_extender_preempt_victims_total",
            "Preemption victims proposed by kube-scheduler, by what the extender did with them.",
            ["action"],
            registry=r,
        )
        self.preempt_nodes = Counter(
            "rose_extender_preempt_nodes_total",
            "Preemption candidate nodes kept or dropped by the extender.",
            ["result"],
            registry=r,
        )
        self.suspend_requests = Counter(
            "rose_extender_suspend_requests_total",
            "Suspend requests written to RL worker pods instead of eviction.",
            ["result"],
            registry=r,
        )
        self.preempt_refused = Counter(
            "rose_extender_preempt_refused_total",
            "Candidate nodes whose RL victims were not suspended (and the node dropped), by why: "
            "the preemptor is not a pending pod the API server knows, it does not outrank a victim, "
            "a victim is not on that node, or the per-call cap.",
            ["reason"],
            registry=r,
        )
        self.suspend_withdrawn = Counter(
            "rose_extender_suspend_withdrawn_total",
            "The extender's own suspend requests it removed, by why (preemptor bound, gone, TTL).",
            ["reason"],
            registry=r,
        )
        self.http_rejected = Counter(
            "rose_extender_http_rejected_total",
            "Connections or requests the HTTP server refused or closed, by why.",
            ["reason"],
            registry=r,
        )
        self.forecast_fallback = Counter(
            "rose_extender_forecast_fallback_total",
            "Pool decisions made with the conservative fallback rule because no fresh forecast was cached.",
            registry=r,
        )
        self.share_calls = Counter(
            "rose_extender_share_calls_total",
            "Filter and prioritize calls for RL pods whose claims request GPU shares (judged in shares).",
            registry=r,
        )
        self.forecast_fetch = Counter(
            "rose_extender_forecast_fetch_total",
            "Forecast fetches by backend and result.",
            ["backend", "result"],
            registry=r,
        )
        self.cache_objects = Gauge(
            "rose_extender_cache_objects", "Objects in the extender's watch cache.", ["kind"], registry=r
        )
        self.watch_restarts = Counter(
            "rose_extender_watch_restarts_total",
            "Watches that failed and were followed by a relist, by kind (a steady rise means the cache is stale).",
            ["kind"],
            registry=r,
        )
        self.cache_synced = Gauge(
            "rose_extender_cache_synced", "1 once every watched kind has been listed.", registry=r
        )
        for verb in VERBS:
            self.latency.labels(verb)
            for code in CODES:
                self.requests.labels(verb, code)
        for kind in POD_KINDS:
            self.prioritize_calls.labels(kind.value)
            for res in FILTER_RESULTS:
                self.filter_nodes.labels(kind.value, res)
        for action in VICTIM_ACTIONS:
            self.preempt_victims.labels(action)
        for res in NODE_RESULTS:
            self.preempt_nodes.labels(res)
        for reason in REFUSE_REASONS:
            self.preempt_refused.labels(reason)
        for reason in WITHDRAW_REASONS:
            self.suspend_withdrawn.labels(reason)
        for reason in HTTP_REJECT_REASONS:
            self.http_rejected.labels(reason)
        for res in OK_ERROR:
            self.suspend_requests.labels(res)
            self.forecast_fetch.labels(forecast_backend, res)
        for kind_name in CACHE_KINDS:
            self.cache_objects.labels(kind_name)
            self.watch_restarts.labels(kind_name)
        self._backend = forecast_backend

    def on_forecast_fetch(self, result: str) -> None:
        self.forecast_fetch.labels(self._backend, result).inc()
