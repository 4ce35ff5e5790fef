"""Replay a serving trace through the reclaim planner: planner on, reactive only, no lending.

    python -m benchmarks.planner_replay --series ../shared/data/traces/derived/servegen_m-large_10min.csv \
        --json OUT.json [--forecaster baseline|model|oracle] [--jobs docs/simulate-jobs]

A thin caller of ``rose simulate`` (``rose_sim``, issue 24), which replaced this benchmark's own
model (demand interpolated from the next 10-minute point, free transitions, a stand-in
forecaster): three of its policies on one trace, with its inputs, costs and defaults (64 GPUs, the
first 7 days as history, the four jobs of ``docs/simulate-jobs``, risk 0.01; docs/simulate.md),
and the replay's columns: GPU-hours lent, reclaims planned / unplanned, serving GPU-seconds waited,
suspends per lent GPU-hour. Every other figure is in the JSON (``simulate``: rose_sim's report).

- **planner**: ROSE planned with ``--forecaster`` (``baseline`` by default: the best tuned
  baseline on the history; ``model``: the predictor's; ``oracle``: the limit);
- **reactive**: the planner off (suspend when serving arrives);
- **no-lending**.

I/O boundary: reads the series CSV and the jobs' YAML, writes the JSON report and stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import write_json
from rose_sim.engine import Policy, SimConfig
from rose_sim.inputs import DAY, CostModel, Demand, SimInputError, SimJob, load_demand, load_jobs
from rose_sim.report import simulate

FORECASTERS = ("baseline", "model", "oracle")
REPO = Path(__file__).resolve().parents[1]


def policies(forecaster: str) -> tuple[Policy, ...]:
    return (
        Policy("planner", "planned", forecaster),
        Policy("reactive", "reactive"),
        Policy("no-lending", "no-lending"),
    )


def replay(demand: Demand, jobs: list[SimJob], forecaster: str = "baseline", pool_gpus: int = 64) -> dict[str, Any]:
    """rose_sim's report for the three policies, and the replay's columns drawn from it."""
    report = simulate(demand, jobs, CostModel(), SimConfig(pool_gpus=pool_gpus), (forecaster,), policies(forecaster))
    rows = {}
    for name, r in report["results"].items():
        lent = r["rl_lent_gpu_hours"]
        rows[name] = {
            "lent_gpu_hours": lent,
            "planned_reclaims": r["planned_reclaims"],
            "unplanned_reclaims": r["unplanned_reclaims"],
            "serving_gpu_seconds_waited": r["serving_wait_gpu_seconds"],
            "suspends_per_lent_gpu_hour": round(r["suspends"] / lent, 3) if lent else 0,
        }
    return {"forecaster": report["forecasters"][forecaster], "policies": rows, "simulate": report}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=Path, required=True, help="a trace CSV, e.g. ../shared/data/traces/derived/…")
    ap.add_argument("--jobs", type=Path, default=REPO / "docs" / "simulate-jobs", help="ElasticRLJob YAML (a folder)")
    ap.add_argument("--forecaster", choices=FORECASTERS, default="baseline", help="the planner's forecaster")
    ap.add_argument("--pool-gpus", type=int, default=64)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not a.series.exists():
        ap.error(f"--series {a.series}: no such file (the traces are in ../shared/data/traces/derived/)")
    try:
        demand = load_demand(a.series, tick_s=60, history_s=7 * DAY, pool_gpus=a.pool_gpus)
        out = replay(demand, load_jobs(a.jobs), a.forecaster, a.pool_gpus)
    except SimInputError as e:
        print(f"planner_replay: error: {e}", file=sys.stderr)
        return 2
    print(f"{a.series.name}: {demand.evaluated_days:.0f} days after 7 of history, planner fed {out['forecaster']}")
    print("| policy | GPU-hours lent | reclaims planned / unplanned | serving GPU-s waited | suspends per lent GPU-h |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in out["policies"].items():
        print(
            f"| {name} | {r['lent_gpu_hours']:,} | {r['planned_reclaims']} / {r['unplanned_reclaims']} | "
            f"{r['serving_gpu_seconds_waited']:,} | {r['suspends_per_lent_gpu_hour']} |"
        )
    if a.json is not None:
        write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
