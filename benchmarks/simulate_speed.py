"""How long ``rose simulate`` takes: 14 days at 1-minute ticks, every policy (issue 24's goal: <= 60 s).

    python -m benchmarks.simulate_speed [--days 14] [--jobs docs/simulate-jobs] [--json OUT.json]

The series is the predictor's own generator (``predictor.generator``, 1-minute steps) over the
history (7 days) plus ``--days``; the jobs are the four of ``docs/simulate-jobs``. Prints and
writes the wall and CPU seconds per stage (forecasters, the predictor model's refits included,
and each policy). On a shared machine the CPU seconds are the figure to compare.

I/O boundary: reads the jobs' YAML, writes the JSON report and stdout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._common import emit_json
from predictor.generator import generate
from rose_sim.engine import SimConfig
from rose_sim.inputs import DAY, CostModel, demand_from_values, load_jobs
from rose_sim.report import simulate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=14.0, help="days evaluated (after 7 days of history)")
    ap.add_argument("--jobs", type=Path, default=Path("docs/simulate-jobs"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    s = generate(days=7 + a.days, step=60)
    demand = demand_from_values(s.start, s.values, s.step, tick_s=60, history_s=7 * DAY, pool_gpus=64)
    wall, cpu = time.perf_counter(), time.process_time()
    report = simulate(demand, load_jobs(a.jobs), CostModel(), SimConfig())
    out = {
        "evaluated_days": report["evaluated_days"],
        "ticks": demand.ticks - demand.history,
        "policies": list(report["results"]),
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "stages_wall_s": report["runtime_s"],
        "goal_s": 60,
    }
    emit_json(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
