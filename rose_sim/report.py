"""Run every policy on one demand series and report: a JSON-able dict, a markdown table, one PNG.

I/O boundary: :func:`simulate` and :func:`markdown` are pure; :func:`plot` writes the PNG
(matplotlib, imported there).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rose_sim import forecasters as fc
from rose_sim.engine import Policy, PoolInput, SimConfig, Simulation, default_policies
from rose_sim.inputs import CostModel, Demand, SimInputError, SimJob
from rose_sim.shares import share_lending
from timeslice.advise import advise

FORECASTERS = ("oracle", "baseline", "model")
HORIZONS_S = (600, 1800, 3600)  # the predictor's served horizons: 10, 30, 60 min
GOAL_WAITS_PER_DAY = 1.0
GOAL_DUTY_CYCLE = 0.85
GOAL_VS_EVICT = 3.0

COLUMNS = (
    ("rl_useful_gpu_hours", "RL useful GPU-h"),
    ("rl_steps", "RL steps"),
    ("pool_duty_cycle", "duty cycle"),
    ("serving_waits", "serving waits"),
    ("serving_wait_gpu_seconds", "wait GPU-s"),
    ("serving_wait_p99_s", "wait p99 s"),
    ("serving_waits_per_day", "waits/day"),
    ("suspends_per_day", "suspends/day"),
    ("evictions_per_day", "evictions/day"),
    ("rl_lost_gpu_hours", "lost GPU-h"),
    ("host_memory_peak_gib", "host GiB peak"),
    ("host_memory_fallbacks_per_day", "host fallbacks/day"),
)


def bounds_for(demand: Demand, cfg: SimConfig, forecasters: tuple[str, ...]) -> dict[str, fc.Bounds]:
    """Every forecaster's bounds over all ticks (persistence always: reactive and evict-restart use it)."""
    out = {"persistence": fc.persistence(demand.busy, HORIZONS_S, cfg.pool_gpus)}
    if "oracle" in forecasters:
        out["oracle"] = fc.oracle(demand.busy, HORIZONS_S, demand.tick_s)
    if "baseline" in forecasters:
        out["baseline"] = fc.baseline(
            demand.busy, HORIZONS_S, demand.tick_s, demand.history, cfg.pool_gpus, float(cfg.risk)
        )
    if "model" in forecasters:
        try:
            out["model"] = model_bounds(demand, cfg)
        except fc.ModelUnavailable as e:
            raise SimInputError(f"{e} (a longer --history, or a larger --risk)") from None
    return out


def model_bounds(demand: Demand, cfg: SimConfig, whole: bool = True) -> fc.Bounds:
    """The predictor's model's bounds over all ticks, refit every ``cfg.refit_every_s`` (``whole``:
    rounded up to whole GPUs, as the whole-GPU policies use them)."""
    obs = demand.busy if demand.observed is None else demand.observed
    every = max(1, cfg.refit_every_s // demand.tick_s)
    return fc.model(
        obs,
        demand.capacity_per_gpu,
        HORIZONS_S,
        demand.tick_s,
        demand.history,
        demand.start,
        float(cfg.risk),
        every,
        cfg.pool_gpus,
        whole=whole,
    )


def role_sizes(j: SimJob) -> dict[str, Any]:
    """A job with ``spec.roles``: each role's size as the user gave it (no pod template), else nothing."""
    roles = j.job.spec.roles
    if roles is None:
        return {}
    return {"roles": roles.model_dump(by_alias=True, exclude={"trainer": {"template"}, "rollout": {"template"}})}


def timeslice_groups(jobs: list[SimJob], cost: CostModel) -> dict[str, dict[str, Any]]:
    """Each declared time-slice group judged by ``timeslice.advise`` (its round model, called): the
    jobs' cycles (annotations) against one switch, the slowest suspend + resume of the group's
    state under the cost model. Advice only: the ticks do not run the group round-robin."""
    groups: dict[str, list[SimJob]] = {}
    for j in jobs:
        if j.job.spec.timeslice_group is not None:
            groups.setdefault(j.job.spec.timeslice_group, []).append(j)
    out: dict[str, dict[str, Any]] = {}
    for name, members in sorted(groups.items()):
        switch = max(cost.suspend_s(j.state_bytes, j.safe_wait_s) + cost.transfer_s(j.state_bytes) for j in members)
        keys = [j.key for j in members]
        if len(members) < 2:
            out[name] = {
                "jobs": keys,
                "switch_s": round(switch, 2),
                "pays": False,
                "reason": "one job in the group: nothing to share its GPUs with",
            }
            continue
        a = advise({j.key: [j.cycle_s] for j in members if j.cycle_s is not None}, switch)
        out[name] = {
            "jobs": keys,
            "switch_s": round(a.switch_s, 2),
            "round_s": round(a.round_s, 2),
            "shared_duty": round(a.shared_duty, 4),
            "best_solo_duty": round(a.best_solo_duty, 4),
            "pays": a.pays,
            "reason": a.reason,
        }
    return out


def goals(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, judged on the planned policy (not the oracle) that has an evict-and-restart
    twin (same planner and forecaster: about equal serving waits), else the one with the most useful
    GPU-hours against plain evict-restart."""
    planned = {k: v for k, v in results.items() if k.startswith("planned-") and k != "planned-oracle"}
    if not planned or "evict-restart" not in results:
        return {}
    twinned = {k: v for k, v in planned.items() if f"evict-{k}" in results} or planned
    name, r = max(twinned.items(), key=lambda kv: kv[1]["rl_useful_gpu_hours"])
    twin = f"evict-{name}"
    against = twin if twin in results else "evict-restart"
    ev = results[against]
    ratio = r["rl_useful_gpu_hours"] / ev["rl_useful_gpu_hours"] if ev["rl_useful_gpu_hours"] else float("inf")
    equal_waits = ev["serving_waits_per_day"] <= max(1.25 * r["serving_waits_per_day"], GOAL_WAITS_PER_DAY)
    return {
        "judged": name,
        "waits_per_day": {
            "goal": GOAL_WAITS_PER_DAY,
            "value": r["serving_waits_per_day"],
            "met": r["serving_waits_per_day"] <= GOAL_WAITS_PER_DAY,
        },
        "duty_cycle": {
            "goal": GOAL_DUTY_CYCLE,
            "value": r["pool_duty_cycle"],
            "met": r["pool_duty_cycle"] >= GOAL_DUTY_CYCLE,
        },
        "useful_vs_evict_restart": {
            "goal": GOAL_VS_EVICT,
            "value": round(ratio, 2),
            "against": against,
            "their_waits_per_day": ev["serving_waits_per_day"],
            "at_equal_waits": equal_waits,
            "met": ratio >= GOAL_VS_EVICT and equal_waits,
        },
    }


def simulate(
    demand: Demand,
    jobs: list[SimJob],
    cost: CostModel,
    cfg: SimConfig,
    forecasters: tuple[str, ...] = FORECASTERS,
    policies: tuple[Policy, ...] | None = None,
    more_pools: tuple[tuple[str, int, Demand], ...] = (),
    gpu_shares: int | None = None,
) -> dict[str, Any]:
    """Every policy on the evaluated period; the report as plain data (JSON-able). ``more_pools``:
    ``(name, GPUs, demand)`` of pools beside the primary one (``cfg.pool_name``, ``cfg.pool_gpus``).
    ``gpu_shares``: also what lending serving's forecast idle fractions in shares of ``1/N`` GPU
    would add on the primary pool, per forecaster (``rose_sim.shares``)."""
    started, cpu = time.perf_counter(), time.process_time()
    bounds = bounds_for(demand, cfg, forecasters)
    more = tuple(
        PoolInput(name, gpus, d, bounds_for(d, replace(cfg, pool_gpus=gpus), forecasters))
        for name, gpus, d in more_pools
    )
    total_gpus = cfg.pool_gpus + sum(m.gpus for m in more)
    seconds = (demand.ticks - demand.history) * demand.tick_s
    results: dict[str, dict[str, Any]] = {}
    runtime: dict[str, float] = {"forecasts_s": round(time.perf_counter() - started, 2)}
    for p in policies or default_policies(forecasters):
        t0 = time.perf_counter()
        sim = Simulation(demand, jobs, cost, cfg, p, bounds, more_pools=more)
        results[p.name] = sim.run().report(seconds, total_gpus)
        runtime[p.name] = round(time.perf_counter() - t0, 2)
    shares = {} if gpu_shares is None else share_report(demand, jobs, cost, cfg, forecasters, results, gpu_shares)
    return {
        "evaluated_days": round(demand.evaluated_days, 2),
        "history_days": round(demand.history * demand.tick_s / 86400, 2),
        "tick_seconds": demand.tick_s,
        "series_step_seconds": demand.source_step,
        "pool_gpus": total_gpus,
        "pools": [{"name": cfg.pool_name, "gpus": cfg.pool_gpus, "capacity_per_gpu": demand.capacity_per_gpu}]
        + [{"name": m.name, "gpus": m.gpus, "capacity_per_gpu": m.demand.capacity_per_gpu} for m in more],
        "capacity_per_gpu": demand.capacity_per_gpu,
        "risk": cfg.risk,
        "dwell_seconds": cfg.dwell_s,
        "host_memory_gib": None if cfg.host_memory_bytes is None else round(cfg.host_memory_bytes / 2**30, 1),
        "cost_model": asdict(cost),
        "jobs": [
            {
                "key": j.key,
                "minGPUs": j.job.spec.min_gpus,
                "maxGPUs": j.job.spec.max_gpus,
                "gpusPerWorker": j.job.spec.gpus_per_worker,
                "stateBytesPerWorker": j.state_bytes,
                "gracefulShutdownPeriod": j.job.spec.graceful_shutdown_period,
                "step_seconds": j.step_seconds,
                "checkpoint_interval_s": j.checkpoint_interval_s,
                "safe_point_s": j.safe_point_s,
                **role_sizes(j),
            }
            for j in jobs
        ],
        "forecasters": {k: b.detail or k for k, b in bounds.items()},
        "timeslice_groups": timeslice_groups(jobs, cost),
        "results": results,
        "goals": goals(results),
        **({"gpu_shares": shares} if shares else {}),
        "runtime_s": runtime
        | {"total_s": round(time.perf_counter() - started, 2), "cpu_s": round(time.process_time() - cpu, 2)},
    }


SHARE_FORECASTERS = ("oracle", "model")  # the baseline's bounds are tuned in whole GPUs only


def share_bounds(demand: Demand, cfg: SimConfig, name: str) -> fc.Bounds:
    """A forecaster's bounds in fractions of GPUs (``Demand.busy`` and the whole-GPU bounds are
    rounded up: they hide the idle fraction of serving's last GPU)."""
    frac = demand.busy if demand.observed is None else demand.observed / demand.capacity_per_gpu
    if name == "oracle":
        return fc.oracle(frac, HORIZONS_S, demand.tick_s)
    return model_bounds(demand, cfg, whole=False)


def share_report(
    demand: Demand,
    jobs: list[SimJob],
    cost: CostModel,
    cfg: SimConfig,
    forecasters: tuple[str, ...],
    results: dict[str, dict[str, Any]],
    n: int,
) -> dict[str, dict[str, Any]]:
    """Per planned forecaster (oracle, model): the share lending of the primary pool, planned on the
    forecaster's fractional bounds against serving's fractional demand, beside its whole-GPU
    policy's useful GPU-hours per day."""
    window = max((int(j.job.spec.min_useful_run_seconds) for j in jobs), default=600)
    serving = demand.busy if demand.observed is None else demand.observed / demand.capacity_per_gpu
    days = demand.evaluated_days or 1.0
    out: dict[str, dict[str, Any]] = {}
    for name in (f for f in SHARE_FORECASTERS if f in forecasters):
        bounds = share_bounds(demand, cfg, name)
        r = share_lending(
            serving,
            bounds,
            history=demand.history,
            tick_s=demand.tick_s,
            pool_gpus=cfg.pool_gpus,
            shares_per_gpu=n,
            window_s=window,
            start_s=cost.pod_start_s,
        ).report()
        whole = results.get(f"planned-{name}", {}).get("rl_useful_gpu_hours")
        out[name] = r | {"whole_gpu_useful_gpu_hours_per_day": None if whole is None else round(whole / days, 1)}
    return out


def markdown(report: dict[str, Any], title: str = "") -> str:
    results = report["results"]
    lines = [f"**{title}**", ""] if title else []
    lines += ["| policy | " + " | ".join(c for _, c in COLUMNS) + " |", "| --- |" + " ---: |" * len(COLUMNS)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:,}" for k, _ in COLUMNS) + " |")
    for name, t in (report.get("timeslice_groups") or {}).items():
        lines += [
            "",
            f"Time-slice group {name} ({', '.join(t['jobs'])}): {'pays' if t['pays'] else 'does not pay'}: "
            f"{t['reason']} (timeslice.advise's round model; advice, not simulated)",
        ]
    shares = report.get("gpu_shares") or {}
    if shares:
        n = next(iter(shares.values()))["shares_per_gpu"]
        lines += [
            "",
            f"GPU shares of 1/{n} GPU lent from serving's forecast idle fraction (rose_sim.shares; an "
            "upper bound: today's driver reclaims a share on any GPU serving claims):",
            "",
            "| forecaster | whole-GPU planned useful GPU-h/day | + shares lent GPU-h/day | + shares useful "
            "GPU-h/day | share reclaims/day (serving waits) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, v in shares.items():
            lines.append(
                f"| {name} | {v['whole_gpu_useful_gpu_hours_per_day']} | {v['lent_gpu_hours_per_day']} | "
                f"{v['useful_gpu_hours_per_day']} | {v['unplanned_reclaims_per_day']} |"
            )
    g = report.get("goals") or {}
    if g:
        lines += ["", f"Goals (judged on {g['judged']}):"]
        for key, v in g.items():
            if isinstance(v, dict):
                extra = (
                    ""
                    if "against" not in v
                    else f", against {v['against']} at {v['their_waits_per_day']} waits/day: equal waits "
                    f"{v['at_equal_waits']}"
                )
                lines.append(f"- {key}: {v['value']} (goal {v['goal']}{extra}): {'met' if v['met'] else 'not met'}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path, title: str = "") -> None:
    """One PNG: RL useful GPU-hours and serving waits per day, per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    useful = [report["results"][n]["rl_useful_gpu_hours"] for n in names]
    waits = [report["results"][n]["serving_waits_per_day"] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.barh(names, useful, color="tab:green")
    a.set_xlabel("RL useful GPU-hours")
    a.invert_yaxis()
    b.barh(names, waits, color="tab:red")
    b.set_xlabel("serving waits per day")
    b.axvline(GOAL_WAITS_PER_DAY, color="k", ls="--", lw=1)
    b.invert_yaxis()
    b.set_yticklabels([])
    fig.suptitle(title or f"rose simulate: {report['pool_gpus']} GPUs, {report['evaluated_days']} days evaluated")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
