"""Replay a real 14-day serving trace through the reclaim planner: planner on, reactive only, no lending.

    python -m benchmarks.planner_replay --series ../shared/data/traces/derived/servegen_m-large_10min.csv \
        --json OUT.json

The what-if simulator's first brick. One pool of ``--pool-gpus`` GPUs serves the trace; RL jobs
borrow what serving leaves. Every ``--tick`` seconds the controller's own pure function
(``elastic_controller.planner.plan``) decides; the simulation carries the plan out and then lets
serving arrive. Three policies, side by side:

- **planner**: forecasts from the *seasonal-rolling-max* forecaster below (a simple, causal stand-in
  for the predictor's model, named as such in the output): upper bound for each future minute =
  ``(1 + headroom) * max(max of the last 30 min, max of the same +/-30 min yesterday)``.
- **reactive**: the same planner fed a persistence forecast (demand stays as at the last tick): it grows
  into what is idle now and gives GPUs back only when serving has arrived (unplanned reclaims).
- **no-lending**: RL gets nothing; serving never waits.

Model of the trace (say so when quoting figures): the derived series are requests per 10 min
(traces README); they are scaled so the trace's peak uses ``--peak-util`` of the pool, i.e.
``busy GPUs = ceil(requests / peak * pool_gpus * peak_util)``, linearly interpolated to the tick;
gaps (collection holes) carry the last observed value. An unplanned reclaim makes one serving GPU
wait until the occupant reaches its safe point (``--safe-point-s``, bounded by the grace period)
and its state is moved out (``state bytes / --pcie-gbps``).

I/O boundary: reads the series CSV (``predictor.series``), writes the JSON report and stdout.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from benchmarks._common import write_json
from elastic_controller.planner import Forecast, Job, Plan, PlanInput, Pool, Settings, Worker, plan
from predictor.series import read_series_csv

FloatArray = NDArray[np.float64]
POOL = "pool"
FORECASTER = "seasonal-rolling-max (simple stand-in for the predictor's model)"
Forecaster = Callable[[int], Forecast]


@dataclass(frozen=True)
class Config:
    pool_gpus: int = 64
    peak_util: float = 0.9
    tick_s: int = 60
    horizon_s: int = 7200
    jobs: int = 4
    min_gpus: int = 4
    max_gpus: int = 16
    grace_s: float = 30.0
    safe_point_s: float = 20.0
    state_gib: float = 16.0
    pcie_gbps: float = 25.0
    min_useful_run_s: float = 600.0
    dwell_s: float = 300.0
    headroom: float = 0.1
    recent_s: int = 1800


@dataclass
class Tally:
    lent_gpu_hours: float = 0.0
    planned_reclaims: int = 0  # GPUs the planner gave back before serving needed them
    unplanned_reclaims: int = 0  # GPUs serving found lent and had to wait for
    serving_gpu_seconds_waited: float = 0.0
    suspends: int = 0  # worker suspends, planned or not
    plan_seconds: float = 0.0
    plans: int = 0

    def report(self) -> dict[str, float]:
        out = {k: round(v, 3) for k, v in asdict(self).items() if k not in ("plan_seconds", "plans")}
        out["suspends_per_lent_gpu_hour"] = (
            round(self.suspends / self.lent_gpu_hours, 4) if self.lent_gpu_hours else 0.0
        )
        out["plan_ms_mean"] = round(1000 * self.plan_seconds / self.plans, 3) if self.plans else 0.0
        return out


def demand_gpus(values: FloatArray, step: int, cfg: Config) -> FloatArray:
    """Busy serving GPUs at every tick, from a requests-per-step series (see the module docstring)."""
    filled = values.copy()
    for i in range(1, len(filled)):
        if math.isnan(filled[i]):
            filled[i] = filled[i - 1]
    filled = np.nan_to_num(filled, nan=float(np.nanmean(values)))
    t_src = np.arange(len(filled)) * step
    t = np.arange(0, int(t_src[-1]) + 1, cfg.tick_s)
    scaled = np.interp(t, t_src, filled) / float(np.max(filled)) * cfg.pool_gpus * cfg.peak_util
    return np.ceil(scaled - 1e-9)


def _sliding_max(x: FloatArray, back: int, ahead: int) -> FloatArray:
    pad = np.concatenate([np.full(back, np.nan), x, np.full(ahead, np.nan)])
    win = np.lib.stride_tricks.sliding_window_view(pad, back + ahead + 1)
    out: FloatArray = np.nanmax(np.where(np.isnan(win), -np.inf, win), axis=1)
    return out


def seasonal_forecaster(d: FloatArray, cfg: Config) -> Forecaster:
    """Causal: at tick i (before serving arrives) it knows d[:i] and the same hours of yesterday."""
    per_day = 86400 // cfg.tick_s
    recent = _sliding_max(d, cfg.recent_s // cfg.tick_s, 0)
    around = _sliding_max(d, 1800 // cfg.tick_s, 1800 // cfg.tick_s)
    yesterday = np.concatenate([np.full(per_day, np.nan), around[:-per_day]])
    h = cfg.horizon_s // cfg.tick_s

    def at(i: int) -> Forecast:
        ahead = yesterday[i : i + h]
        ahead = np.concatenate([ahead, np.full(h - len(ahead), np.nan)])
        yest = np.where(np.isnan(ahead), -np.inf, ahead)
        last = recent[i - 1] if i else float(cfg.pool_gpus)
        upper = (1 + cfg.headroom) * np.maximum(last, yest)
        return Forecast(float(i * cfg.tick_s), float(cfg.tick_s), tuple(float(u) for u in upper), "seasonal-max")

    return at


def persistence_forecaster(d: FloatArray, cfg: Config) -> Forecaster:
    h = cfg.horizon_s // cfg.tick_s
    """Demand stays what it was at the last tick: the planner learns of serving only once it is there."""
    return lambda i: Forecast(float(i * cfg.tick_s), float(cfg.tick_s), (float(d[max(i - 1, 0)]),) * h, "last")


@dataclass
class Fleet:
    jobs: list[Job]
    workers: list[Worker] = field(default_factory=list)
    serial: int = 0


def _jobs(cfg: Config) -> list[Job]:
    state = int(cfg.state_gib * 2**30)
    return [Job(f"rl/job-{k}", cfg.min_gpus, cfg.max_gpus, 1, priority=k % 2, state_bytes=state,
                seconds_to_safe_point=cfg.safe_point_s, grace_s=cfg.grace_s, suspend_s=_suspend_s(cfg),
                min_useful_run_s=cfg.min_useful_run_s) for k in range(cfg.jobs)]  # fmt: skip


def _suspend_s(cfg: Config) -> float:
    return cfg.state_gib * 2**30 / (cfg.pcie_gbps * 1e9)


def _carry_out(fleet: Fleet, p: Plan, now: float, tally: Tally, planned: bool = True) -> None:
    """Suspends finish within the lead time; resumed and new workers run at once."""
    out: list[Worker] = []
    for w in fleet.workers:
        t = p.targets[w.job]
        if w.name in t.remove:
            continue
        if w.name in t.suspend:
            tally.suspends += int(w.state == "active")
            out.append(replace(w, state="suspended"))
        else:
            out.append(replace(w, state="active") if w.name in t.resume else w)
    for key, t in p.targets.items():
        for pool in t.add:
            fleet.serial += 1
            out.append(Worker(f"{key}-w{fleet.serial}", key, "active", pool))
    if planned:
        tally.planned_reclaims += sum(len(r.workers) for r in p.reclaims)
    fleet.workers = out
    shrunk = {k for k, t in p.targets.items() if t.shrinks}
    fleet.jobs = [replace(j, last_shrink_at=now) if j.key in shrunk else j for j in fleet.jobs]


def _serving_arrives(fleet: Fleet, demand: float, cfg: Config, now: float, tally: Tally) -> None:
    """Serving takes what it needs; lent GPUs in its way are reclaimed unplanned (it waits)."""
    lent = sum(1 for w in fleet.workers if w.state == "active")
    short = int(demand) - (cfg.pool_gpus - lent)
    if short <= 0:
        return
    now_only = Forecast(now, float(cfg.tick_s), (demand,) * 2, "actual")
    p = plan(PlanInput(now, (Pool(POOL, cfg.pool_gpus, now_only),), tuple(fleet.jobs), tuple(fleet.workers),
                       Settings(dwell_s=cfg.dwell_s)))  # fmt: skip
    tally.unplanned_reclaims += short
    tally.serving_gpu_seconds_waited += short * (min(cfg.safe_point_s, cfg.grace_s) + _suspend_s(cfg))
    only_reclaims = {k: replace(t, add=(), resume=()) for k, t in p.targets.items()}
    _carry_out(fleet, replace(p, targets=only_reclaims), now, tally, planned=False)


def simulate(d: FloatArray, cfg: Config, forecaster: Forecaster | None) -> Tally:
    tally, fleet = Tally(), Fleet(_jobs(cfg))
    settings = Settings(dwell_s=cfg.dwell_s, interval_s=float(cfg.tick_s))
    for i in range(len(d)):
        now = float(i * cfg.tick_s)
        if forecaster is not None:
            started = time.perf_counter()
            p = plan(PlanInput(now, (Pool(POOL, cfg.pool_gpus, forecaster(i)),), tuple(fleet.jobs),
                               tuple(fleet.workers), settings))  # fmt: skip
            tally.plan_seconds += time.perf_counter() - started
            tally.plans += 1
            _carry_out(fleet, p, now, tally)
        _serving_arrives(fleet, float(d[i]), cfg, now, tally)
        tally.lent_gpu_hours += sum(1 for w in fleet.workers if w.state == "active") * cfg.tick_s / 3600
    return tally


def run(series: Path, cfg: Config) -> dict[str, object]:
    s = read_series_csv(series)
    d = demand_gpus(s.values, s.step, cfg)
    results = {
        "planner": simulate(d, cfg, seasonal_forecaster(d, cfg)).report(),
        "reactive": simulate(d, cfg, persistence_forecaster(d, cfg)).report(),
        "no-lending": simulate(d, cfg, None).report(),
    }
    return {"series": str(series), "forecaster": FORECASTER, "days": round(len(d) * cfg.tick_s / 86400, 2),
            "serving_gpu_hours": round(float(d.sum()) * cfg.tick_s / 3600, 1), "config": asdict(cfg),
            "results": results}  # fmt: skip


def _table(report: dict[str, object]) -> str:
    results = report["results"]
    assert isinstance(results, dict)
    keys = list(next(iter(results.values())).keys())
    lines = [f"| metric | {' | '.join(results)} |", "| --- |" + " --- |" * len(results)]
    lines += [f"| {k} | {' | '.join(str(r[k]) for r in results.values())} |" for k in keys]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=Path, required=True, help="a derived trace CSV (time, value per row)")
    ap.add_argument("--json", type=Path, help="write the report here")
    for f in ("pool_gpus", "jobs", "min_gpus", "max_gpus", "tick_s", "horizon_s"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(Config, f))
    for f in ("peak_util", "grace_s", "safe_point_s", "state_gib", "min_useful_run_s", "dwell_s", "headroom"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=float, default=getattr(Config, f))
    a = ap.parse_args(argv)
    if not a.series.is_file():
        ap.error(f"--series {a.series}: no such file; the derived traces are in ../shared/data/traces/derived/")
    fields = {k: v for k, v in vars(a).items() if k in Config.__dataclass_fields__}
    report = run(a.series, Config(**fields))
    print(f"{report['series']}: {report['days']} days, forecaster: {report['forecaster']}")
    print(_table(report))
    write_json(a.json, report, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
