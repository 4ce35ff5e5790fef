"""The extender's own work per call, in-process: no HTTP, no second process.

    python -m benchmarks.extender_work [--nodes 5000] [--repeat 7] [--number 20] [--json OUT.json]

``Extender.handle`` for each verb on :func:`benchmarks.scheduler_throughput.synthetic_cache`
(the cache code the watch feeds) with every node named — filter and prioritize for an RL worker,
prioritize for a serving pod, preempt with 500 candidates — timed as the best of ``--repeat``
runs of ``--number`` calls (the best is what the code costs; the rest is the machine's load),
and the p50/p99 of 300 single calls, wall and on the thread's CPU (``time.thread_time``): a call
whose wall time far exceeds its CPU time waited off the CPU (other processes), it did no more work.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import time
import timeit
from pathlib import Path
from typing import Any

from benchmarks.scheduler_throughput import _pod_json, forecasts, synthetic_cache
from rose_common import names
from rose_common.forecast_api import ForecastResponse


def bodies(n: int) -> dict[str, bytes]:
    rl = _pod_json("worker-x", {names.LABEL_JOB: "job-7"}, 0)
    serving = _pod_json("llm-x", {names.LABEL_ROLE: names.ROLE_SERVING}, 100000)
    every = [f"node-{i:05d}" for i in range(n)]
    victims = {
        every[j]: {"Pods": [{"UID": f"uid-{j}"}, {"UID": f"other-{j}"}], "NumPDBViolations": 0}
        for j in range(0, n, max(1, n // 500))[:500]
    }
    return {
        "filter": json.dumps({"Pod": rl, "Nodes": None, "NodeNames": every}).encode(),
        "prioritize": json.dumps({"Pod": rl, "Nodes": None, "NodeNames": every}).encode(),
        "prioritize_serving": json.dumps({"Pod": serving, "Nodes": None, "NodeNames": every}).encode(),
        "preempt": json.dumps({"Pod": serving, "NodeNameToVictims": None, "NodeNameToMetaVictims": victims}).encode(),
    }


def measure(n: int, repeat: int, number: int, singles: int = 300) -> dict[str, Any]:
    from scheduler_extender.forecast import reduce
    from scheduler_extender.server import Extender, settle_heap

    cache = synthetic_cache(n)
    pools = [f"pool-{i}" for i in range(4)]
    cap = {p: 8 * (n // 4) for p in pools}
    fcs = {f["pool"]: reduce(ForecastResponse.model_validate(f), "0.9") for f in forecasts(pools, cap)}

    class Static:
        def get(self, pool: str) -> Any:
            return fcs.get(pool)

    ext = Extender(cache, forecasts=Static())
    settle_heap()
    logging.disable(logging.WARNING)  # preempt's refusal lines (no preemptor lookup here)
    out: dict[str, Any] = {"nodes": n, "load_average_at_start": [round(x, 1) for x in os.getloadavg()]}
    for label, body in bodies(n).items():
        verb = label.split("_")[0]
        call = functools.partial(ext.handle, verb, body)
        best = min(timeit.repeat(call, number=number, repeat=repeat)) / number
        wall, cpu = [], []
        for _ in range(singles):
            w, c = time.perf_counter(), time.thread_time()
            call()
            wall.append(time.perf_counter() - w)
            cpu.append(time.thread_time() - c)
        wall.sort()
        cpu.sort()
        at = int(0.99 * len(wall))
        out[label] = {
            "best_ms": round(best * 1000, 3),
            "wall_p50_ms": round(statistics.median(wall) * 1000, 3),
            "wall_p99_ms": round(wall[at] * 1000, 3),
            "cpu_p50_ms": round(statistics.median(cpu) * 1000, 3),
            "cpu_p99_ms": round(cpu[at] * 1000, 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.extender_work", description=__doc__)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    for flag in ("nodes", "repeat", "number"):
        if not 1 <= getattr(args, flag) <= 100_000:
            p.error(f"--{flag} must be in [1, 100000], got {getattr(args, flag)}")
    text = json.dumps(measure(args.nodes, args.repeat, args.number), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
