"""The orchestrator's Prometheus metrics (issue 13 §6), in their own registry.

I/O boundary: none (in-memory counters; ``timeslice.server`` serves them on ``/metrics``).
Duty cycle per group is held time over the time since the group's first grant, updated at every
grant and release; the switch latency is split into suspend, restore and the orchestrator's own
grant overhead (queueing, store writes, wake-up: everything beyond data movement). Host DRAM
held: after each hand-over, the state of the job it suspended (the workers' state-bytes, as the
hand-over reports it) per group and job, and 0 for the job it restored.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SWITCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


@dataclass
class _Duty:
    first: float = 0.0
    held: float = 0.0
    since: float | None = None


@dataclass
class TimesliceMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.duty_cycle = Gauge(
            "rose_timeslice_duty_cycle", "held time / time since the first grant", ["group"], registry=r
        )
        self.held_seconds = Counter("rose_timeslice_held_seconds", "seconds the group was held", ["group"], registry=r)
        self.wait = Histogram(
            "rose_timeslice_wait_seconds",
            "Acquire queueing time until the grant",
            ["group", "job", "role"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.switch = Histogram(
            "rose_timeslice_switch_seconds",
            "hand-over latency by part",
            ["group", "part"],
            buckets=SWITCH_BUCKETS,
            registry=r,
        )
        self.bytes_moved = Counter("rose_timeslice_bytes_moved", "bytes suspended and restored", ["group"], registry=r)
        self.grants = Counter("rose_timeslice_grants", "grants", ["group", "kind"], registry=r)
        self.fencing_rejections = Counter(
            "rose_timeslice_fencing_rejections", "commands refused by fencing", ["group", "command"], registry=r
        )
        self.lease_expiries = Counter(
            "rose_timeslice_lease_expiries", "holders whose lease expired", ["group"], registry=r
        )
        self.max_hold_reached = Counter(
            "rose_timeslice_max_hold_reached", "holders that lost the group to --max-hold", ["group"], registry=r
        )
        self.refusals = Counter(
            "rose_timeslice_refusals",
            "calls refused before they reached a group, by reason",
            ["namespace", "reason"],
            registry=r,
        )
        self.handover_failures = Counter(
            "rose_timeslice_handover_failures", "hand-overs rolled back", ["group"], registry=r
        )
        self.host_state_bytes = Gauge(
            "rose_timeslice_host_state_bytes",
            "device state of a suspended group member held in host memory by its nodes",
            ["group", "job"],
            registry=r,
        )
        self.waiters = Gauge("rose_timeslice_waiters", "Acquire calls waiting", ["group"], registry=r)
        self.leader = Gauge("rose_timeslice_leader", "1 while this replica is the active one", registry=r)
        self._duty: dict[str, _Duty] = {}
        self._lock = threading.Lock()

    def held(self, group: str, now: float) -> None:
        """The group was just granted."""
        with self._lock:
            d = self._duty.setdefault(group, _Duty(first=now))
            if d.since is None:
                d.since = now
            self._update(group, d, now)

    def switched(self, group: str, out_job: str | None, in_job: str, suspended_bytes: int) -> None:
        """A hand-over settled: ``out_job``'s state (``suspended_bytes``) is in host memory, ``in_job``'s on devices."""
        if out_job:
            self.host_state_bytes.labels(group, out_job).set(suspended_bytes)
        self.host_state_bytes.labels(group, in_job).set(0)

    def released(self, group: str, now: float) -> None:
        """The group was just yielded, expired or lost."""
        with self._lock:
            d = self._duty.get(group)
            if d is None or d.since is None:
                return
            span = max(0.0, now - d.since)
            d.held += span
            d.since = None
            self.held_seconds.labels(group).inc(span)
            self._update(group, d, now)

    def _update(self, group: str, d: _Duty, now: float) -> None:
        open_span = now - d.since if d.since is not None else 0.0
        total = now - d.first
        self.duty_cycle.labels(group).set((d.held + open_span) / total if total > 0 else 1.0)
