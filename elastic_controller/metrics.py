"""Prometheus metrics of the controller (prefix ``rose_controller_``), every fixed label series pre-set to zero.

I/O boundary: none here (an in-memory registry); ``controller.py`` serves it over HTTP.
"""

from __future__ import annotations

from typing import Final, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from elastic_controller.planner import Forecast
from rose_common.elasticrljob import Phase

PHASES: Final = get_args(Phase)
RECLAIM_KINDS: Final = ("planned", "unplanned", "fallback")
OK_ERROR: Final = ("ok", "error")
INFORMER_KINDS: Final = ("ElasticRLJob", "Pod", "Node", "ResourceSlice")
LATENCY_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class ControllerMetrics:
    """One registry per controller instance."""

    def __init__(self, forecast_backend: str = "none") -> None:
        self.registry = r = CollectorRegistry()
        self.jobs = Gauge("rose_controller_jobs", "ElasticRLJobs by phase.", ["phase"], registry=r)
        self.job_gpus = Gauge("rose_controller_job_gpus", "GPUs of each job by state (active, suspended).",
                              ["job", "state"], registry=r)  # fmt: skip
        self.role_workers = Gauge("rose_controller_role_workers",
                                  "Workers of each role of a job with spec.roles (trainer, rollout) by state: "
                                  "active, suspended, desired (what the plan holds).",
                                  ["job", "role", "state"], registry=r)  # fmt: skip
        self.pool_gpus = Gauge("rose_controller_pool_gpus", "GPUs lent to ElasticRLJobs per pool by state.",
                               ["pool", "state"], registry=r)  # fmt: skip
        self.pool_capacity = Gauge("rose_controller_pool_capacity_gpus", "Physical GPUs per pool.", ["pool"],
                                   registry=r)  # fmt: skip
        self.reclaims = Counter("rose_controller_reclaims_total",
                                "Workers given back: planned (by the planner before serving needs the GPU), "
                                "unplanned (a suspend request by another owner, e.g. the extender), "
                                "fallback (checkpointed and evicted by the driver).", ["kind"], registry=r)  # fmt: skip
        self.reconcile_latency = Histogram("rose_controller_reconcile_duration_seconds",
                                           "One job reconcile.", buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.plan_latency = Histogram("rose_controller_plan_duration_seconds",
                                      "Time of one plan over all jobs (pure planner only).",
                                      buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.queue_depth = Gauge("rose_controller_queue_depth", "Job keys waiting for a reconcile worker.",
                                 registry=r)  # fmt: skip
        self.queue_idle = Gauge("rose_controller_queue_idle", "1 when no job key is queued or being reconciled.",
                                registry=r)  # fmt: skip
        self.reconciles = Counter("rose_controller_reconciles_total",
                                  "Job reconciles by result (ok, error, conflict: the status was computed from a "
                                  "stale view of the job and refused).", ["result"], registry=r)  # fmt: skip
        self.status_conflicts = Counter("rose_controller_status_conflicts_total",
                                        "Status writes the API server refused (409): computed from a job that had "
                                        "changed since; the reconcile stopped and runs again from a fresh view.",
                                        registry=r)  # fmt: skip
        self._serving_metrics(r)
        self.stale_targets = Counter("rose_controller_stale_targets_total", "Planner targets dropped unapplied: the "
                                     "job's workers changed after the plan's snapshot.", registry=r)  # fmt: skip
        self.forecast_fetch = Counter("rose_controller_forecast_fetch_total", "Forecast fetches by backend and result.",
                                      ["backend", "result"], registry=r)  # fmt: skip
        self.forecast_basis = Counter("rose_controller_forecast_basis_total",
                                      "Fetched forecasts by what the planner reads: risk (gpus_needed at --risk) "
                                      "or quantile (--quantile; also when the reply lacks the risk).",
                                      ["basis"], registry=r)  # fmt: skip
        self.forecast_missing = Counter("rose_controller_forecast_missing_total",
                                        "Pool plans made without a fresh forecast (lending in the pool frozen).",
                                        registry=r)  # fmt: skip
        self.forecast_stale = Gauge("rose_controller_forecast_stale",
                                    "1 while the pool has no fresh forecast: no grants and no planned reclaims "
                                    "there (serving still wins at the driver's prepare).", ["pool"],
                                    registry=r)  # fmt: skip
        self.watch_restarts = Counter("rose_controller_watch_restarts_total", "Watches that failed and relisted.",
                                      ["kind"], registry=r)  # fmt: skip
        self.leader = Gauge("rose_controller_leader", "1 while this replica holds the lease.", registry=r)
        self.pool_tainted = Gauge("rose_controller_pool_reclaim_tainted",
                                  "1 while a pool's lendable devices carry the rose.io/reclaim-planned NoSchedule "
                                  "taint (its forecast leaves nothing to lend within the reclaim lead).", ["pool"],
                                  registry=r)  # fmt: skip
        self.taint_rules = Counter("rose_controller_taint_rule_writes_total",
                                   "DeviceTaintRules written, by action (create, delete) and result.",
                                   ["action", "result"], registry=r)  # fmt: skip
        for action in ("create", "delete"):
            for res in OK_ERROR:
                self.taint_rules.labels(action, res)
        self.schedule_retries = Counter("rose_controller_schedule_retries_total",
                                        "Unschedulable worker pods nudged back into kube-scheduler's queue "
                                        "(rose.io/schedule-retry), by result.", ["result"], registry=r)  # fmt: skip
        for res in OK_ERROR:
            self.schedule_retries.labels(res)
        for phase in PHASES:
            self.jobs.labels(phase)
        for kind in RECLAIM_KINDS:
            self.reclaims.labels(kind)
        for res in (*OK_ERROR, "conflict"):
            self.reconciles.labels(res)
        for res in OK_ERROR:
            self.forecast_fetch.labels(forecast_backend, res)
        for basis in ("risk", "quantile"):
            self.forecast_basis.labels(basis)
        for kind in INFORMER_KINDS:
            self.watch_restarts.labels(kind)
        self._backend = forecast_backend

    def _serving_metrics(self, r: CollectorRegistry) -> None:
        """Workers serving blocks (``observe.serving_blocks``, soak T2's remainder), the GPUs lent claims
        hold per pool (``rose_common.lending``), workers removed for the scheduler's forecast refusal."""
        self.blocked_replaced = Counter("rose_controller_blocked_workers_replaced_total",
                                        "Workers deleted to be recreated elsewhere: their own lent claim was allocated "
                                        "on a GPU serving holds and they never ran there.", registry=r)  # fmt: skip
        self.serving_held = Gauge("rose_controller_serving_held_workers",
                                  "Workers whose lent claim is allocated on a GPU serving holds, never prepared "
                                  "there (a time-slice group's wait; others are replaced).", registry=r)  # fmt: skip
        self.pool_claimed = Gauge("rose_controller_pool_claimed_gpus",
                                  "GPUs per pool a new lent worker cannot have: those lent claims hold, whatever "
                                  "their worker's state (running, suspended, waiting for serving), as the last plan "
                                  "left them (rose_common.lending).", ["pool"], registry=r)  # fmt: skip
        self.forecast_refused = Counter("rose_controller_forecast_refused_workers_total",
                                        "Granted workers removed because kube-scheduler kept them Unschedulable "
                                        "for the extender's serving-forecast refusal, by pool (each starts that "
                                        "job's cool-down there).", ["pool"], registry=r)  # fmt: skip

    def on_forecast(self, forecast: Forecast) -> Forecast:
        """Count what a fetched forecast is read as (``risk``: the window bounds at ``--risk``)."""
        self.forecast_basis.labels("risk" if forecast.quantile.startswith("at risk") else "quantile").inc()
        return forecast

    def on_forecast_fetch(self, result: str) -> None:
        self.forecast_fetch.labels(self._backend, result).inc()
