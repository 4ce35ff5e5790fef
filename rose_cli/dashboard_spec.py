"""The "SLO vs RL throughput" dashboard as data: its variables, rows, panels and PromQL.

Pure: no I/O. :mod:`rose_cli.dashboard` turns this table into Grafana JSON with the Grafana
Foundation SDK and renders previews from it; the unit tests parse every query.

Queries may use the dashboard variables (``$pool``, ``${slo_quantile}``, ``${ttft_metric}``,
``${e2e_metric}``, ``${queue_metric}``) and Grafana's ``$__rate_interval``; :func:`interpolate`
replaces them with concrete values, as Grafana does before it sends a query.

Serving SLO (vLLM's own metrics, per pool): the ``pool`` label comes from the scrape config in
``manifests/prometheus/scrape-configs.yaml`` (the serving pod's ``rose.io/gpu-pool`` label). The
metric names are variables, so another serving engine's histograms can be put in their place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "DEFAULTS",
    "PANELS",
    "ROWS",
    "VARIABLES",
    "Panel",
    "Target",
    "Variable",
    "all_queries",
    "interpolate",
]

UID = "rose-slo-vs-rl"
TITLE = "SLO vs RL throughput"
DESCRIPTION = (
    "ROSE: the serving SLO of each pool (the serving engine's own latency and queue) next to the RL "
    "throughput its lent GPUs carry, what was lent, and the signals that say something is broken."
)


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    default: str
    kind: str  # "textbox", "custom" (comma-separated choices) or "query" (label_values)
    choices: str = ""
    description: str = ""


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "pool",
        "Pool",
        "$__all",
        "query",
        "label_values(rose_driver_lent_gpus, pool)",
        "serving pools (the nodes' rose.io/gpu-pool label)",
    ),
    Variable("slo_quantile", "SLO quantile", "0.99", "custom", "0.99,0.95,0.9,0.5", "the latency quantile shown"),
    Variable(
        "ttft_metric",
        "TTFT histogram",
        "vllm:time_to_first_token_seconds",
        "textbox",
        "",
        "serving engine histogram of time to first token (without _bucket)",
    ),
    Variable(
        "e2e_metric",
        "Request latency histogram",
        "vllm:e2e_request_latency_seconds",
        "textbox",
        "",
        "serving engine histogram of whole-request latency (without _bucket)",
    ),
    Variable(
        "queue_metric",
        "Queue gauge",
        "vllm:num_requests_waiting",
        "textbox",
        "",
        "serving engine gauge of requests waiting to be scheduled",
    ),
)
DEFAULTS: dict[str, str] = {v.name: v.default for v in VARIABLES} | {"__rate_interval": "2m"}

P = 'pool=~"$pool"'
# the driver's histograms carry no pool: take it from its rose_driver_lent_gpus{pool} series
BY_POOL = "* on (instance) group_left (pool) group by (instance, pool) (rose_driver_lent_gpus{" + P + "})"
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    row: str = ""
    width: int = 12
    kind: str = "timeseries"


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _q(metric_var: str, extra: str = "") -> str:
    """``histogram_quantile`` of a serving-engine histogram named by a variable, per pool."""
    sel = P + extra
    return f"histogram_quantile(${{slo_quantile}}, sum by (le, pool) (rate(${{{metric_var}}}_bucket{{{sel}}}[{RATE}])))"


SLO_ROW = Row(
    "Serving SLO next to RL throughput",
    (
        Panel(
            "Serving SLO: time to first token (vLLM) and ROSE's wait at prepare",
            "s",
            (
                Target(_q("ttft_metric"), "TTFT q${slo_quantile} {{pool}}"),
                Target(
                    "histogram_quantile(${slo_quantile}, sum by (le, pool) "
                    f"(rate(rose_driver_serving_wait_seconds_bucket[{RATE}]) {BY_POOL}))",
                    "ROSE serving wait at prepare q${slo_quantile} {{pool}}",
                ),
                Target(
                    "histogram_quantile(${slo_quantile}, sum by (le, pool, phase) "
                    f"(rate(rose_driver_gpu_returned_seconds_bucket[{RATE}]) {BY_POOL}))",
                    "GPU returned to serving q${slo_quantile} {{pool}} {{phase}}",
                ),
            ),
            "The serving engine's own time-to-first-token per pool, how long a serving claim's "
            "prepare waited for a lent GPU's RL occupant to be suspended (the part ROSE adds), and "
            "the time from serving's need to the GPU observed free, by the phase that freed it "
            "(cooperative, enforced by the driver, fallback checkpoint-and-evict).",
        ),
        Panel(
            "RL throughput on lent GPUs: steps, samples, tokens per second",
            "ops",
            (
                Target(f"sum by (pool) (rate(rose_rl_steps_total{{{P}}}[{RATE}]))", "steps/s {{pool}}"),
                Target(f"sum by (pool) (rate(rose_rl_samples_total{{{P}}}[{RATE}]))", "samples/s {{pool}}"),
                Target(f"sum by (pool) (rate(rose_rl_tokens_total{{{P}}}[{RATE}]))", "tokens/s {{pool}}"),
            ),
            "What the RL workloads report through the node agent (rose_sdk), summed per pool.",
        ),
        Panel(
            "Serving SLO: request latency (vLLM) and queue",
            "s",
            (
                Target(_q("e2e_metric"), "e2e latency q${slo_quantile} {{pool}}"),
                Target(f"sum by (pool) (${{queue_metric}}{{{P}}})", "waiting requests {{pool}}"),
            ),
            "Whole-request latency and requests waiting, per pool (right axis: requests).",
        ),
        Panel(
            "GPUs lent to RL jobs and GPU-hours lent",
            "none",
            (
                Target(f"sum by (pool) (rose_driver_lent_gpus{{{P}}})", "lent now {{pool}}"),
                Target(
                    f"sum by (pool) (increase(rose_driver_lent_gpu_seconds_total{{{P}}}[1h])) / 3600",
                    "GPU-hours lent, last hour {{pool}}",
                ),
            ),
            "GPUs an unsuspended RL occupant holds (the drivers' rose_driver_lent_gpus), and their integral.",
        ),
        Panel(
            "Serving demand: busy serving GPUs vs forecast",
            "none",
            (
                Target(f"sum by (pool) (rose_serving_busy_gpus{{{P}}})", "busy serving GPUs {{pool}}"),
                Target(
                    f'max by (pool, horizon) (rose_forecast_demand{{{P}, quantile="0.9"}})',
                    "forecast q0.9 {{pool}} +{{horizon}}",
                ),
            ),
            "rose_serving_busy_gpus is the recording rule of manifests/prometheus/rules.yaml: the series the "
            "predictor forecasts.",
            width=24,
        ),
    ),
)

BROKEN_ROW = Row(
    "Is it broken?",
    (
        Panel(
            "Failed suspends",
            "ops",
            (
                Target(
                    f'sum by (outcome) (rate(rose_driver_occupant_suspend_total{{outcome=~"failed|timeout"}}[{RATE}]))',
                    "driver: {{outcome}}",
                ),
                Target(
                    f'sum by (operation) (rate(rose_suspend_operations_total{{result="failed"}}[{RATE}]))',
                    "engine: {{operation}} failed",
                ),
            ),
            "Suspends the driver gave up on (failed, timeout) and engine operations that failed.",
            width=6,
        ),
        Panel(
            "Fallbacks",
            "ops",
            (
                Target(f"sum(rate(rose_suspend_fallbacks_total[{RATE}]))", "checkpoint-and-evict"),
                Target(f"sum(rate(rose_extender_forecast_fallback_total[{RATE}]))", "extender: no forecast"),
                Target(f'sum(rate(rose_controller_reclaims_total{{kind="fallback"}}[{RATE}]))', "controller: evicted"),
            ),
            "Suspends that fell back to checkpoint-and-evict; scheduling decided without a forecast.",
            width=6,
        ),
        Panel(
            "Extender non-200 answers",
            "reqps",
            (
                Target(
                    f'sum by (verb) (rate(rose_extender_requests_total{{code!="200"}}[{RATE}]))',
                    "{{verb}} non-200",
                ),
                Target(f"sum by (reason) (rate(rose_extender_http_rejected_total[{RATE}]))", "rejected: {{reason}}"),
            ),
            "kube-scheduler calls the extender did not answer with 200, and requests refused before a verb.",
            width=6,
        ),
        Panel(
            "Predictor fit and ingest errors",
            "ops",
            (
                Target(
                    f'sum by (pool) (rate(rose_forecast_fits_total{{result="error"}}[{RATE}]))', "fit errors {{pool}}"
                ),
                Target(
                    f'sum by (pool) (rate(rose_forecast_ingest_total{{result="error"}}[{RATE}]))',
                    "ingest errors {{pool}}",
                ),
                Target("max by (pool) (rose_forecast_stale)", "stale {{pool}}"),
            ),
            "Model fits and Prometheus range queries that failed; stale = 1 while the pool is served a safe bound.",
            width=6,
        ),
    ),
)

CONTROLLER_ROW = Row(
    "ElasticRLJob controller",
    (
        Panel("Jobs by phase", "none", (Target("sum by (phase) (rose_controller_jobs)", "{{phase}}"),), width=6),
        Panel(
            "GPUs per job and pool: active / suspended",
            "none",
            (
                Target("sum by (job, state) (rose_controller_job_gpus)", "{{job}} {{state}}"),
                Target(f"sum by (pool, state) (rose_controller_pool_gpus{{{P}}})", "pool {{pool}} {{state}}"),
            ),
            width=6,
        ),
        Panel(
            "Reclaims by kind",
            "none",
            (Target("sum by (kind) (increase(rose_controller_reclaims_total[10m]))", "{{kind}} (10m)"),),
            "planned: the planner gave the GPU back before serving needed it; unplanned: a suspend request "
            "by another owner; fallback: checkpointed and evicted.",
            width=6,
        ),
        Panel(
            "Suspended GPU-seconds per job (last hour) and plan latency",
            "s",
            (
                Target(
                    'sum by (job) (sum_over_time(rose_controller_job_gpus{state="suspended"}[1h:1m])) * 60',
                    "{{job}} suspended GPU-s",
                ),
                Target(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(rose_controller_plan_duration_seconds_bucket[{RATE}])))",
                    "plan p99",
                ),
            ),
            width=6,
        ),
        Panel(
            "Workers per role: trainer / rollout (jobs with spec.roles)",
            "none",
            (
                Target(
                    'sum by (job, role, state) (rose_controller_role_workers{state!="desired"})',
                    "{{job}} {{role}} {{state}}",
                ),
            ),
            "Active and suspended workers of each role. The planner reclaims rollout workers first (removed "
            "above minWorkers, suspended below) and suspends the trainer last: a suspended trainer with "
            "active rollouts never shows here.",
            width=12,
        ),
        Panel(
            "Rollout workers: planned vs active",
            "none",
            (
                Target(
                    'sum by (job) (rose_controller_role_workers{role="rollout", state="desired"})', "{{job}} planned"
                ),
                Target('sum by (job) (rose_controller_role_workers{role="rollout", state="active"})', "{{job}} active"),
                Target(
                    'sum by (job) (rose_controller_role_workers{role="trainer", state="suspended"})',
                    "{{job}} trainer suspended",
                ),
            ),
            "What the plan holds for the rollouts against what runs (a gap: workers starting or being "
            "reclaimed), and the trainer's suspended workers.",
            width=12,
        ),
    ),
)

ENGINE_ROW = Row(
    "Suspend engine and extender",
    (
        Panel(
            "Suspend / resume duration p99 by backend",
            "s",
            (
                Target(
                    "histogram_quantile(0.99, sum by (le, backend) "
                    f"(rate(rose_suspend_duration_seconds_bucket[{RATE}])))",
                    "suspend {{backend}}",
                ),
                Target(
                    "histogram_quantile(0.99, sum by (le, backend) "
                    f"(rate(rose_resume_duration_seconds_bucket[{RATE}])))",
                    "resume {{backend}}",
                ),
            ),
            width=8,
        ),
        Panel(
            "Host memory held by suspended RL state",
            "bytes",
            (
                Target("sum(rose_suspend_host_memory_held_bytes)", "held"),
                Target("sum(rose_suspend_host_memory_budget_bytes)", "budget"),
            ),
            width=8,
        ),
        Panel(
            "Extender latency p99 per verb",
            "s",
            (
                Target(
                    "histogram_quantile(0.99, sum by (le, verb) "
                    f"(rate(rose_extender_request_duration_seconds_bucket[{RATE}])))",
                    "{{verb}}",
                ),
            ),
            width=8,
        ),
    ),
)


def _quantile(q: float, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[{RATE}])))"


TIMESLICE_ROW = Row(
    "Time-slicing (rose timeslice)",
    (
        Panel(
            "Duty cycle per time-slice group",
            "percentunit",
            (Target("max by (group) (rose_timeslice_duty_cycle)", "{{group}}"),),
            "held time over the time since the group's first grant (the orchestrator's leader)",
            width=8,
        ),
        Panel(
            "Acquire wait p95 per job and role",
            "s",
            (Target(_quantile(0.95, "rose_timeslice_wait_seconds", "group, job, role"), "{{job}} {{role}}"),),
            width=8,
        ),
        Panel(
            "Switch latency p50 / p95: suspend, restore, grant overhead",
            "s",
            (
                Target(_quantile(0.5, "rose_timeslice_switch_seconds", "part"), "p50 {{part}}"),
                Target(_quantile(0.95, "rose_timeslice_switch_seconds", "part"), "p95 {{part}}"),
            ),
            "grant overhead: the orchestrator's own time beyond moving state (goal p95 <= 50 ms)",
            width=8,
        ),
        Panel(
            "Host DRAM held by suspended group members; state moved",
            "bytes",
            (
                Target("sum by (group, job) (rose_timeslice_host_state_bytes)", "held {{job}}"),
                Target(f"sum by (group) (increase(rose_timeslice_bytes_moved_total[{RATE}]))", "moved {{group}}"),
            ),
            "held: the state of each member the last hand-over suspended, kept in its nodes' host memory",
            width=8,
        ),
        Panel(
            "Grants, fencing rejections, lease expiries, failed hand-overs (10m)",
            "none",
            (
                Target("sum by (kind) (increase(rose_timeslice_grants_total[10m]))", "grants {{kind}}"),
                Target(
                    "sum by (command) (increase(rose_timeslice_fencing_rejections_total[10m]))", "fenced {{command}}"
                ),
                Target("sum(increase(rose_timeslice_lease_expiries_total[10m]))", "lease expiries"),
                Target("sum(increase(rose_timeslice_handover_failures_total[10m]))", "hand-overs rolled back"),
            ),
            width=8,
        ),
        Panel(
            "RL steps and samples per hour per job",
            "none",
            (
                Target("sum by (namespace, job) (rose_rl_steps_per_hour)", "steps/h {{namespace}}/{{job}}"),
                Target("sum by (namespace, job) (rose_rl_samples_per_hour)", "samples/h {{namespace}}/{{job}}"),
            ),
            "from the workloads' own reports (rose_sdk, through the node agent); recording rules of "
            "manifests/prometheus/rules.yaml",
            width=8,
        ),
    ),
)

ROWS: tuple[Row, ...] = (SLO_ROW, BROKEN_ROW, CONTROLLER_ROW, ENGINE_ROW, TIMESLICE_ROW)
PANELS: tuple[Panel, ...] = tuple(p for row in ROWS for p in row.panels)

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def interpolate(expr: str, values: dict[str, str] | None = None) -> str:
    """``expr`` with every ``$name`` / ``${name}`` replaced (``$__all`` for a regex matcher: ``.*``)."""
    vals = DEFAULTS | (values or {})

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in vals:
            raise ValueError(f"query uses ${name}, which is not a dashboard variable: {expr}")
        value = vals[name]
        return ".*" if value == "$__all" else value

    return _VAR.sub(sub, expr)


def all_queries() -> list[tuple[str, str]]:
    """(panel title, raw expr) for every target of every panel."""
    return [(p.title, t.expr) for p in PANELS for t in p.targets]
