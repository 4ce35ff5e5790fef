"""Whether time-slicing pays for a set of jobs: their phase timings against the switch cost.

I/O boundary: none except :func:`load` (reads one JSON or CSV file). :func:`advise` (pure) takes
each job's cycles (seconds on the group, seconds off it) and the cost of one switch (suspend +
restore + grant overhead, seconds) and models the jobs sharing one group round-robin: a round
lasts ``max(slowest job's own cycle + switch, sum of the GPU phases + one switch per job)``; the
group's duty cycle is the GPU time of a round over its length, against the best single job's
``gpu / (gpu + off)`` alone. It pays when the shared duty cycle beats the best solo one by
``min_gain`` and every job's off-group window is longer than a switch (else the switch eats the
idle time it wants to lend).
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JobAdvice:
    job: str
    cycles: int
    gpu_s: float
    off_s: float
    solo_duty: float
    slowdown: float  # the shared round over its own cycle
    window_ok: bool


@dataclass(frozen=True)
class Advice:
    jobs: tuple[JobAdvice, ...]
    switch_s: float
    round_s: float
    shared_duty: float
    best_solo_duty: float
    pays: bool
    reason: str


def advise(cycles: dict[str, list[tuple[float, float]]], switch_s: float, min_gain: float = 1.2) -> Advice:
    if switch_s < 0:
        raise ValueError(f"switch cost must be >= 0 seconds, got {switch_s}")
    if len(cycles) < 2:
        raise ValueError(f"time-slicing needs at least 2 jobs, got {len(cycles)}: give each row a job name")
    per = {}
    for job, rows in cycles.items():
        if not rows or any(g <= 0 or o < 0 for g, o in rows):
            raise ValueError(f"job {job!r}: every cycle needs gpu_s > 0 and off_s >= 0")
        per[job] = (statistics.fmean(g for g, _ in rows), statistics.fmean(o for _, o in rows), len(rows))
    gpu_total = sum(g for g, _, _ in per.values())
    round_s = max(*(g + o + switch_s for g, o, _ in per.values()), gpu_total + switch_s * len(per))
    jobs = tuple(
        JobAdvice(j, n, g, o, g / (g + o), round_s / (g + o), o > switch_s) for j, (g, o, n) in sorted(per.items())
    )
    shared = gpu_total / round_s
    best = max(j.solo_duty for j in jobs)
    short = [j.job for j in jobs if not j.window_ok]
    if short:
        why = f"off-group windows of {', '.join(short)} are not longer than one switch ({switch_s:.3f} s)"
        return Advice(jobs, switch_s, round_s, shared, best, False, why)
    if shared < best * min_gain:
        return Advice(
            jobs,
            switch_s,
            round_s,
            shared,
            best,
            False,
            f"shared duty cycle {shared:.0%} is under {min_gain}x the best solo {best:.0%}",
        )
    return Advice(
        jobs,
        switch_s,
        round_s,
        shared,
        best,
        True,
        f"shared duty cycle {shared:.0%} vs best solo {best:.0%} ({shared / best:.2f}x)",
    )


def _row(r: dict[str, Any], where: str) -> tuple[str, float, float]:
    try:
        return str(r["job"]), float(r["gpu_s"]), float(r["off_s"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: each row needs job, gpu_s and off_s (numbers): {e}") from None


def load(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Rows ``job, gpu_s, off_s`` (one per cycle) from a CSV with that header, or a JSON list of objects."""
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        rows = data.get("cycles") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of {{job, gpu_s, off_s}} (or {{'cycles': [...]}})")
        parsed = [_row(r, f"{path} row {i}") for i, r in enumerate(rows)]
    else:
        parsed = [_row(r, f"{path} line {i + 2}") for i, r in enumerate(csv.DictReader(text.splitlines()))]
    out: dict[str, list[tuple[float, float]]] = {}
    for job, g, o in parsed:
        out.setdefault(job, []).append((g, o))
    return out


def render(a: Advice) -> str:
    lines = [f"{'job':<24} {'cycles':>6} {'gpu s':>8} {'off s':>8} {'solo':>6} {'slowdown':>8}"]
    lines += [
        f"{j.job:<24} {j.cycles:>6} {j.gpu_s:>8.3f} {j.off_s:>8.3f} {j.solo_duty:>6.0%} {j.slowdown:>7.2f}x"
        for j in a.jobs
    ]
    lines.append(
        f"switch cost {a.switch_s:.3f} s; shared round {a.round_s:.3f} s; "
        f"group duty cycle shared {a.shared_duty:.0%} vs best solo {a.best_solo_duty:.0%}"
    )
    lines.append(("PAYS: " if a.pays else "DOES NOT PAY: ") + a.reason)
    return "\n".join(lines)
