"""What ``spec.roles`` costs the reclaim planner: ``plan()`` over jobs with roles vs the same
number of plain jobs, same workers, same pools.

    python -m benchmarks.planner_roles --jobs 200 --repeat 30 --json OUT.json

Each job runs 6 workers: with roles a trainer of 2 (min = max 2) and 4 rollouts (1-6), which the
controller plans as two planner jobs (``<key>#trainer``, ``<key>#rollout``); plain, one job of
min 2, max 8. ``--pools`` pools sized so every job fits with room for one more worker each
(``ceil(jobs / pools) * 7`` GPUs); two forecasts: serving idle (the plan grows every job by one)
and serving at 80 % of each pool (the plan reclaims). The median and max of ``--repeat`` calls,
the pure function only (what ``rose_controller_plan_duration_seconds`` measures).

I/O boundary: stdout and the JSON report.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan

NOW = 1_000_000.0


def _fleet(jobs: int, pools: int, roles: bool) -> tuple[tuple[Job, ...], tuple[Worker, ...]]:
    out_jobs: list[Job] = []
    workers: list[Worker] = []
    for k in range(jobs):
        key, pool = f"ns{k % 7}/j{k}", f"pool-{k % pools}"
        if roles:
            t = Job(f"{key}#trainer", 2, 2, state_bytes=40 << 30, min_useful_run_s=0.0, role="trainer")
            r = Job(
                f"{key}#rollout",
                1,
                6,
                state_bytes=2 << 30,
                min_useful_run_s=0.0,
                role="rollout",
                requires=t.key,
                remove_on_shrink=True,
            )
            out_jobs += [t, r]
            workers += [Worker(f"j{k}-trainer-{i}", t.key, "active", pool) for i in range(2)]
            workers += [Worker(f"j{k}-rollout-{i}", r.key, "active", pool) for i in range(4)]
        else:
            out_jobs.append(Job(key, 2, 8, state_bytes=8 << 30, min_useful_run_s=0.0))
            workers += [Worker(f"j{k}-w{i}", key, "active", pool) for i in range(6)]
    return tuple(out_jobs), tuple(workers)


def measure(jobs: int, pools: int, repeat: int) -> list[dict[str, Any]]:
    capacity = math.ceil(jobs / pools) * 7
    rows = []
    for roles in (True, False):
        fleet, workers = _fleet(jobs, pools, roles)
        for share in (0.0, 0.8):
            forecast = Forecast(NOW - 60, 60.0, (share * capacity,) * 60)
            inp = PlanInput(
                NOW,
                tuple(Pool(f"pool-{i}", capacity, forecast) for i in range(pools)),
                fleet,
                workers,
                Settings(dwell_s=0.0),
            )
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                result = plan(inp)
                times.append(time.perf_counter() - t0)
            rows.append(
                {
                    "roles": roles,
                    "serving_share": share,
                    "planner_jobs": len(fleet),
                    "workers": len(workers),
                    "pool_gpus": capacity,
                    "median_ms": statistics.median(times) * 1e3,
                    "max_ms": max(times) * 1e3,
                    "reclaimed_workers": sum(len(r.workers) for r in result.reclaims),
                    "added_workers": sum(len(t.add) for t in result.targets.values()),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--pools", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.jobs < 1 or a.pools < 1 or a.repeat < 1:
        ap.error("--jobs, --pools and --repeat must be >= 1")
    rows = measure(a.jobs, a.pools, a.repeat)
    for r in rows:
        kind = "roles" if r["roles"] else "plain"
        print(
            f"{kind:5} serving {r['serving_share']:.0%}: {r['planner_jobs']} planner jobs, {r['workers']} workers, "
            f"plan median {r['median_ms']:.1f} ms, max {r['max_ms']:.1f} ms; "
            f"{r['reclaimed_workers']} reclaimed, {r['added_workers']} added"
        )
    if a.json is not None:
        a.json.write_text(json.dumps({"jobs": a.jobs, "pools": a.pools, "repeat": a.repeat, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
