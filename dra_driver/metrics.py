"""The driver's Prometheus metrics (``rose_driver_`` prefix, base units, series pre-set to zero).

Lending: ``rose_driver_lent_gpus{pool}`` (GPUs whose resident is an RL occupant that is not
suspended; a GPU lent in RL shares counts the fraction its running shares hold) and
``rose_driver_lent_gpu_seconds_total{pool}`` (that number integrated over time, up to the moment
of each scrape); ``pool`` is the node's ``rose.io/gpu-pool`` label.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

RESULTS = ("ok", "error")
RESIDENTS = ("none", "serving", "lent")
SUSPEND_OUTCOMES = ("suspended", "checkpoint_evict", "enforced", "failed", "timeout")
RETURN_PHASES = ("cooperative", "enforced", "fallback")  # dra_driver.enforce.PHASES
ENFORCE_METHODS = ("cuda-checkpoint", "kill")
ENFORCE_RESULTS = ("freed", "not_freed")
RESIZE_ACTIONS = ("shrink", "restore")
WATCH_KINDS = ("Pod", "ResourceSlice", "ResourceClaim")
SERVING_WAIT_MODES = ("prebind", "prepare")  # --serving-wait as resolved at start
BINDING_RESULTS = ("freed", "failed")
RESIZE_RESULTS = ("ok", "skipped", "error")
RL_LABELS = ("namespace", "job", "pool")
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class LentClock:
    """GPUs lent now and GPU-seconds lent so far (pure arithmetic on the clock values it is given)."""

    def __init__(self, now: float) -> None:
        self.count = 0.0
        self.seconds = 0.0
        self._t = now

    def advance(self, now: float) -> float:
        """GPU-seconds lent up to ``now``."""
        self.seconds += self.count * max(0.0, now - self._t)
        self._t = max(self._t, now)
        return self.seconds

    def set(self, count: float, now: float) -> None:
        """From ``now`` on, ``count`` GPUs are lent."""
        self.advance(now)
        self.count = count


class LentCollector(Collector):
    """Exports a :class:`LentClock` for one pool; the counter is brought up to date at each scrape."""

    def __init__(self, pool: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self._clock = clock
        self._lent = LentClock(clock())
        self._lock = threading.Lock()

    def set(self, count: float) -> None:
        with self._lock:
            self._lent.set(count, self._clock())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            seconds, count = self._lent.advance(self._clock()), self._lent.count
        gauge = GaugeMetricFamily("rose_driver_lent_gpus", "GPUs of this node lent to RL jobs now", labels=["pool"])
        gauge.add_metric([self.pool], count)
        counter = CounterMetricFamily(
            "rose_driver_lent_gpu_seconds", "GPU-seconds this node has lent to RL jobs", labels=["pool"]
        )
        counter.add_metric([self.pool], seconds)
        yield gauge
        yield counter


class DriverMetrics:
    def __init__(
        self,
        gpu_indexes: list[int],
        registry: CollectorRegistry | None = None,
        pool: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._resident: dict[int, str] = {}
        self._lent_of: dict[int, float] = {}
        self.lent = LentCollector(pool, clock)
        r.register(self.lent)
        self.prepare_total = Counter(
            "rose_driver_prepare", "NodePrepareResources claims handled, by result", ["result"], registry=r
        )
        self.unprepare_total = Counter(
            "rose_driver_unprepare",
            "NodeUnprepareResources claims handled, by result",
            ["result"],
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "rose_driver_prepare_duration_seconds", "Time to prepare one claim", buckets=_BUCKETS, registry=r
        )
        self.unprepare_seconds = Histogram(
            "rose_driver_unprepare_duration_seconds",
            "Time to unprepare one claim",
            buckets=_BUCKETS,
            registry=r,
        )
        self.serving_wait_seconds = Histogram(
            "rose_driver_serving_wait_seconds",
            "Time a serving claim's prepare waited for the lent occupant to be suspended",
            buckets=_BUCKETS,
            registry=r,
        )
        self.suspend_copy_wait_seconds = Histogram(
            "rose_driver_suspend_copy_wait_seconds",
            "Time serving waited past the grace period for a device-to-host copy that had already started",
            buckets=_BUCKETS,
            registry=r,
        )
        self.occupant_suspend_total = Counter(
            "rose_driver_occupant_suspend",
            "Lent occupants the driver asked the suspend engine to suspend, by outcome",
            ["outcome"],
            registry=r,
        )
        self.gpu_returned_seconds = Histogram(
            "rose_driver_gpu_returned_seconds",
            "From serving's need of a lent GPU to the device observed free, by the phase that freed it",
            ["phase"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.reclaim_enforced_total = Counter(
            "rose_driver_reclaim_enforced",
            "Lent GPUs the driver freed itself at the deadline (not observed free after the cooperative"
            " phase), by method and result",
            ["method", "result"],
            registry=r,
        )
        self.lent_evictions_total = Counter(
            "rose_driver_lent_evictions",
            "Lent workloads' pods the driver evicted to return a GPU to serving, by whether their state"
            " was lost or saved by an SDK durable checkpoint",
            ["state"],
            registry=r,
        )
        for state in ("lost", "saved"):
            self.lent_evictions_total.labels(state)
        self.serving_refused_occupied_total = Counter(
            "rose_driver_serving_refused_occupied",
            "Serving prepares refused because a lent occupant's state was still observed on the device",
            registry=r,
        )
        self.serving_on_occupied_total = Counter(
            "rose_driver_serving_on_occupied_device",
            "Serving prepares let onto a device still holding lent state (--allow-serving-on-occupied-device)",
            registry=r,
        )
        self.lent_prepare_refused_total = Counter(
            "rose_driver_lent_prepare_refused",
            "Prepares of a lent claim refused because serving holds its GPU (serving wins; the kubelet retries)",
            registry=r,
        )
        self.share_refused_total = Counter(
            "rose_driver_share_refused",
            "Prepares refused by the GPU-share accounting (a share beside a whole lent claim, or over the GPU)",
            registry=r,
        )
        self.share_over_limit_total = Counter(
            "rose_driver_share_over_limit",
            "Share claims observed holding more device memory than their allocation consumed (each crossing)",
            registry=r,
        )
        self.shares_over_limit = Gauge(
            "rose_driver_shares_over_limit", "Share claims now observed over their memory limit", registry=r
        )
        self.mps_daemons = Gauge(
            "rose_driver_mps_daemons",
            "CUDA MPS control daemons the driver runs (started or adopted) for GPU shares, one per shared GPU",
            registry=r,
        )
        self.mps_start_failures_total = Counter(
            "rose_driver_mps_start_failures",
            "MPS control daemons that did not start or answer (each refuses a share prepare; the kubelet retries)",
            registry=r,
        )
        self.mps_stop_failures_total = Counter(
            "rose_driver_mps_stop_failures",
            "MPS control daemons still answering after quit (the repair loop tries again)",
            registry=r,
        )
        self.share_claims = Gauge(
            "rose_driver_share_claims", "Share claims prepared on each physical GPU", ["gpu"], registry=r
        )
        self.share_memory_bytes = Gauge(
            "rose_driver_share_memory_bytes",
            "Memory limits of the share claims prepared on each physical GPU, summed",
            ["gpu"],
            registry=r,
        )
        self.share_compute_percent = Gauge(
            "rose_driver_share_compute_percent",
            "Compute percentages of the share claims prepared on each physical GPU, summed (MPS thread percentage)",
            ["gpu"],
            registry=r,
        )
        self.occupant_resume_total = Counter(
            "rose_driver_occupant_resume", "Lent occupants resumed, by result", ["result"], registry=r
        )
        self.residency = Gauge(
            "rose_driver_gpu_residency",
            "1 for the workload kind resident on each physical GPU (none, serving, lent)",
            ["gpu", "resident"],
            registry=r,
        )
        self.suspended_occupants = Gauge(
            "rose_driver_suspended_occupants", "Lent occupants currently suspended by this node", registry=r
        )
        self.suspended_bytes = Gauge(
            "rose_driver_suspended_state_bytes",
            "Bytes of suspended state the engine reported moving to host memory",
            registry=r,
        )
        self.slice_publish_total = Counter(
            "rose_driver_slice_publish",
            "ResourceSlice reconciles that wrote to the API, by result",
            ["result"],
            registry=r,
        )
        self.lendable_tainted = Gauge(
            "rose_driver_lendable_devices_tainted",
            "Lent devices (lendable and share) last published with the NoSchedule taint rose.io/serving-holds "
            "(serving holds their GPU)",
            registry=r,
        )
        self.gpus_tainted = Gauge(
            "rose_driver_gpus_tainted",
            "GPUs whose lent devices are tainted NoSchedule, by taint: rose.io/serving-holds (serving holds the GPU) "
            "and rose.io/reclaim-planned (the planner's DeviceTaintRule, carried onto its share devices)",
            ["taint"],
            registry=r,
        )
        self.registration_total = Counter(
            "rose_driver_registration",
            "Kubelet registration notifications, by result",
            ["result"],
            registry=r,
        )
        self.suspend_requests_total = Counter(
            "rose_driver_suspend_requests",
            "rose.io/suspend-request annotations acted on, by result",
            ["result"],
            registry=r,
        )
        self.fencing_rejections_total = Counter(
            "rose_driver_fencing_rejections",
            "Time-slice hand-over commands refused: their rose.io/fencing-token is older than the group's last",
            ["source"],  # "pod" (the suspend-request path) | "agent" (NodeControl)
            registry=r,
        )
        self.pod_resize_total = Counter(
            "rose_driver_pod_resize",
            "pods/resize of suspended RL workers' CPU (shrink on suspend, restore on resume), by result",
            ["action", "result"],
            registry=r,
        )
        self.watch_restarts_total = Counter(
            "rose_driver_watch_restarts",
            "List-watch restarts after a failed watch (410 Gone, a connection error), by kind",
            ["kind"],
            registry=r,
        )
        # Serving waits in the scheduler's PreBind, not in the kubelet's prepare (dra_driver/binding.py)
        self.serving_wait_mode = Gauge(
            "rose_driver_serving_wait_mode",
            "1 for where a serving pod waits for its GPU's lent occupant: prebind (the scheduler, binding"
            " conditions) or prepare (the kubelet's NodePrepareResources)",
            ["mode"],
            registry=r,
        )
        self.binding_wait_seconds = Histogram(
            "rose_driver_binding_wait_seconds",
            "From a serving claim's allocation seen by the driver to its binding condition reported"
            " (the serving pod's wait in the scheduler's PreBind)",
            buckets=_BUCKETS,
            registry=r,
        )
        self.binding_total = Counter(
            "rose_driver_binding_conditions",
            "Binding conditions the driver reported on serving claims, by result (freed: the scheduler"
            " binds; failed: it deallocates and reschedules the pod)",
            ["result"],
            registry=r,
        )
        # RL progress the workloads report through the node agent (dra_driver.agent.reports);
        # the names are a contract with the dashboard.
        self.rl_steps_total = Counter(
            "rose_rl_steps", "RL steps reported by the workloads, per job and pool", RL_LABELS, registry=r
        )
        self.rl_samples_total = Counter(
            "rose_rl_samples", "RL samples reported by the workloads, per job and pool", RL_LABELS, registry=r
        )
        self.rl_tokens_total = Counter(
            "rose_rl_tokens",
            "RL tokens reported by the workloads that count them, per job and pool",
            RL_LABELS,
            registry=r,
        )
        for kind in WATCH_KINDS:
            self.watch_restarts_total.labels(kind)
        for mode in SERVING_WAIT_MODES:
            self.serving_wait_mode.labels(mode).set(0)
        for res in BINDING_RESULTS:
            self.binding_total.labels(res)
        for source in ("pod", "agent"):
            self.fencing_rejections_total.labels(source)
        for action in RESIZE_ACTIONS:
            for res in RESIZE_RESULTS:
                self.pod_resize_total.labels(action, res)
        for res in RESULTS:
            self.prepare_total.labels(res)
            self.unprepare_total.labels(res)
            self.occupant_resume_total.labels(res)
            self.slice_publish_total.labels(res)
            self.registration_total.labels(res)
            self.suspend_requests_total.labels(res)
        for o in SUSPEND_OUTCOMES:
            self.occupant_suspend_total.labels(o)
        for phase in RETURN_PHASES:
            self.gpu_returned_seconds.labels(phase)
        for method in ENFORCE_METHODS:
            for res in ENFORCE_RESULTS:
                self.reclaim_enforced_total.labels(method, res)
        for i in gpu_indexes:
            for resident in RESIDENTS:
                self.residency.labels(str(i), resident).set(0)

    def set_serving_wait_mode(self, mode: str) -> None:
        for m in SERVING_WAIT_MODES:
            self.serving_wait_mode.labels(m).set(1 if m == mode else 0)

    def set_residency(self, gpu: int, resident: str, lent: float | None = None) -> None:
        """``lent``: how much of the GPU running RL work holds (1 when lent whole, the fraction of
        its running shares); by default 1 when ``resident`` is ``lent``, else 0."""
        for r in RESIDENTS:
            self.residency.labels(str(gpu), r).set(1 if r == resident else 0)
        self._resident[gpu] = resident
        self._lent_of[gpu] = (1.0 if resident == "lent" else 0.0) if lent is None else lent
        self.lent.set(sum(self._lent_of.values()))

    def count_lent_eviction(self, state: str) -> None:
        """One lent workload's pod evicted; ``state``: lost, or saved by its SDK durable checkpoint."""
        self.lent_evictions_total.labels(state).inc()
