"""Prometheus metrics of the suspend engine (``rose_`` prefix, base units, series pre-initialised)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dra_driver.suspend.model import BACKENDS, FALLBACK_REASONS
from dra_driver.suspend.spill import TIERS

_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DIRECTIONS = ("to_host", "to_device")
OPERATIONS = ("suspend", "resume")
RESULTS = ("ok", "failed", "fallback")
SPILL_DIRECTIONS = ("to_disk", "to_dram")
# no_answer / refused: a cooperative workload did not write its spill file; not_freed: it wrote a
# verified file but its process did not free its host copy (not counted as spilled).
SPILL_RESULTS = ("ok", "full", "corrupt", "failed", "no_answer", "refused", "not_freed")


class SuspendMetrics:
    """All engine metrics, registered in ``registry`` (a fresh one per engine in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.suspend_seconds = Histogram(
            "rose_suspend_duration_seconds",
            "Time to move a workload's device state into host memory, by backend.",
            ["backend"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.resume_seconds = Histogram(
            "rose_resume_duration_seconds",
            "Time to move a suspended workload's state back onto its GPU, by backend.",
            ["backend"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.moved_bytes = Counter(
            "rose_suspend_moved_bytes_total",
            "Bytes of workload state moved between device and host memory.",
            ["backend", "direction"],
            registry=r,
        )
        self.host_held_bytes = Gauge(
            "rose_suspend_host_memory_held_bytes",
            "Host memory held by suspended workload state on this node.",
            registry=r,
        )
        self.host_budget_bytes = Gauge(
            "rose_suspend_host_memory_budget_bytes",
            "Host memory this node may hold for suspended workload state.",
            registry=r,
        )
        self.host_state_bytes = Gauge(
            "rose_driver_host_state_bytes",
            "Suspended workload state held on this node, by tier (dram: host memory; disk: the spill directory).",
            ["tier"],
            registry=r,
        )
        self.host_state_budget_bytes = Gauge(
            "rose_driver_host_state_budget_bytes",
            "Budget for suspended workload state on this node, by tier (disk: 0 without a spill directory).",
            ["tier"],
            registry=r,
        )
        self.spills = Counter(
            "rose_suspend_spills_total",
            "Moves of suspended state between the DRAM and disk tiers, by direction and result.",
            ["direction", "result"],
            registry=r,
        )
        self.spill_seconds = Histogram(
            "rose_suspend_spill_duration_seconds",
            "Time to move one suspended state between the DRAM and disk tiers (write+fsync+verify, or read+verify).",
            ["direction"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.operations = Counter(
            "rose_suspend_operations_total",
            "Suspend and resume operations, by backend and result.",
            ["operation", "backend", "result"],
            registry=r,
        )
        self.fallbacks = Counter(
            "rose_suspend_fallbacks_total",
            "Suspends that took the durable-checkpoint-then-evict fallback, by reason.",
            ["reason"],
            registry=r,
        )
        self.workloads = Gauge(
            "rose_agent_registered_workloads",
            "Workloads registered with the node agent.",
            registry=r,
        )
        for b in BACKENDS:
            self.suspend_seconds.labels(b)
            self.resume_seconds.labels(b)
            for d in DIRECTIONS:
                self.moved_bytes.labels(b, d)
            for op in OPERATIONS:
                for res in RESULTS:
                    self.operations.labels(op, b, res)
        for op in OPERATIONS:
            for res in RESULTS:
                self.operations.labels(op, "none", res)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason)
        for tier in TIERS:
            self.host_state_bytes.labels(tier)
            self.host_state_budget_bytes.labels(tier)
        for direction in SPILL_DIRECTIONS:
            self.spill_seconds.labels(direction)
            for res in SPILL_RESULTS:
                self.spills.labels(direction, res)
