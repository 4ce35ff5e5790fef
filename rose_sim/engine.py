"""The simulation: one pool, its serving demand, the RL jobs, one policy; tick by tick.

I/O boundary: none. Every tick (``Demand.tick_s``, default 60 s), in this order:

1. transitions that finished by now take effect (a suspend's GPU is free, a pod started, a resume done);
2. the policy decides. ROSE's policies build the controller's planner input (each job through
   ``observe.planner_job``, the forecast through ``pools.to_forecast`` from a predictor-shaped reply)
   and call ``planner.plan``; ``reactive`` and ``evict-restart`` drop its planned reclaims with
   ``planner.without_reclaims`` (``rose controller --planner=off``);
3. serving arrives with the tick's demand. GPUs it needs that RL still holds are taken back
   *unplanned*: a suspend already under way is waited for; otherwise ``planner.plan`` with the demand
   of now picks the victims (cheapest first, whole gangs at ``minGPUs``, as the planner orders
   them), and serving waits for each: safe point + pinning + the state over PCIe (ROSE) or the
   process's exit (evict-restart, which also loses the job's work since its last checkpoint);
4. the tick is accounted: each worker's productive seconds (not while its pod starts, its world
   changes, its state moves, or it waits for a checkpoint restore), scaled by the scaling
   efficiency per job, less the checkpoint stall.

Policies: ``no-lending``; ``dedicated`` (a static split sized from the history: RL keeps
``pool - ceil(history peak)`` GPUs, serving the rest, and waits when it needs more);
``evict-restart`` (grow into what is idle now, preempt by eviction, restart from the last periodic
checkpoint: Kueue / KAI); ``reactive`` (ROSE with the planner off: suspend when serving arrives);
``planned-<forecaster>`` (ROSE's planner fed that forecaster at the operator's risk);
``evict-planned-<forecaster>`` (the same planner and forecaster, but every reclaim evicts: a
scheduler that had ROSE's forecast and no suspend, compared at about equal serving waits).

A job with ``spec.roles`` is planned as the controller plans it (``observe.role_planner_jobs``:
``<key>#trainer`` and ``<key>#rollout``, workers named by ``workers.worker_name``); its costs and
progress per role are :meth:`Simulation.remove_rollout`, :meth:`Simulation.pull_s` and
:meth:`Simulation.account_roles` (docs/simulate.md "Jobs with roles").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

import numpy as np

from dra_driver.suspend.budget import fits
from elastic_controller import pools as ec_pools
from elastic_controller.observe import planner_job, role_planner_jobs
from elastic_controller.planner import (
    ROLE_ROLLOUT,
    ROLE_SEP,
    ROLE_TRAINER,
    Forecast,
    Job,
    JobTarget,
    Plan,
    PlanInput,
    Pool,
    Settings,
    Worker,
    plan,
    role_key,
    without_reclaims,
)
from elastic_controller.workers import worker_name
from rose_common.forecast_api import ForecastPoint, ForecastResponse
from rose_sim.forecasters import Bounds
from rose_sim.inputs import DAY, CostModel, Demand, SimInputError, SimJob, role_views
from scheduler_extender.forecast import reduce as extender_forecast
from scheduler_extender.model import NodeState, PodInfo, PodKind
from scheduler_extender.policy import PolicyConfig, build_snapshot, filter_nodes, pool_outlooks

POOL = "serving"
PolicyKind = Literal["no-lending", "dedicated", "evict-restart", "evict-planned", "reactive", "planned"]
QUANTILE = "0.9"  # the controller's --quantile (unused at a risk the reply carries)


@dataclass(frozen=True)
class Policy:
    name: str
    kind: PolicyKind
    forecaster: str | None = None  # planned: which Bounds; reactive and evict-restart: persistence


@dataclass(frozen=True)
class SimConfig:
    pool_gpus: int = 64
    risk: str = "0.01"  # the operator's risk, a wire key: the forecast's gpus_needed at it
    dwell_s: float = 300.0  # the controller's --dwell
    pool_name: str = POOL  # the pool's name (its GPUs' rose.io/gpu-pool label)
    refit_every_s: int = 86400  # the predictor's model: refit this often (the service's default is 1 h)
    host_memory_bytes: int | None = None  # host memory for suspended state, the pool's nodes together (None: no limit)
    # the planner's forecast step (None: the tick). The controller maps every reply onto
    # ``elastic_controller.pools.STEP_S`` (60 s) steps whatever its plan interval; a simulation at
    # another tick that must decide as the controller does (benchmarks.sim_to_real) sets that here
    forecast_step_s: float | None = None


@dataclass(frozen=True)
class PoolInput:
    """One more pool beside the primary (``SimConfig.pool_name`` / ``pool_gpus``): its GPUs, its serving
    demand (on the primary's tick grid) and every forecaster's bounds over it."""

    name: str
    gpus: int
    demand: Demand
    bounds: dict[str, Bounds]


@dataclass
class _Lane:
    """A pool as the simulation tracks it."""

    name: str
    gpus: int
    demand: Demand
    bounds: Bounds | None  # the policy's forecaster over this pool (None: dedicated)
    rl_gpus: int  # dedicated: RL's static share of the pool
    short_open: list[float] = field(default_factory=list)  # dedicated: serving GPUs waiting since


@dataclass
class _W:
    """A worker as the simulation tracks it (the planner sees ``planner_state``)."""

    name: str
    job: str
    state: Literal["pending", "active", "resuming", "suspending", "suspended"]
    ready_at: float  # productive from here (pod start, world change, resume, restore)
    pod_ready_at: float = 0.0  # pending -> active (the pod runs)
    stop_at: float = math.inf  # suspending: productive until its safe point
    free_at: float = 0.0  # suspending: the GPU is free from here
    evicted: bool = False  # evict-restart: gone once the GPU is free, never resumed
    pool: str = POOL  # the pool the planner placed it in


@dataclass
class Result:
    policy: str
    useful_gpu_s: float = 0.0
    steps: float = 0.0
    lent_gpu_s: float = 0.0  # GPU-seconds RL held (transitions included)
    productive_gpu_s: float = 0.0  # GPU-seconds RL computed (before scaling efficiency)
    serving_gpu_s: float = 0.0
    waits: list[float] = field(default_factory=list)  # one per serving GPU that waited, seconds
    suspends: int = 0
    evictions: int = 0
    lost_gpu_s: float = 0.0
    planned_reclaims: int = 0
    unplanned_reclaims: int = 0
    host_bytes_peak: int = 0
    host_fallbacks: int = 0  # suspends refused for host memory: checkpoint-and-evict instead
    extender_checked: int = 0  # new workers the extender's filter was asked about (measured, not enforced)
    extender_refusals: int = 0  # of which it would have refused
    over_capacity_gpu_s: float = 0.0  # serving beyond the whole pool: no policy's doing
    plan_s: float = 0.0
    plans: int = 0
    steps_by_job: dict[str, float] = field(default_factory=dict)
    lent_by_pool: dict[str, float] = field(default_factory=dict)  # GPU-seconds RL held, per pool
    by_role: dict[str, dict[str, int]] = field(default_factory=dict)  # jobs with roles: actions per role

    def report(self, seconds: float, pool_gpus: int) -> dict[str, float | int | dict[str, float]]:
        days = seconds / DAY
        w = np.asarray(self.waits) if self.waits else np.zeros(0)
        return {
            "rl_useful_gpu_hours": round(self.useful_gpu_s / 3600, 1),
            "rl_steps": round(self.steps),
            "rl_lent_gpu_hours": round(self.lent_gpu_s / 3600, 1),
            "rl_lost_gpu_hours": round(self.lost_gpu_s / 3600, 1),
            "pool_duty_cycle": round((self.serving_gpu_s + self.productive_gpu_s) / (pool_gpus * seconds), 4),
            "serving_waits": len(self.waits),
            "serving_wait_gpu_seconds": round(float(w.sum()), 1),
            "serving_wait_p99_s": round(float(np.quantile(w, 0.99)), 2) if len(w) else 0.0,
            "serving_waits_per_day": round(len(self.waits) / days, 2),
            "suspends": self.suspends,
            "suspends_per_day": round(self.suspends / days, 1),
            "evictions_per_day": round(self.evictions / days, 1),
            "planned_reclaims": self.planned_reclaims,
            "unplanned_reclaims": self.unplanned_reclaims,
            "host_memory_peak_gib": round(self.host_bytes_peak / 2**30, 1),
            "host_memory_fallbacks": self.host_fallbacks,
            "host_memory_fallbacks_per_day": round(self.host_fallbacks / days, 2),
            "extender_checked": self.extender_checked,
            "extender_refusals": self.extender_refusals,
            "over_capacity_gpu_seconds": round(self.over_capacity_gpu_s, 1),
            "plan_ms_mean": round(1000 * self.plan_s / self.plans, 3) if self.plans else 0.0,
            "steps_by_job": {k: round(v) for k, v in sorted(self.steps_by_job.items())},
            "rl_lent_gpu_hours_by_pool": {k: round(v / 3600, 1) for k, v in sorted(self.lent_by_pool.items())},
            **({"role_actions": self.role_actions()} if self.by_role else {}),
        }

    def role_actions(self) -> dict[str, float]:
        """Jobs with roles: actions per role, ``<role>_<action>`` (e.g. ``rollout_removals``)."""
        return {f"{r}_{what}": n for r, acts in sorted(self.by_role.items()) for what, n in sorted(acts.items())}


def forecast_reply(bounds: Bounds, i: int, now: float, risk: str, pool_gpus: int, pool: str = POOL) -> ForecastResponse:
    """What the predictor would serve at tick ``i``: per horizon the GPUs needed at ``risk``."""
    at = datetime.fromtimestamp(now, UTC)
    row = bounds.values[i]
    points = [
        ForecastPoint(
            horizon_seconds=h,
            timestamp=datetime.fromtimestamp(now + h, UTC),
            quantiles={QUANTILE: float(v)},
            gpus_needed={risk: int(min(v, 1e9))},
        )
        for h, v in zip(bounds.horizons_s, row, strict=True)
    ]
    return ForecastResponse(
        pool=pool,
        model_version=bounds.name,
        generated_at=at,
        last_observation_at=at,
        data_age_seconds=0.0,
        stale=False,
        current=None,
        points=points,
    )


class Simulation:
    """One policy over the evaluated ticks of one demand series."""

    def __init__(
        self,
        demand: Demand,
        jobs: list[SimJob],
        cost: CostModel,
        cfg: SimConfig,
        policy: Policy,
        bounds: dict[str, Bounds],
        record: bool = False,
        more_pools: tuple[PoolInput, ...] = (),
    ) -> None:
        self.record = record  # keep every decision (the leak test compares them)
        self.decisions: list[tuple[float, str, dict[str, JobTarget]]] = []
        self.d, self.cost, self.cfg, self.policy = demand, cost, cfg, policy
        self.sims = {v.key: v for j in jobs for v in role_views(j)}  # a job with roles: one per lent role
        self.base = planner_jobs(jobs)
        self.roles = {j.key: j for j in jobs if j.job.spec.roles is not None}
        self.last_shrink: dict[str, float | None] = dict.fromkeys(self.sims)
        self.workers: list[_W] = []
        self.r = Result(policy.name, steps_by_job=dict.fromkeys((j.key for j in jobs), 0.0))
        self.settings = Settings(dwell_s=cfg.dwell_s, interval_s=float(demand.tick_s))
        self.evict = policy.kind in ("evict-restart", "evict-planned")
        self.lanes = [self._lane(cfg.pool_name, cfg.pool_gpus, demand, bounds)]
        for more in more_pools:
            d = more.demand
            if (d.start, d.tick_s, d.ticks, d.history) != (demand.start, demand.tick_s, demand.ticks, demand.history):
                raise SimInputError(f"pool {more.name}: its series must span the same time as {cfg.pool_name}'s")
            if more.name in {x.name for x in self.lanes}:
                raise SimInputError(f"pool {more.name} is defined twice")
            self.lanes.append(self._lane(more.name, more.gpus, d, more.bounds))
        self.r.lent_by_pool = {x.name: 0.0 for x in self.lanes}
        self.since_ckpt = dict.fromkeys(self.sims, 0.0)  # evict-restart: useful GPU-s not yet checkpointed
        self.since_steps = dict.fromkeys(self.sims, 0.0)  # and its steps
        self.last_ckpt = dict.fromkeys(self.sims, 0.0)
        self.restores = dict.fromkeys(self.sims, 0)  # workers checkpointed and evicted, owed a restore on return

    def _lane(self, name: str, gpus: int, demand: Demand, bounds: dict[str, Bounds]) -> _Lane:
        if self.policy.kind == "dedicated":  # a static split sized from the history
            rl = max(0, gpus - math.ceil(float(np.max(demand.busy[: demand.history]))))
            return _Lane(name, gpus, demand, None, rl)
        return _Lane(name, gpus, demand, bounds.get(self.policy.forecaster or "persistence"), 0)

    @property
    def pool_gpus(self) -> int:
        return sum(x.gpus for x in self.lanes)

    # ------------------------------------------------------------------ planner plumbing
    def jobs(self) -> tuple[Job, ...]:
        """The controller's view of each job (``observe.planner_job``): the seconds to a safe point
        are what its running workers report (at worst the safe-point period), 0 with none running."""
        running = {w.job for w in self.workers if w.state == "active"}
        return tuple(
            replace(
                self.base[k],
                last_shrink_at=self.last_shrink[k],
                seconds_to_safe_point=self.sims[k].safe_wait_s if k in running else 0.0,
            )
            for k in sorted(self.base)
        )

    def planner_workers(self) -> tuple[Worker, ...]:
        return tuple(
            Worker(w.name, w.job, w.state, w.pool) for w in sorted(self.workers, key=lambda w: w.name) if not w.evicted
        )

    def new_name(self, key: str) -> str:
        """``<job>-w<lowest free index>`` (a role's ``<job>-<role>-<index>``), as the controller names a
        new worker (``desired``, ``workers.worker_name``)."""
        sim = self.sims[key]
        used = {w.name for w in self.workers if w.job == key}
        i = 0
        while worker_name(sim.job.name, i, sim.role) in used:
            i += 1
        return worker_name(sim.job.name, i, sim.role)

    def run_plan(self, inp: PlanInput, what: str = "plan") -> Plan:
        started = time.perf_counter()
        p = plan(inp)
        self.r.plan_s += time.perf_counter() - started
        self.r.plans += 1
        if self.record:
            self.decisions.append((inp.now, what, p.targets))
        return p

    def pool(self, lane: _Lane, i: int, now: float) -> Pool:
        if self.policy.kind == "dedicated":  # RL's own GPUs: nobody else needs them
            return Pool(lane.name, lane.rl_gpus, Forecast(now, float(self.d.tick_s), (0.0,) * 60, "dedicated"))
        assert lane.bounds is not None
        reply = forecast_reply(lane.bounds, i, now, self.cfg.risk, lane.gpus, lane.name)
        step = float(self.cfg.forecast_step_s or self.d.tick_s)
        return Pool(lane.name, lane.gpus, ec_pools.to_forecast(reply, QUANTILE, step, self.cfg.risk))

    def plan_input(self, i: int, now: float) -> PlanInput:
        pools = tuple(self.pool(x, i, now) for x in self.lanes)
        return PlanInput(now, pools, self.jobs(), self.planner_workers(), self.settings)

    def extender_refuses(self, key: str, pool: str, i: int, now: float, added: int) -> bool:
        """Would the extender's filter (``scheduler_extender.policy``, called) refuse a new worker of
        ``key`` in ``pool`` now? The pool as one node: its GPUs, serving's GPUs as last observed, RL's
        (``added`` more placed by this plan), the predictor reply reduced as the extender reduces it."""
        lane = next(x for x in self.lanes if x.name == pool)
        if lane.bounds is None:
            return False
        g = self.base[key].gpus_per_worker
        lent = added + sum(
            self.base[w.job].gpus_per_worker
            for w in self.workers
            if w.pool == pool and w.state != "suspended" and not w.evicted
        )
        serving = int(min(lane.gpus, lane.demand.busy[i - 1]))
        node = NodeState(pool, pool, lane.gpus, serving, lent, max(0, lane.gpus - serving - lent), None, 0.0)
        cfg = PolicyConfig()
        snapshot = build_snapshot({pool: node}, {}, cfg)
        reply = forecast_reply(lane.bounds, i, now, self.cfg.risk, lane.gpus, pool)
        outlooks, _ = pool_outlooks(snapshot, {pool: extender_forecast(reply, QUANTILE, self.cfg.risk)}, g, cfg)
        j = self.sims[key]
        pod = PodInfo(
            j.job.namespace,
            key,
            key,
            PodKind.RL,
            job=j.job.name,
            gpus=g,
            state_bytes=j.state_bytes,
            grace_s=float(j.job.spec.graceful_shutdown_period),
            min_run_s=float(j.job.spec.min_useful_run_seconds),
        )
        return not filter_nodes(pod, [pool], snapshot, outlooks, cfg).passed

    def decide(self, i: int, now: float) -> Plan | None:
        if self.policy.kind == "no-lending":
            return None
        p = self.run_plan(self.plan_input(i, now))
        if self.policy.kind in ("reactive", "evict-restart"):
            p = without_reclaims(p, {k: j.gpus_per_worker for k, j in self.base.items()})
        return p

    # ------------------------------------------------------------------ carrying out
    def settle(self, now: float) -> None:
        out = []
        for w in self.workers:
            if w.state == "suspending" and w.free_at <= now:
                if w.evicted:
                    continue
                w.state = "suspended"
            elif (w.state == "pending" and w.pod_ready_at <= now) or (w.state == "resuming" and w.ready_at <= now):
                w.state = "active"
            out.append(w)
        self.workers = out

    def take_off(self, w: _W, now: float) -> float:
        """Suspend (ROSE) or evict (evict-restart) ``w``; the seconds until its GPU is free."""
        sim = self.sims[w.job]
        if w.state == "pending":  # a pod not started yet: removed at once
            self.workers.remove(w)
            return 0.0
        if self.evict:
            wait = self.cost.evict_s
            w.evicted, w.state, w.stop_at, w.free_at = True, "suspending", now, now + wait
            self.r.evictions += 1
            self.count_role(w.job, "evictions")
            self._restart(w.job, now)
            return wait
        limit = self.cfg.host_memory_bytes
        if limit is not None and not fits(limit, self.host_bytes(), sim.state_bytes):
            # the driver's fallback: a durable checkpoint at the safe point, then the eviction; nothing is lost
            wait = sim.safe_wait_s + self.cost.checkpoint_s(sim.state_bytes) + self.cost.evict_s
            w.evicted, w.state, w.stop_at, w.free_at = True, "suspending", now + sim.safe_wait_s, now + wait
            self.r.host_fallbacks += 1
            self.restores[w.job] += 1
            return wait
        wait = self.cost.suspend_s(sim.state_bytes, sim.safe_wait_s)
        w.state, w.stop_at, w.free_at = "suspending", now + sim.safe_wait_s, now + wait
        self.r.suspends += 1
        self.count_role(w.job, "suspends")
        return wait

    def host_bytes(self) -> int:
        """Host memory suspended state holds now (a suspend under way has reserved its share)."""
        return sum(
            self.sims[w.job].state_bytes
            for w in self.workers
            if w.state == "suspended" or (w.state == "suspending" and not w.evicted)
        )

    def _restart(self, job: str, now: float) -> None:
        """An eviction: the job's work since its last checkpoint is lost; who remains reloads it
        (a rollout worker holds no training progress: only its in-flight generations go)."""
        if self.sims[job].role == ROLE_ROLLOUT:
            return
        self.r.lost_gpu_s += self.since_ckpt[job]
        self.since_ckpt[job] = self.since_steps[job] = 0.0
        restore = self.cost.checkpoint_s(self.sims[job].state_bytes)
        for x in self.workers:
            if x.job == job and x.state in ("active", "resuming", "pending") and not x.evicted:
                x.ready_at = max(x.ready_at, now + self.cost.world_change_s + restore)

    def check_extender(self, p: Plan, i: int, now: float) -> None:
        """Measured, not enforced: how many of the plan's new workers the extender would refuse."""
        if self.policy.kind == "dedicated":
            return
        added: dict[str, int] = {}
        for key, t in p.targets.items():
            for pool in t.add:
                self.r.extender_checked += 1
                self.r.extender_refusals += self.extender_refuses(key, pool, i, now, added.get(pool, 0))
                added[pool] = added.get(pool, 0) + self.base[key].gpus_per_worker

    def carry_out(self, p: Plan, now: float) -> None:
        by_name = {w.name: w for w in self.workers if not w.evicted}
        for key, t in p.targets.items():
            sim = self.sims[key]
            changed = bool(t.suspend or t.remove or t.resume or t.add)
            for n in t.remove:
                if n in by_name and self.remove_rollout(by_name[n], now) is None:
                    self.workers.remove(by_name[n])
            for n in t.suspend:
                if n in by_name and by_name[n].state != "suspending":
                    self.take_off(by_name[n], now)
            for n in t.resume:
                w = by_name[n]
                w.state, w.ready_at, w.stop_at = "resuming", now + self.cost.transfer_s(sim.state_bytes), math.inf
            for pool_name in t.add:
                start = now + self.cost.pod_start_s
                restore = self.cost.checkpoint_s(sim.state_bytes) if self.evict or self.restores[key] else 0.0
                self.restores[key] = max(0, self.restores[key] - 1)
                self.workers.append(
                    _W(
                        self.new_name(key),
                        key,
                        "pending",
                        start + restore + self.pull_s(key),
                        pod_ready_at=start,
                        pool=pool_name,
                    )
                )
                self.count_role(key, "adds")
            if changed:
                for w in self.workers:
                    if w.job == key and w.state in ("active", "resuming", "pending") and not w.evicted:
                        w.ready_at = max(w.ready_at, now + self.cost.world_change_s)
            if t.shrinks:
                self.last_shrink[key] = now
        self.r.planned_reclaims += sum(len(r.workers) for r in p.reclaims)

    # ------------------------------------------------------------------ serving
    def serving(self, i: int, now: float) -> None:
        for lane in self.lanes:
            self._serve(lane, i, now)

    def _serve(self, lane: _Lane, i: int, now: float) -> None:
        """Serving arrives in one pool: GPUs it needs that RL holds there are taken back unplanned."""
        demand = float(lane.demand.busy[i])
        pool = lane.gpus
        over = max(0.0, demand - pool)
        self.r.over_capacity_gpu_s += over * self.d.tick_s
        need = min(demand, pool)
        self.r.serving_gpu_s += need * self.d.tick_s
        if self.policy.kind == "dedicated":
            self._dedicated_short(lane, need - (pool - lane.rl_gpus), now)
            return
        gpw = {k: j.gpus_per_worker for k, j in self.base.items()}
        here = [w for w in self.workers if w.pool == lane.name]
        occupied = sum(gpw[w.job] for w in here if w.state != "suspended")
        short = int(need - (pool - occupied))
        if short <= 0:
            return
        for w in sorted((w for w in here if w.state == "suspending"), key=lambda w: w.free_at):
            if short <= 0:
                return
            take = min(short, gpw[w.job])
            self.r.waits += [w.free_at - now] * take  # > 0: settle() freed the finished ones
            short -= take
        if short <= 0:
            return
        actual = Forecast(now, float(self.d.tick_s), (need, need), "actual")
        # the other pools frozen: the planner picks this pool's victims and decides nothing elsewhere
        pools = tuple(
            Pool(lane.name, pool, actual) if x is lane else replace(self.pool(x, i, now), frozen=True)
            for x in self.lanes
        )
        p = self.run_plan(PlanInput(now, pools, self.jobs(), self.planner_workers(), self.settings), "unplanned")
        for key, t in p.targets.items():
            names = set(t.suspend) | set(t.remove)
            for w in [w for w in here if w.job == key and w.name in names and w.state != "suspending"]:
                wait = self.remove_rollout(w, now) if w.name in t.remove else None
                if wait is None:
                    wait = self.take_off(w, now)
                self.r.unplanned_reclaims += gpw[key]
                take = min(max(short, 0), gpw[key])
                self.r.waits += [wait] * take if wait > 0 else []
                short -= take
            if t.shrinks:
                self.last_shrink[key] = now

    def _dedicated_short(self, lane: _Lane, short: float, now: float) -> None:
        """Serving's partition is too small: each GPU short waits until demand falls back."""
        n = max(0, int(short))
        while len(lane.short_open) > n:
            self.r.waits.append(now - lane.short_open.pop())
        while len(lane.short_open) < n:
            lane.short_open.append(now)

    # ------------------------------------------------------------------ accounting
    def account(self, now: float) -> None:
        tick = float(self.d.tick_s)
        end = now + tick
        per_job: dict[str, float] = {}
        held = 0.0
        host = self.host_bytes()
        for w in self.workers:
            g = self.base[w.job].gpus_per_worker
            if w.state != "suspended":
                gs = g * (min(end, w.free_at) - now if w.state == "suspending" else tick)
                held += gs
                self.r.lent_by_pool[w.pool] = self.r.lent_by_pool.get(w.pool, 0.0) + gs
            t0, t1 = max(now, w.ready_at), min(end, w.stop_at)
            if w.state != "suspended" and t1 > t0:
                per_job[w.job] = per_job.get(w.job, 0.0) + (t1 - t0) / tick
        self.r.lent_gpu_s += held
        self.r.host_bytes_peak = max(self.r.host_bytes_peak, host)
        for key, workers in per_job.items():
            sim, g = self.sims[key], self.base[key].gpus_per_worker
            self.r.productive_gpu_s += workers * g * tick
            if sim.role is not None:  # a job with roles: its progress is the trainer's (account_roles)
                continue
            ckpt = 1.0 - min(1.0, self.cost.checkpoint_s(sim.state_bytes) / sim.checkpoint_interval_s)
            useful_worker_s = self.cost.throughput(workers) * tick * ckpt
            self.since_ckpt[key] += useful_worker_s * g
            self.since_steps[key] += useful_worker_s / sim.step_seconds
            if not self.evict:  # suspend loses nothing: all of it counts at once
                self._commit(key)
        self.account_roles(per_job, tick)
        if self.evict:
            for key, sim in self.sims.items():
                if end - self.last_ckpt[key] >= sim.checkpoint_interval_s:
                    self._commit(key)
                    self.last_ckpt[key] = end

    def _commit(self, key: str) -> None:
        self.r.useful_gpu_s += self.since_ckpt[key]
        self.r.steps += self.since_steps[key]
        self.r.steps_by_job[key.partition(ROLE_SEP)[0]] += self.since_steps[key]  # a role's: its job's
        self.since_ckpt[key] = self.since_steps[key] = 0.0

    # ------------------------------------------------------------------ jobs with roles
    def count_role(self, key: str, what: str) -> None:
        """One action on a worker of a role (``suspends``, ``removals``, ``evictions``, ``adds``)."""
        role = self.sims[key].role
        if role is not None:
            mine = self.r.by_role.setdefault(role, {})
            mine[what] = mine.get(what, 0) + 1

    def pull_s(self, key: str) -> float:
        """A new rollout worker pulls the policy weights before its first sample (after its pod starts)."""
        return self.cost.weight_pull_s if self.sims[key].role == ROLE_ROLLOUT else 0.0

    def remove_rollout(self, w: _W, now: float) -> float | None:
        """A running rollout worker the planner removes (``reclaim: Remove``): its pod is deleted, its
        in-flight generations go back to the queue, the GPU is free once the process exits
        (``evict_s``); a new one later pays pod start + weight pull. None: not a running rollout
        worker (the caller's own path: a pending pod, a suspended one, or a job without roles)."""
        if self.sims[w.job].role != ROLE_ROLLOUT or w.state not in ("active", "resuming"):
            return None
        wait = self.cost.evict_s
        w.evicted, w.state, w.stop_at, w.free_at = True, "suspending", now, now + wait
        self.count_role(w.job, "removals")
        return wait

    def account_roles(self, per_job: dict[str, float], tick: float) -> None:
        """The progress of each job with roles this tick (docs/simulate.md "Jobs with roles"). ``f``: the
        trainer's gang computing (workers' worth of the tick / its workers; 1 when Dedicated: its own
        GPUs, outside the pool); ``n``: rollout workers' worth. Steps: ``f x min(1, throughput(n) /
        throughput(maxWorkers)) x tick / step-seconds``, less the trainer's checkpoint stall (the
        trainer is sample-bound below maxWorkers rollouts; with no rollout, no step). Useful GPU-s: the
        pool's GPUs of the trainer + ``throughput(n) x gpusPerWorker`` of the rollouts, times ``f``."""
        for key, j in self.roles.items():
            roles = j.job.spec.roles
            assert roles is not None
            t, ro = roles.trainer, roles.rollout
            tk, rk = role_key(key, ROLE_TRAINER), role_key(key, ROLE_ROLLOUT)
            lent = tk in self.sims  # not Dedicated
            f = min(1.0, per_job.get(tk, 0.0) / t.workers) if lent else 1.0
            n = per_job.get(rk, 0.0)
            if f <= 0 or n <= 0:
                continue
            state = j.job.spec.role_state_bytes("trainer") or 0
            ckpt = 1.0 - min(1.0, self.cost.checkpoint_s(state) / j.checkpoint_interval_s)
            rate = min(1.0, self.cost.throughput(n) / self.cost.throughput(float(ro.max_workers)))
            gpus = (t.workers * t.gpus_per_worker if lent else 0) + self.cost.throughput(n) * ro.gpus_per_worker
            progress = tk if lent else rk  # an eviction of the trainer loses it; of a rollout, nothing
            self.since_ckpt[progress] += f * gpus * tick * ckpt
            self.since_steps[progress] += f * rate * tick / j.step_seconds * ckpt
            if not self.evict:
                self._commit(progress)

    def run(self) -> Result:
        tick = self.d.tick_s
        first = self.d.history
        for key in self.last_ckpt:
            self.last_ckpt[key] = float(self.d.start + first * tick)
        for i in range(first, self.d.ticks):
            now = float(self.d.start + i * tick)
            self.settle(now)
            p = self.decide(i, now)
            if p is not None:
                self.check_extender(p, i, now)
                self.carry_out(p, now)
            self.serving(i, now)
            self.account(now)
        end = float(self.d.start + self.d.ticks * tick)
        for lane in self.lanes:
            for start in lane.short_open:
                self.r.waits.append(end - start)
        for key in self.sims:  # what is not checkpointed at the end still counts (the run stops, not evicted)
            self._commit(key)
        return self.r


def planner_jobs(jobs: list[SimJob]) -> dict[str, Job]:
    """The planner's jobs by key, as the controller maps them: ``observe.planner_job``, or for a job
    with ``spec.roles`` ``observe.role_planner_jobs`` (its lent roles, ``<key>#<role>``; no pod has
    reported yet: the spec's sizes, class priority 0)."""
    out: dict[str, Job] = {}
    for j in jobs:
        mine = role_planner_jobs(j.job, []) if j.job.spec.roles is not None else [planner_job(j.job)]
        out.update((x.key, x) for x in mine)
    return out


def default_policies(forecasters: tuple[str, ...]) -> tuple[Policy, ...]:
    """The policies side by side; the evict-and-restart twin of the last deployable forecaster
    (model, else baseline) compares suspend with eviction at about equal serving waits."""
    deployable = [f for f in forecasters if f != "oracle"]
    twin = (Policy(f"evict-planned-{deployable[-1]}", "evict-planned", deployable[-1]),) if deployable else ()
    return (
        Policy("no-lending", "no-lending"),
        Policy("dedicated", "dedicated"),
        Policy("evict-restart", "evict-restart", "persistence"),
        Policy("reactive", "reactive", "persistence"),
        *(Policy(f"planned-{f}", "planned", f) for f in forecasters),
        *twin,
    )
