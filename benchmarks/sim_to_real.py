"""Sim-to-real: the same time-compressed slice of a trace through the real system and through
``rose_sim``'s engine, side by side (issue 24's sim-to-real check; issue 25's side-by-side slice).

    python -m benchmarks.sim_to_real --series ../shared/data/traces/derived/servegen_m-large_10min.csv \\
        --hours 3 --speed 60 --json OUT.json [--markdown OUT.md]

Real side: ``benchmarks.soak``'s cluster and harness (imported, not copied) with no faults, no
Prometheus and no predictor: the real ``rose controller`` (planner on, ``--plan-interval`` = one
trace row) and ``rose extender`` read a static forecast file the harness rewrites at every row
with what the oracle forecaster says there (``rose_sim.engine.forecast_reply``: the reply the
simulator hands its planner), and one real ``rose driver`` per node suspends the simulated
occupants when the serving Deployments (scaled to the trace) need their GPUs.

Simulated side: ``rose_sim.engine.Simulation`` with the same pools (names, GPUs), the same busy
series per pool, the same ElasticRLJobs, the same oracle bounds, the same risk and dwell, the
controller's forecast step (60 s), on the compressed clock (one tick = one row = ``600 / speed``
wall seconds), so every job's seconds (grace, minimum useful run) mean the same on both sides.

Both sides are read at the simulator's tick: per tick and job, the GPUs RL holds (workers not
suspended) at the end of the tick (real: the last observation within the tick). From that:
lent GPU-hours (x speed: simulated hours), grows (GPUs added), GPU drops; plus the counters:
planned / unplanned reclaims and serving waits. :func:`compare` applies the tolerance
(:data:`TOLERANCE`, justified in docs/bench/sim-to-real.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import log
from benchmarks.soak import (
    HISTORY_ROWS,
    NS,
    ROW_S,
    Params,
    Soak,
    SoakFailure,
    _get,
    job_manifest,
    prepare_error_summary,
)

JOBS = (("rl-hi", 1, 1, 10), ("elastic-a", 1, 4, 0), ("elastic-b", 2, 4, 0))  # the soak's, no real trainer
RISK = "0.05"
# the real controller plans every second, so it acts within a second or two of each row's forecast
# (a plan loop of one row's period would act anywhere in the row: a random phase against the ticks)
PLAN_INTERVAL_S = 1.0
WAITED_S = 0.5  # a serving prepare that took longer inside the driver waited for a suspend
HORIZONS_SIM_S = (600, 1800, 3600)  # the predictor's default horizons, simulated seconds


@dataclass(frozen=True)
class Tolerance:
    """How far the real system may be from the simulation (see docs/bench/sim-to-real.md)."""

    count_abs: int = 1  # reclaims, grows, drops, waits: |real - sim| <= max(count_abs, count_rel x max)
    count_rel: float = 0.2
    lent_ticks_per_transition: float = 1.0  # lent GPU-hours: each GPU transition may land a tick apart
    lent_rel_floor: float = 0.02


TOLERANCE = Tolerance()


# ----------------------------------------------------------------------------- pure parts
def tick_series(
    samples: Sequence[tuple[float, Mapping[str, int]]], ticks: int, tick_s: float, jobs: Sequence[str]
) -> list[dict[str, int]]:
    """Per tick, each job's held GPUs at the end of the tick: the last sample taken within it
    (``samples``: (seconds since the start, held GPUs by job), in time order). A tick without a
    sample carries the one before (a loaded machine may observe less often than once a tick)."""
    out: list[dict[str, int]] = []
    last = dict.fromkeys(jobs, 0)
    k = 0
    for i in range(ticks):
        end = (i + 1) * tick_s
        while k < len(samples) and samples[k][0] < end:
            last = {j: int(samples[k][1].get(j, 0)) for j in jobs}
            k += 1
        out.append(dict(last))
    return out


def series_figures(series: Sequence[Mapping[str, int]], tick_s_sim: float) -> dict[str, float]:
    """From per-tick held GPUs by job: lent GPU-hours (simulated), GPUs grown, GPUs dropped."""
    grows = drops = 0
    held = 0
    prev: Mapping[str, int] = {}
    for row in series:
        for j, n in row.items():
            d = n - prev.get(j, 0)
            grows += max(0, d)
            drops += max(0, -d)
        held += sum(row.values())
        prev = row
    return {"lent_gpu_hours": round(held * tick_s_sim / 3600, 3), "grows": grows, "drops": drops}


def compare(
    real: Mapping[str, float], sim: Mapping[str, float], tol: Tolerance = TOLERANCE, tick_s_sim: float = 600.0
) -> list[dict[str, Any]]:
    """One row per figure: both values, the difference, what the tolerance allows, ok (pure).

    Counts (``grows``, ``drops``, ``suspends``, ``planned_reclaims``, ``unplanned_reclaims``, ``serving_waits``):
    ``max(count_abs, count_rel x the larger)``. ``lent_gpu_hours``: each GPU transition of the
    simulation may land up to ``lent_ticks_per_transition`` ticks apart on the real side, so
    ``(sim grows + sim drops) x ticks x tick`` GPU-hours, and at least ``lent_rel_floor`` of the
    larger. A figure missing on either side is an error."""
    rows = []
    for key in (
        "lent_gpu_hours",
        "grows",
        "drops",
        "suspends",
        "planned_reclaims",
        "unplanned_reclaims",
        "serving_waits",
    ):
        if key not in real or key not in sim:
            raise ValueError(f"compare: {key!r} missing on the {'real' if key not in real else 'simulated'} side")
        r, s = float(real[key]), float(sim[key])
        if key == "lent_gpu_hours":
            moves = float(sim["grows"]) + float(sim["drops"])
            allowed = max(moves * tol.lent_ticks_per_transition * tick_s_sim / 3600, tol.lent_rel_floor * max(r, s))
        else:
            allowed = max(float(tol.count_abs), tol.count_rel * max(r, s))
        rows.append(
            {
                "figure": key,
                "real": r,
                "sim": s,
                "diff": round(r - s, 3),
                "allowed": round(allowed, 3),
                "ok": abs(r - s) <= allowed + 1e-9,
            }
        )
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    out = ["| figure | real | simulated | real - sim | allowed | within |", "|---|---:|---:|---:|---:|---|"]
    out += [
        f"| {r['figure']} | {r['real']:g} | {r['sim']:g} | {r['diff']:g} | ±{r['allowed']:g} | "
        f"{'yes' if r['ok'] else '**no**'} |"
        for r in rows
    ]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- the simulated side
def simulate(
    pools: Mapping[str, tuple[int, np.ndarray]],
    tick_s: int,
    horizons_s: tuple[int, ...],
    dwell_s: float,
) -> tuple[dict[str, float], list[dict[str, int]]]:
    """``rose_sim``'s engine over ``pools`` (name -> (GPUs, busy per tick, history first)) on the
    compressed clock: the figures and the per-tick held GPUs by job."""
    from dra_driver.suspend.simulated import DEFAULT_HOST_LINK_BYTES_PER_SECOND
    from elastic_controller import pools as ec_pools
    from rose_sim import forecasters
    from rose_sim.engine import Policy, PoolInput, SimConfig, Simulation
    from rose_sim.inputs import CostModel, Demand, parse_jobs

    # the drivers' simulated occupants stop at once (no safe point to wait for)
    jobs = [
        replace(j, safe_point_s=0.0)
        for j in parse_jobs([(f"job {n}", job_manifest(n, lo, hi, pr)) for n, lo, hi, pr in JOBS])
    ]
    names = sorted(pools)
    demands = {
        pl: Demand(0, tick_s, np.asarray(b, dtype=float), HISTORY_ROWS, tick_s, 1.0) for pl, (_, b) in pools.items()
    }
    bounds = {pl: {"oracle": forecasters.oracle(demands[pl].busy, horizons_s, tick_s)} for pl in names}
    first = names[0]
    cfg = SimConfig(
        pool_gpus=pools[first][0], risk=RISK, dwell_s=dwell_s, pool_name=first, forecast_step_s=ec_pools.STEP_S
    )
    more = tuple(PoolInput(pl, pools[pl][0], demands[pl], bounds[pl]) for pl in names[1:])
    # the real stack's costs on the compressed clock: a KWOK pod starts within a tick, simulated
    # occupants have no world change, the driver's simulated backend moves the state at its link rate
    cost = CostModel(
        pcie_bytes_per_s=DEFAULT_HOST_LINK_BYTES_PER_SECOND, pin_s=0.0, pod_start_s=1.0, world_change_s=0.0
    )
    series: list[dict[str, int]] = []
    keys = sorted(j.key for j in jobs)

    class Recorded(Simulation):
        def account(self, now: float) -> None:
            super().account(now)
            end = now + self.d.tick_s
            held = dict.fromkeys(keys, 0)
            for w in self.workers:  # at the end of the tick: a suspend that finished within it holds nothing
                if w.state != "suspended" and not w.evicted and not (w.state == "suspending" and w.free_at <= end):
                    held[w.job] += self.base[w.job].gpus_per_worker
            series.append(held)

    sim = Recorded(
        demands[first], jobs, cost, cfg, Policy("planned-oracle", "planned", "oracle"), bounds[first], more_pools=more
    )
    r = sim.run()
    named = [{k.split("/")[-1]: v for k, v in row.items()} for row in series]
    return {
        "planned_reclaims": r.planned_reclaims,
        "unplanned_reclaims": r.unplanned_reclaims,
        "serving_waits": len([w for w in r.waits if w > 0]),
        "suspends": r.suspends,
    }, named


# ----------------------------------------------------------------------------- the real side
class SimToReal(Soak):
    """The soak's harness with a static oracle forecast file instead of Prometheus + the predictor."""

    def __init__(self, p: Params, say: Callable[[str], None] = log) -> None:
        super().__init__(p, say)
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.forecast_file = p.workdir / "forecasts.json"
        self.first_targets: dict[str, int] = {}  # the simulation's GPUs per job at its first tick
        self.placements: list[str] = []  # each serving prepare: its GPU and what was lent on its node

    def _serving_metrics(self) -> None:  # no Prometheus: the forecasts come from the file
        self.tick_s = int(self.row_s)

    def _predictor(self) -> None:
        from rose_sim import forecasters

        self.horizons = [max(1, round(h / self.p.speed)) for h in HORIZONS_SIM_S]
        self.bounds = {pl: forecasters.oracle(self.busy[pl], tuple(self.horizons), self.tick_s) for pl in self.pools}
        self.write_forecasts(0)

    def write_forecasts(self, row: int) -> None:
        """What the oracle says at ``row`` of the played slice, as the predictor would serve it."""
        from rose_sim.engine import forecast_reply

        now = time.time()
        body = [
            json.loads(
                forecast_reply(self.bounds[pl], HISTORY_ROWS + row, now, RISK, self.cap[pl], pl).model_dump_json()
            )
            for pl in self.pools
        ]
        tmp = self.forecast_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"forecasts": body}))
        os.replace(tmp, self.forecast_file)

    def _common(self) -> list[str]:
        return [
            "--forecast-backend=static-file",
            f"--forecast-file={self.forecast_file}",
            f"--risk={RISK}",
            "--forecast-refresh=1",
            f"--forecast-max-age={self.p.forecast_max_age_s:g}",
            f"--kubeconfig={self.h.kubeconfig}",
        ]

    def restart_dead(self) -> None:  # no faults: a component that died is a failure
        for name in ("controller", "extender"):
            if not self.procs[name].alive():
                raise SoakFailure(f"{name} exited: {self.tmp / (name + '.log')}")

    def jobs_view(self) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
        view = super().jobs_view()
        self._view = view
        t = time.monotonic() - self.t_start
        self.samples.append(
            (t, {name: sum(1 for w in ws if w["state"] != "Suspended") for name, (_j, ws) in view.items()})
        )
        return view

    def run(self) -> dict[str, Any]:
        from kubernetes import client

        from rose_common import names

        self.say(
            f"played: rows {self.p.start_row}..{self.p.start_row + self.rows} of {self.p.series.name} "
            f"({self.p.hours:g} h at {self.p.speed:g}x = {self.duration_s:.0f} s, "
            f"a row every {self.tick_s} s)"
        )
        with ThreadPoolExecutor(max_workers=8) as self.pool:
            # the simulation starts with the jobs applied and serving at row 0: so does the real side
            self.t_start = time.monotonic() + 10 * self.duration_s  # row 0 until the clock starts
            self.write_forecasts(0)
            # serving first, prepared on its GPUs, as in a fleet that serves before RL arrives (jobs
            # applied together with serving race it for the GPUs: a worker placed on a GPU serving
            # then takes is refused its prepare until serving leaves)
            warm = time.monotonic()
            while not self.stop.is_set() and not self.serving_prepared():
                self.tick()
                if time.monotonic() - warm > 120:
                    self.fail("serving's row-0 pods were not all prepared within 120 s")
                    raise SoakFailure(str(self.failure))
            for name, lo, hi, prio in JOBS:
                client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                    names.GROUP, names.VERSION, NS, names.PLURAL, job_manifest(name, lo, hi, prio)
                )
            warm = time.monotonic()
            while not self.stop.is_set():
                self.write_forecasts(0)
                self.tick()
                if not self.at_target():
                    break
                if time.monotonic() - warm > 120:
                    # fail(): close() writes the cluster's view into the workdir
                    self.fail(f"the jobs did not reach the simulation's first targets within 120 s: {self.at_target()}")
                    raise SoakFailure(str(self.failure))
            self.samples.clear()
            self.t_start = time.monotonic()
            self.note(f"jobs at their first targets after {self.t_start - warm:.1f} s; the clock starts")
            row = 0
            # one tick past the slice (serving held at the last row): the counters catch up
            while time.monotonic() - self.t_start < self.duration_s + self.row_s and not self.stop.is_set():
                if self.row_now() != row:
                    row = self.row_now()
                    self.write_forecasts(row)
                self.tick()
            self.stop.set()
            events = self.events_log()
        if self.failure:
            raise SoakFailure(self.failure)
        counters, suspends, waits = self._read_counters()
        return {
            "reclaims": counters,
            "suspends": suspends,
            "serving_waits": waits,
            "serving_prepares_over_0_5s_wall": len(self.fig.serving_waits),
            "placements": self.placements,
            "serving_prepares": len(self.fig.serving_prepares),
            "samples": len(self.samples),
            "api_errors": self.api_errors,
            "prepare_errors": prepare_error_summary(self.fig.prepare_errors),
            "events": events,
        }

    def _read_counters(self) -> tuple[dict[str, int], int, int]:
        """The controller's reclaims by kind, the occupant suspends the drivers ran and the serving
        prepares that waited for one, read from their /metrics after the run."""
        from dra_driver.metrics import SUSPEND_OUTCOMES
        from rose_common import promtext

        _code, text = _get(f"http://127.0.0.1:{self.ctl_port}/metrics")
        counters = {
            k: int(promtext.value(text, "rose_controller_reclaims_total", {"kind": k}, default=0.0))
            for k in ("planned", "unplanned", "fallback")
        }
        suspends = waits = 0
        for drv in self.drivers.values():
            _code, text = _get(f"http://127.0.0.1:{drv.metrics_port}/metrics")
            # every occupant suspend the drivers ran, planned or not
            suspends += sum(
                int(promtext.value(text, "rose_driver_occupant_suspend_total", {"outcome": o}, default=0.0))
                for o in SUSPEND_OUTCOMES
            )
            # serving prepares that waited for an occupant's suspend: over 0.5 s inside the driver (a
            # suspend of the 64 GiB occupants takes 1.25 s; one without occupant to stop takes ms)
            cum = dict(promtext.buckets(text, "rose_driver_serving_wait_seconds"))
            waits += int(cum.get(math.inf, 0.0) - cum.get(WAITED_S, 0.0))
        return counters, suspends, waits

    def _check_serving_free(self, node: str, serving: dict[str, Any]) -> None:
        index = self._gpu_index(serving)
        with self.mu:
            lent = {
                r["pod"]: self._gpu_index(r["claim"])
                for r in self.prepared.values()
                if r["node"] == node and r["role"] != "serving"
            }
            served = sorted(
                self._gpu_index(r["claim"])
                for r in self.prepared.values()
                if r["node"] == node and r["role"] == "serving"
            )
        states = {w["name"]: w["state"] for _j, ws in getattr(self, "_view", {}).values() for w in ws}
        t = time.monotonic() - self.t_start
        self.placements.append(
            f"t{t:+7.1f}s row {int(t // self.row_s):3d} serving {serving['metadata']['name']} "
            f"on {node} GPU {index}; serving already on {served}; lent there: "
            + ", ".join(f"{p}@GPU{i} ({states.get(p, '?')})" for p, i in sorted(lent.items()))
        )
        super()._check_serving_free(node, serving)

    def serving_prepared(self) -> bool:
        """Every serving replica the trace wants now is prepared on a GPU."""
        with self.mu:
            n = sum(1 for r in self.prepared.values() if r["role"] == "serving")
        return bool(self.replicas) and n == sum(self.replicas.values())

    def row_now(self) -> int:
        return max(0, super().row_now())

    def at_target(self) -> str:
        """Why the jobs are not yet where the simulation's first tick put them ("" once they are:
        each at its planned target, holding the simulation's GPUs)."""
        from benchmarks.soak import job_converged

        view = self.jobs_view()
        if len(view) < len(JOBS):
            return "jobs not listed yet"
        for name, (j, ws) in sorted(view.items()):
            why = job_converged(j, ws)
            target, want = (j.get("status") or {}).get("targetGPUs") or 0, self.first_targets.get(name, 0)
            if why or target != want:
                return f"{name}: {why or f'target {target} GPUs, the simulation {want}'}"
        return ""

    def events_log(self) -> list[str]:
        """The namespace's Events (the controller's and the driver's decisions), seconds from the start."""
        from kubernetes import client

        try:
            items = client.CoreV1Api(self.api).list_namespaced_event(NS, _request_timeout=10).items
        except Exception as err:
            return [f"(events not listed: {type(err).__name__})"]
        wall0 = time.time() - (time.monotonic() - self.t_start)
        out = []
        for e in items:
            when = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
            t = when.timestamp() - wall0 if when else float("nan")
            if e.reason in ("Scheduled", "SuccessfulCreate", "ScalingReplicaSet", "SuccessfulDelete"):
                continue
            out.append(
                (
                    t,
                    f"t{t:+7.1f}s row {int(t // self.row_s):3d} {e.reason} {e.involved_object.name}: "
                    f"{(e.message or '')[:200]}",
                )
            )
        return [x for _t, x in sorted(out)]


def run(
    series: Path,
    hours: float,
    speed: float,
    workdir: Path,
    start_row: int = HISTORY_ROWS,
    tol: Tolerance = TOLERANCE,
    say: Callable[[str], None] = log,
    cluster: Any = None,
) -> dict[str, Any]:
    """Both sides over the same slice; the report (``ok``: every figure within the tolerance).
    ``cluster``: a running local cluster of the soak's shape (the e2e session's) instead of a new one."""
    row_s = ROW_S / speed
    if row_s != int(row_s) or row_s < 2:
        raise ValueError(
            f"--speed {speed:g}: one 10-minute row must last a whole number of seconds >= 2 (e.g. 60, 120)"
        )
    p = Params(
        series,
        hours=hours,
        speed=speed,
        faults=0,
        seed=0,
        workdir=workdir,
        start_row=start_row,
        simulate=False,
        plan_interval_s=PLAN_INTERVAL_S,
        forecast_max_age_s=max(20.0, 4 * row_s),
        cluster=cluster,
        timeslice=False,
        gpus_per_node=2,
    )
    s = SimToReal(p, say)
    t0 = time.monotonic()
    dwell = float(max(1, round(300 / speed)))
    try:
        s.setup()
        busy = {pl: (s.cap[pl], s.busy[pl]) for pl in s.pools}
        t_sim = time.perf_counter()
        sim_raw, sim_series = simulate(busy, int(row_s), tuple(s.horizons), dwell)
        sim_s = time.perf_counter() - t_sim
        sim_series = sim_series[: s.rows]
        s.first_targets = dict(sim_series[0])
        real_raw = s.run()
    finally:
        s.close()
    wall = time.monotonic() - t0
    jobs = [n for n, *_ in JOBS]
    real_series = tick_series(s.samples, s.rows, row_s, jobs)
    planned = real_raw["reclaims"]["planned"]
    # unplanned on the real side: the drivers' suspends that no planned reclaim asked for (a serving
    # prepare's suspend needs no request, so the controller's own "unplanned" counter misses it)
    real = {
        **series_figures(real_series, ROW_S),
        "planned_reclaims": planned,
        "suspends": real_raw["suspends"],
        "unplanned_reclaims": max(0, real_raw["suspends"] - planned),
        "serving_waits": real_raw["serving_waits"],
    }
    sim = {**series_figures(sim_series, ROW_S), **sim_raw}
    rows = compare(real, sim, tol, ROW_S)
    return {
        "ok": all(r["ok"] for r in rows),
        "series": str(series),
        "hours": hours,
        "speed": speed,
        "rows": s.rows,
        "start_row": start_row,
        "tick_wall_s": row_s,
        "wall_s": round(wall, 1),
        "sim_s": round(sim_s, 3),
        "tolerance": vars(tol),
        "comparison": rows,
        "real": {**real, **real_raw},
        "sim": sim,
        "per_tick": {"real": real_series, "sim": sim_series},
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_to_real", description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=Path, required=True, help="a 10-minute trace CSV (../shared/data/traces/derived/)")
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours to play (3)")
    ap.add_argument("--speed", type=float, default=60.0, help="time compression; 600/speed whole seconds (60)")
    ap.add_argument("--start-row", type=int, default=HISTORY_ROWS, help="first played row (after a week of history)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    a = ap.parse_args(argv)
    if not a.series.is_file():
        print(f"sim_to_real: no such series file: {a.series}", file=sys.stderr)
        return 2
    import tempfile

    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="sim2real-"))
    try:
        r = run(a.series, a.hours, a.speed, workdir, a.start_row)
    except (ValueError, SoakFailure) as e:
        print(f"sim_to_real: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    table = markdown(r["comparison"])
    print(table)
    print(f"{'WITHIN' if r['ok'] else 'OUTSIDE'} the tolerance; wall {r['wall_s']} s")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    if a.markdown:
        a.markdown.write_text(table)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["TOLERANCE", "Tolerance", "compare", "markdown", "run", "series_figures", "tick_series"]
