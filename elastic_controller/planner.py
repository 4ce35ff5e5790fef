"""The reclaim planner: which lent GPUs to give back now, and which jobs may grow or resume.

I/O boundary: none. Pure function :func:`plan` of frozen dataclasses (forecasts per pool,
capacity, the lent workers and their jobs, ``now``) to a :class:`Plan`; no clock, no client,
no threads. The controller's plan loop and ``rose simulate`` (``rose_sim``; also through
``benchmarks/planner_replay.py``) call the same function.

Rules (issue 10 §2; issue 22 §4-§6 for what one job's inputs may do to the others):

- **Planned reclaim.** In each pool, serving may need ``ceil(peak)`` GPUs over ``[now, now +
  lead]``, where ``peak`` is the forecast's upper quantile and ``lead`` the longest grace period
  + estimated suspend time of the pool's occupants *whose own lead the forecast covers*, plus the
  time to the next plan (``Settings.interval_s``). Lent GPUs above ``capacity - ceil(peak)``
  are reclaimed *now*, cheapest first (:meth:`Job.cost`): lower class priority (the pods'
  PriorityClass, admin-controlled), smaller state, then ``spec.priority`` only among jobs of one
  namespace, nearer its safe point.
- **One job's lead is its own problem.** A job whose lead reaches past a pool's forecast horizon
  is not lent there, and its workers there are reclaimed; it never makes the pool's need
  infinite for the other tenants.
- **No forecast, no decisions.** A pool whose forecast does not cover the next plan interval
  (``Pool.frozen``, or a stale or missing forecast) is frozen: no grants and no planned reclaims
  there; serving still wins at the driver's prepare.
- **Shrink before suspend.** A worker of a job that stays at or above ``minGPUs`` without it is
  suspended alone first (its pod and state kept, so a regrow resumes it); only when no such
  worker is left in the pool is a whole gang suspended. Pending workers are removed, not suspended.
- **Grow and resume** only where the forecast leaves room for the job's ``minUsefulRunSeconds``
  after its lead time; never above ``maxGPUs``; from zero, ``minGPUs`` at once or nothing. A
  suspended worker is never removed to grow elsewhere: active + suspended stay within ``maxGPUs``,
  and a suspended worker waits for room in its own pool (its pod holds its state).
- **A lent claim's GPU is taken for new workers, whatever its worker's state**
  (``rose_common.lending``, the extender's rule too; issue 25, group soak g6). A suspended,
  suspending or waiting worker keeps its claim allocated (DRA gives that device to no other claim),
  so a NEW worker fits in a pool only where ``capacity - serving's need - GPUs claimed`` leaves its
  size, the claimed GPUs being every live worker's there (a time-slice group's shared claim once,
  :attr:`Worker.claim`); growing a job with a suspended worker resumes it in place, where only the
  GPUs held count (serving may take a suspended worker's GPU at once, so planned reclaims count
  only holding workers too). ``Plan.claimed`` reports the count per pool. A claim's GPU is lent
  once however many workers hold it: a time-slice group's member resumes onto the shared claim
  another member holds without room of its own (which member runs is the orchestrator's), and a
  member the orchestrator's hand-over suspends (``Worker.handed``: its suspend request is the
  orchestrator's, its shared claim on a GPU serving does not hold) still holds the group's GPU: a
  hand-over is not a reclaim, so at the instant when the old holder is suspending and the new one is
  not yet resumed both members keep their target (serving's planned reclaim still takes the GPU
  from every member, as from a holding one). A granted worker the
  scheduler has not placed yet (``Worker.bound`` False) is still a new claim: each round, where the
  rule no longer leaves it room (serving's forecast rose, a worker was suspended in place), it is
  removed (``Shrink: ... removed before it was scheduled``), never kept as a target the extender
  refuses (group soak ``suspalloc`` g1: ``elastic-b-w2`` Pending for 90 s).
- **The scheduler's refusal settles it** (group soak g7). The planner and the extender read a
  reply by one rule (``rose_common.lending``), but each fetches the predictor on its own; a granted
  worker kube-scheduler keeps Unschedulable with the ROSE extender's serving-forecast refusal
  (:attr:`Worker.refused_since`, from the pod's PodScheduled condition) for
  ``Settings.refused_after_s`` is removed (``Shrink: ... removed before it was scheduled:
  kube-scheduler has refused it ...``), and its job gets no new worker in that pool for
  ``Settings.refused_cooldown_s`` (:attr:`Plan.refused` out, :attr:`PlanInput.cooldowns` in).
- **Hysteresis.** A job that shrank or was suspended less than ``dwell_s`` ago does not grow.
- **Waiting for serving** (soak T2's remainder). A worker in state ``waiting`` (a time-slice group's
  shared claim allocated on a GPU serving now holds, never prepared there: the driver refuses it
  until serving leaves, and moving the claim would lose the suspended members' state) holds no
  GPU and is not resumed; it counts against ``maxGPUs`` like a suspended worker, and its job is
  not grown meanwhile (``JobTarget.waiting`` names it). It holds again once serving leaves.
- **GPU shares** (issue 27 §3; ``Job.share``): a job whose workers each hold a fraction of one GPU.
  Its ``min_gpus``/``max_gpus`` count the workers' shares as fractions (min 1 with shares of 0.25:
  four workers). A pool's lent GPUs are the whole ones plus ``⌈Σ share fractions⌉`` (shares assumed
  packed onto as few GPUs as they fill; the planner does not see which GPU a share is on), so a
  GPU partly lent in shares takes another share where no whole GPU is free, and serving, which
  claims whole GPUs, needs the shares' GPUs emptied. When serving needs more of the pool, shares
  are reclaimed before whole GPUs (:meth:`Job.cost`, after the class priority), above the job's
  minimum one worker at a time, at it as a gang; Events name the share (``w-3 (a 0.25 GPU
  share)``) and the count (``1.25 GPU in shares counts 2``). ``JobTarget.active_share`` and
  ``Plan.lent_shares`` report the fractions.
- **Roles** (an ElasticRLJob with ``spec.roles``): the controller plans its trainer and its rollout
  workers as two jobs, ``<namespace>/<name>#trainer`` (min = max: a fixed gang) and
  ``...#rollout`` (``requires`` the trainer). Among jobs of one class priority, rollout workers
  are reclaimed first (:meth:`Job.cost`): above their minimum one at a time (removed when the job
  asks, ``remove_on_shrink``, else suspended), then the rollouts below their minimum as a gang,
  and a trainer only when nothing cheaper is left in the pool. A job whose ``requires`` holds no
  GPU after the reclaims is suspended (rollouts without their trainer are useless), and it grows
  only after the job it requires grew to its minimum: the trainer first
  (:func:`merge_roles` joins the two targets into the job's one).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

from rose_common import lending

# "waiting": its lent claim is allocated on a GPU serving holds and it never ran there (a time-slice
# group's shared claim): it holds no GPU, cannot be resumed until serving leaves, and its job grows no more
WorkerState = Literal["active", "pending", "resuming", "suspending", "suspended", "waiting"]
HOLDING: frozenset[str] = frozenset({"active", "pending", "resuming"})  # states that hold a GPU
ROLE_SEP = "#"  # a role's planner key: <namespace>/<name>#<role>
ROLE_TRAINER = "trainer"
ROLE_ROLLOUT = "rollout"


def role_key(job_key: str, role: str | None) -> str:
    """The planner's key of ``role`` of job ``job_key`` (the job's own key without a role)."""
    return job_key if role is None else f"{job_key}{ROLE_SEP}{role}"


PLANNED_REASONS = ("PlannedShrink:", "PlannedGangSuspend:")  # the planner's reclaim Event reasons


@dataclass(frozen=True)
class Forecast:
    """Serving GPUs needed at the operator's quantile, a step function: ``upper[i]`` holds on
    ``[start + i*step, start + (i+1)*step)``. Beyond the horizon nothing is known: infinite need."""

    start: float
    step: float
    upper: tuple[float, ...]
    quantile: str = "p90"
    # the reply's own points, (horizon s from ``start``, GPUs serving may need), as the extender reads
    # them: a new lent claim is judged on these by rose_common.lending's one reading (empty: a
    # forecast built without a reply, judged on ``upper``)
    points: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.step <= 0:
            raise ValueError(f"forecast step must be > 0 seconds, got {self.step}")
        if any(math.isnan(u) or u < 0 for u in self.upper):
            raise ValueError("forecast values must be numbers >= 0 (serving GPUs needed)")

    def covers(self, t0: float, t1: float) -> bool:
        """True when the forecast says something about every moment of ``[t0, t1]``."""
        return not math.isinf(self.peak(t0, t1))

    def peak(self, t0: float, t1: float) -> float:
        """Most serving GPUs needed at any time in ``[t0, t1]``."""
        i0 = max(0, math.floor((t0 - self.start) / self.step))
        i1 = math.floor((t1 - self.start) / self.step)
        if i1 >= len(self.upper) or i0 > i1:
            return math.inf
        return max(self.upper[i0 : max(i0, i1) + 1])


@dataclass(frozen=True)
class Pool:
    name: str
    capacity: int  # physical GPUs serving and lending share
    forecast: Forecast
    frozen: bool = False  # no fresh forecast: no grants and no planned reclaims in this pool


@dataclass(frozen=True)
class Job:
    key: str  # namespace/name
    min_gpus: int
    max_gpus: int
    gpus_per_worker: int = 1
    priority: int = 0  # spec.priority: the tenant's hint, compared only among jobs of its namespace
    state_bytes: int = 0  # per worker: what a suspend moves over PCIe
    seconds_to_safe_point: float = 0.0  # the gang reaches its safe points together
    grace_s: float = 30.0
    suspend_s: float = 0.0  # estimated time to move the state out
    min_useful_run_s: float = 600.0
    last_shrink_at: float | None = None  # dwell starts here
    class_priority: int = 0  # the workers' pod priority (their PriorityClass): set by the API server
    role: str | None = None  # "trainer" / "rollout" of an ElasticRLJob with spec.roles, else None
    requires: str | None = None  # key of the job that must hold its minimum for this one to run (the trainer)
    remove_on_shrink: bool = False  # a worker reclaimed above min is removed (pod deleted), not suspended
    # GPU shares (issue 27 §3): each worker holds this fraction of one GPU (0 < share < 1) instead of
    # gpus_per_worker whole GPUs; min/max_gpus then count the workers' shares as fractions
    share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.share < 1.0 or math.isnan(self.share):
            raise ValueError(
                f"job {self.key}: share must be 0 (whole GPUs) or a fraction of a GPU below 1, got {self.share}"
            )

    @property
    def size(self) -> float:
        """What one worker holds, in GPUs: its share, else its whole GPUs."""
        return self.share if self.share > 0 else float(self.gpus_per_worker)

    @property
    def lead_s(self) -> float:
        return self.grace_s + self.suspend_s

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def owner(self) -> str:
        """The ElasticRLJob's key: ``key`` without its ``#role``."""
        return self.key.partition(ROLE_SEP)[0]

    def cost(self) -> tuple[int, int, int, int, str, int, float, str]:
        """Reclaim cost, cheapest first: class priority (admin-controlled), GPU shares before whole
        GPUs (issue 27 §3: serving's growth reclaims the share first), rollout workers before
        anything else (they hold only weights and in-flight generations), state size, then the
        tenant's ``spec.priority`` only against jobs of the same namespace (the namespace comes
        before it, so a big number never jumps another tenant's job), time to the next safe point."""
        return (
            self.class_priority,
            0 if self.share > 0 else 1,
            0 if self.role == ROLE_ROLLOUT else 1,
            self.state_bytes,
            self.namespace,
            self.priority,
            self.seconds_to_safe_point,
            self.key,
        )

    def grow_order(self) -> tuple[int, str, int, str, int, str]:
        """Who grows first: higher class priority, then, inside one namespace, higher ``spec.priority``;
        a job's trainer before its rollout workers."""
        return (-self.class_priority, self.namespace, -self.priority, self.owner, 1 if self.requires else 0, self.key)


@dataclass(frozen=True)
class Worker:
    name: str
    job: str
    state: WorkerState
    pool: str | None = None  # None: pending and not placed in a known pool
    # its lent ResourceClaim ("namespace/name"; a time-slice group's members share one), None: unknown
    # or not created yet; a claim counts once among the GPUs taken for new workers (rose_common.lending)
    claim: str | None = None
    # False: a pending worker the scheduler has not placed yet (its claim allocated nothing): still a
    # NEW lent claim, held to rose_common.lending's rule every round (:func:`_unplaceable`)
    bound: bool = True
    # a time-slice group member suspended (or being suspended) by its orchestrator's hand-over, on
    # the group's shared claim serving does not hold: the group still holds that GPU, so the planner
    # counts the member as holding it (:class:`_Book`), as it counts the member another one hands to
    handed: bool = False
    # an unbound worker kube-scheduler marks Unschedulable (PodScheduled False) with the rose extender's
    # serving-forecast refusal in its message: since when (epoch s, the condition's lastTransitionTime;
    # the scheduler writes it through the API server); None: not so refused (:func:`_refused`)
    refused_since: float | None = None


@dataclass(frozen=True)
class Settings:
    dwell_s: float = 300.0
    interval_s: float = 0.0  # time to the next plan: a reclaim decided then must still be in time
    # a worker the scheduler has refused for serving's forecast this long is removed (:func:`_refused`),
    # and its job gets no new worker in that pool for ``refused_cooldown_s`` (PlanInput.cooldowns)
    refused_after_s: float = 60.0
    refused_cooldown_s: float = 300.0


@dataclass(frozen=True)
class PlanInput:
    now: float
    pools: tuple[Pool, ...]
    jobs: tuple[Job, ...]
    workers: tuple[Worker, ...]
    settings: Settings = Settings()
    # (job key, pool, until epoch s): the job gets no new worker in that pool before ``until`` (the
    # caller keeps what :attr:`Plan.refused` reported, ``Settings.refused_cooldown_s`` long)
    cooldowns: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class JobTarget:
    job: str
    active_gpus: int
    suspend: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    add: tuple[str, ...] = ()  # one pool name per new worker
    reasons: tuple[str, ...] = ()  # one Event message per decision
    add_roles: tuple[str, ...] = ()  # a job with roles (merge_roles): the role of each new worker in ``add``
    role_workers: tuple[tuple[str, int], ...] = ()  # a job with roles: (role, workers the plan holds)
    waiting: tuple[str, ...] = ()  # workers waiting for serving to leave their GPU (neither active nor resumed)
    active_share: float = 0.0  # a job of GPU shares: the fraction of GPUs its workers hold (active_gpus is 0)
    share: float = 0.0  # a job of GPU shares: the fraction of one GPU each worker holds (Job.share)

    @property
    def shrinks(self) -> bool:
        """True when this target gives GPUs back (the controller stamps ``lastShrinkTime``)."""
        return bool(self.suspend or self.remove)


@dataclass(frozen=True)
class Reclaim:
    pool: str
    job: str
    kind: Literal["shrink", "gang-suspend"]
    workers: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    now: float
    targets: dict[str, JobTarget]
    reclaims: tuple[Reclaim, ...]
    lent: dict[str, int]  # GPUs lent per pool once the plan is carried out (a GPU with shares counts whole)
    lent_shares: dict[str, float] = field(default_factory=dict)  # of which: fractions lent in shares, per pool
    # GPUs lent claims take per pool for a new worker once the plan is carried out: the lent ones and
    # those of suspended, suspending and waiting workers (rose_common.lending)
    claimed: dict[str, int] = field(default_factory=dict)
    # (job key, pool): a worker removed this round because the scheduler kept refusing it there for
    # serving's forecast (:func:`_refused`): the caller starts that job's cool-down in that pool
    refused: tuple[tuple[str, str], ...] = ()


@dataclass
class _JobBook:
    job: Job
    holding: list[Worker]
    parked: list[Worker]  # suspended or suspending: resumable
    waiting: list[Worker] = field(default_factory=list)  # serving holds their claim's GPU: not resumable
    suspend: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    add: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    shrunk: bool = False

    @property
    def active(self) -> float:
        """GPUs the job's holding workers use; a share job's as the fraction they sum to."""
        if self.job.share > 0:
            return round(self.job.share * len(self.holding), 9)
        return self.job.gpus_per_worker * len(self.holding)  # an int: Events print "2 of minGPUs 4"

    def target(self) -> JobTarget:
        whole = 0 if self.job.share > 0 else self.job.gpus_per_worker * len(self.holding)
        share = self.active if self.job.share > 0 else 0.0
        return JobTarget(
            self.job.key,
            whole,
            tuple(self.suspend),
            tuple(self.resume),
            tuple(self.remove),
            tuple(self.add),
            tuple(self.reasons),
            waiting=tuple(w.name for w in self.waiting),
            active_share=share,
            share=self.job.share,
        )


class _Claimed:
    """One pool's GPUs that lent claims of workers NOT holding their GPU take for a new worker
    (suspended, suspending, waiting: rose_common.lending's rule): each claim once, and none that a
    holding worker's claim (a time-slice group member's) already counts. O(1) per change."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.idle: Counter[str] = Counter()
        self.size: dict[str, tuple[float, bool]] = {}  # claim -> (GPUs or share fraction, is a share)
        self.whole = 0.0
        self.share = 0.0

    def _add(self, key: str, sign: int) -> None:
        size, is_share = self.size[key]
        if self.idle[key] > 0 and self.held[key] == 0:
            if is_share:
                self.share = round(self.share + sign * size, 9)
            else:
                self.whole += sign * size

    def change(self, key: str, size: float, is_share: bool, held: int = 0, idle: int = 0) -> None:
        self.size.setdefault(key, (size, is_share))
        self._add(key, -1)
        self.held[key] += held
        self.idle[key] += idle
        self._add(key, 1)


def _holds(w: Worker) -> bool:
    """Whether ``w`` holds its GPU at the start of the plan: a holding state, or a time-slice group
    member parked by its orchestrator's hand-over (:attr:`Worker.handed`: a hand-over is not a
    reclaim; the shared claim's GPU stays the group's, so neither member's target flips to 0 at the
    instant when one member is suspending and the other not yet resumed; soak g2/g3/g5)."""
    return w.state in HOLDING or (w.handed and w.state in ("suspending", "suspended") and w.claim is not None)


class _Book:
    """The plan under construction: who holds which pool's GPUs."""

    def __init__(self, inp: PlanInput) -> None:
        self.now = inp.now
        self.interval = inp.settings.interval_s
        self.pools = {p.name: p for p in inp.pools}
        self.jobs: dict[str, _JobBook] = {}
        self._lent: dict[str, int] = dict.fromkeys(self.pools, 0)  # GPUs lent whole
        self._share: dict[str, float] = dict.fromkeys(self.pools, 0.0)  # fractions lent in shares
        self._in: dict[str, dict[str, int]] = {p: {} for p in self.pools}
        self._claimed: dict[str, _Claimed] = {p: _Claimed() for p in self.pools}
        by_job: dict[str, list[Worker]] = {}
        for w in inp.workers:  # one pass: the plan stays linear in workers (controller_scale benchmark)
            by_job.setdefault(w.job, []).append(w)
        for job in sorted(inp.jobs, key=lambda j: j.key):
            mine = sorted(by_job.get(job.key, ()), key=lambda w: w.name)
            parked = [w for w in mine if not _holds(w) and w.state != "waiting"]
            b = self.jobs[job.key] = _JobBook(job, [], parked, [w for w in mine if w.state == "waiting"])
            for w in mine:
                if _holds(w):
                    self.hold(b, w)
                else:
                    self.mark(b, w, idle=1)
        self.reclaims: list[Reclaim] = []
        self.refused: list[tuple[str, str]] = []
        self.cool: set[tuple[str, str]] = {(j, p) for j, p, until in inp.cooldowns if until > inp.now}

    def _count(self, job: Job, pool: str, sign: int) -> None:
        if job.share > 0:
            self._share[pool] = round(self._share[pool] + sign * job.share, 9)
        else:
            self._lent[pool] += sign * job.gpus_per_worker

    @staticmethod
    def _key(w: Worker) -> str:
        return w.claim or f"worker:{w.job}/{w.name}"

    def mark(self, b: _JobBook, w: Worker, held: int = 0, idle: int = 0) -> None:
        """Count ``w``'s claim as held or idle (not holding its GPU) in its pool's :class:`_Claimed`."""
        if w.pool in self._claimed:
            self._claimed[w.pool].change(self._key(w), b.job.size, b.job.share > 0, held, idle)

    def claim_held(self, w: Worker) -> bool:
        """Another holding worker holds ``w``'s claim (a time-slice group's shared claim, another
        member resident): ``w`` holding too takes no other GPU."""
        return w.claim is not None and w.pool in self._claimed and self._claimed[w.pool].held[w.claim] > 0

    def hold(self, b: _JobBook, w: Worker) -> None:
        b.holding.append(w)
        if w.pool in self._lent:
            if not self.claim_held(w):  # a shared claim's GPU is lent once, however many members hold it
                self._count(b.job, w.pool, 1)
            self._in[w.pool][b.job.key] = self._in[w.pool].get(b.job.key, 0) + 1
            self.mark(b, w, held=1)

    def release(self, b: _JobBook, w: Worker) -> None:
        b.holding.remove(w)
        if w.pool in self._lent:
            self.mark(b, w, held=-1)
            if not self.claim_held(w):
                self._count(b.job, w.pool, -1)
            self._in[w.pool][b.job.key] -= 1
            if not self._in[w.pool][b.job.key]:
                del self._in[w.pool][b.job.key]

    def lent(self, pool: str, extra_share: float = 0.0) -> int:
        """GPUs lent in ``pool``: whole ones plus the GPUs its shares take, assumed packed
        (⌈Σ fractions⌉); with ``extra_share`` more of a GPU in shares."""
        return self._lent[pool] + math.ceil(self._share[pool] + extra_share - 1e-9)

    def claimed(self, pool: str, extra_share: float = 0.0) -> int:
        """GPUs a new lent claim cannot have in ``pool`` (rose_common.lending): the lent ones
        (:meth:`lent`) and those the claims of its suspended, suspending and waiting workers hold."""
        c = self._claimed[pool]
        shares = self._share[pool] + c.share + extra_share
        return self._lent[pool] + math.ceil(c.whole - 1e-9) + math.ceil(shares - 1e-9)

    def shares(self, pool: str) -> float:
        return self._share[pool]

    def occupies(self, b: _JobBook, pool: str) -> bool:
        return b.job.key in self._in[pool]

    def occupants(self, pool: str) -> list[_JobBook]:
        """Jobs with a worker holding a GPU in ``pool``."""
        return [self.jobs[k] for k in self._in[pool]]

    def frozen(self, pool: str) -> bool:
        """No grants and no planned reclaims: the pool has no forecast for the next plan interval."""
        p = self.pools[pool]
        return p.frozen or not p.forecast.covers(self.now, self.now + self.interval)

    def fits(self, pool: str, b: _JobBook) -> bool:
        """The pool's forecast covers the job's own lead (and the time to the next plan)."""
        return self.pools[pool].forecast.covers(self.now, self.now + self.interval + b.job.lead_s)

    def lead(self, pool: str) -> float:
        """The time to the next plan + the longest lead of the pool's occupants whose lead fits the
        forecast: a job whose does not is reclaimed alone (:func:`_overreach`), never the pool."""
        return self.interval + max((b.job.lead_s for b in self.occupants(pool) if self.fits(pool, b)), default=0.0)

    def need(self, pool: str, seconds: float) -> float:
        peak = self.pools[pool].forecast.peak(self.now, self.now + seconds)
        return peak if math.isinf(peak) else math.ceil(peak)

    def free(self, pool: str, seconds: float) -> float:
        """GPUs serving leaves unused over ``[now, now + seconds]``, minus those already lent."""
        return self.pools[pool].capacity - self.need(pool, seconds) - self.lent(pool)

    def room(self, pool: str, seconds: float, job: Job, new: bool = False) -> float:
        """What serving leaves over ``[now, now + seconds]`` for one more worker of ``job``, in its
        size: GPUs free for a whole worker; for a share, the fraction left once it is packed (so a GPU
        partly lent in shares takes another share where no whole GPU is free). ≥ ``job.size``: fits.
        A ``new`` worker (a new lent claim) cannot have a GPU any lent claim holds, whatever its
        worker's state (:meth:`claimed`, ``rose_common.lending``), and is judged on the reply's own
        points as the extender judges it (``lending.new_claim_room``: every point ahead up to the
        first reaching the run's end, horizons from the reply's time); a resume in place only needs
        serving's room among the GPUs not held, on the step function."""
        capacity, forecast = self.pools[pool].capacity, self.pools[pool].forecast
        extra = job.share if job.share > 0 else 0.0
        taken = self.claimed(pool, extra) if new else self.lent(pool, extra)
        if new and forecast.points:  # the extender's reading of the same reply (rose_common.lending)
            spare = lending.new_claim_room(capacity, taken, forecast.points, seconds, self.now - forecast.start)
        else:
            spare = capacity - self.need(pool, seconds) - taken
        if job.share <= 0:
            return spare
        return job.share if spare >= 0 else spare

    def drop(self, b: _JobBook, w: Worker, why: str, shrink: bool = False) -> None:
        """Take a worker off its GPU: pending ones are removed, running ones suspended (removed when
        its job reclaims by removal and this is a ``shrink`` above its minimum)."""
        self.release(b, w)
        if w.state == "pending" or (shrink and b.job.remove_on_shrink):
            b.remove.append(w.name)
        else:
            b.suspend.append(w.name)
            b.parked.append(w)
            self.mark(b, w, idle=1)  # suspended, its claim keeps its GPU for new workers
        b.shrunk = True
        b.reasons.append(why)


def _enforce_max(book: _Book) -> None:
    """Live edits of maxGPUs: workers beyond it (held or parked) are removed, newest first."""
    for b in book.jobs.values():
        while b.active > b.job.max_gpus:
            w = b.holding[-1]
            book.release(b, w)
            b.remove.append(w.name)
            b.reasons.append(f"Shrink: {w.name} removed, maxGPUs is {b.job.max_gpus}")
        while b.parked and round(b.active + b.job.size * len(b.parked), 9) > b.job.max_gpus:
            w = b.parked.pop()
            book.mark(b, w, idle=-1)  # removed: its claim goes with its pod
            b.remove.append(w.name)
            b.reasons.append(f"Shrink: suspended {w.name} removed, maxGPUs is {b.job.max_gpus}")


def _shrinkable(b: _JobBook, pool: str) -> list[Worker]:
    if round(b.active - b.job.size, 9) < b.job.min_gpus:
        return []
    return [w for w in b.holding if w.pool == pool]


class _Cheapest:
    """The pool's occupants cheapest first, for one pool's reclaim. While a pool is reclaimed its
    occupants only lose workers: a job that left the pool, or fell to where one worker less would
    take it below min, stays so; each pointer only moves forward (linear, not occupants x reclaims)."""

    def __init__(self, book: _Book, pool: str) -> None:
        self.book, self.pool = book, pool
        self.order = sorted(book.occupants(pool), key=lambda x: x.job.cost())
        self._shrink = self._gang = 0

    def shrinkable(self) -> _JobBook | None:
        """The cheapest occupant that stays at or above min without one worker."""
        while self._shrink < len(self.order) and not (
            self.book.occupies(b := self.order[self._shrink], self.pool)
            and round(b.active - b.job.size, 9) >= b.job.min_gpus
        ):
            self._shrink += 1
        return self.order[self._shrink] if self._shrink < len(self.order) else None

    def occupant(self) -> _JobBook:
        while not self.book.occupies(self.order[self._gang], self.pool):
            self._gang += 1
        return self.order[self._gang]


def _reclaim_one(book: _Book, pool: str, why: str, cheapest: _Cheapest) -> None:
    """Give back the cheapest lent GPUs in ``pool``: one worker of a job above min, else a whole gang."""
    b = cheapest.shrinkable()
    if b is not None:
        w = _shrinkable(b, pool)[-1]
        book.drop(b, w, f"PlannedShrink: {_who(b, w)} in {pool}; {why}", shrink=True)
        book.reclaims.append(Reclaim(pool, b.job.key, "shrink", (w.name,)))
        return
    b = cheapest.occupant()
    gang = tuple(w.name for w in b.holding)
    for w in list(b.holding):
        book.drop(b, w, f"PlannedGangSuspend: {_who(b, w)} (gang at minGPUs {b.job.min_gpus}); {why}")
    book.reclaims.append(Reclaim(pool, b.job.key, "gang-suspend", gang))


def _who(b: _JobBook, w: Worker) -> str:
    """A worker as its Events name it: with its role, for a job with roles; with its share."""
    name = w.name if b.job.role is None else f"{b.job.role} {w.name}"
    return name if b.job.share <= 0 else f"{name} (a {b.job.share:g} GPU share)"


def _overreach(book: _Book, pool: str) -> None:
    """Workers of jobs whose own lead reaches past the pool's forecast horizon: reclaimed, alone."""
    horizon = book.pools[pool].forecast
    for b in [b for b in book.occupants(pool) if not book.fits(pool, b)]:
        mine = tuple(w.name for w in b.holding if w.pool == pool)
        end = horizon.start + horizon.step * len(horizon.upper) - book.now
        why = (
            f"its lead {book.interval + b.job.lead_s:.0f}s (grace + suspend + plan interval) reaches past "
            f"the forecast horizon of {pool} ({end:.0f}s)"
        )
        for w in [w for w in b.holding if w.pool == pool]:
            book.drop(b, w, f"PlannedShrink: {w.name} in {pool}; {why}")
        book.reclaims.append(Reclaim(pool, b.job.key, "gang-suspend" if not b.holding else "shrink", mine))


def _reclaim(book: _Book) -> None:
    for pool in sorted(book.pools):
        if book.frozen(pool):
            continue
        _overreach(book, pool)
        lead = book.lead(pool)
        cheapest = _Cheapest(book, pool)
        while book.lent(pool) > 0 and book.free(pool, lead) < 0:
            q = book.pools[pool].forecast.quantile
            shared = book.shares(pool)
            in_shares = f" ({shared:g} GPU in shares counts {math.ceil(shared - 1e-9)})" if shared else ""
            why = (
                f"serving {q} needs {book.need(pool, lead):g} of {book.pools[pool].capacity} GPUs within "
                f"{lead:.0f}s, {book.lent(pool)} lent{in_shares}"
            )
            _reclaim_one(book, pool, why, cheapest)


def _unplaceable(book: _Book) -> None:
    """Granted workers not placed yet are new lent claims: in each pool they are taken back and
    held again one by one (grow order) while :func:`_room` leaves a new claim room; the rest are
    removed (rose_common.lending's rule, as the extender's filter applies it to them)."""
    for pool in sorted(book.pools):
        if book.frozen(pool):
            continue
        unplaced = [(b, w) for b in book.jobs.values() for w in b.holding if w.pool == pool and not w.bound]
        for b, w in unplaced:
            book.release(b, w)
        for b, w in sorted(unplaced, key=lambda x: (x[0].job.grow_order(), x[1].name)):
            room = _room(book, b, pool, new=True)
            if room >= b.job.size:
                book.hold(b, w)
                continue
            b.remove.append(w.name)
            b.shrunk = True
            b.reasons.append(
                f"Shrink: {_who(b, w)} removed before it was scheduled: {pool} has no GPU for a new lent "
                f"claim ({max(room, 0.0):g} of {book.pools[pool].capacity} GPUs left by serving's "
                f"{book.pools[pool].forecast.quantile} forecast over the worker's run, {book.claimed(pool)} held "
                "by lent claims, suspended workers' included)"
            )


def _refused(book: _Book, settings: Settings) -> None:
    """Workers kube-scheduler has kept Unschedulable for serving's forecast (the rose extender's
    refusal, :attr:`Worker.refused_since`) for ``refused_after_s`` are removed: the planner and the
    extender each fetch the predictor on their own, so they may still judge a pool apart for a
    while; the API server's word (the scheduler's condition) settles it. The job gets no new worker
    in that pool this round, nor, through :attr:`Plan.refused`, for ``refused_cooldown_s``."""
    for b in book.jobs.values():
        for w in list(b.holding):
            if w.bound or w.refused_since is None or w.pool is None:
                continue
            held = book.now - w.refused_since
            if held < settings.refused_after_s:
                continue
            book.release(b, w)
            b.remove.append(w.name)
            b.shrunk = True
            book.refused.append((b.job.key, w.pool))
            book.cool.add((b.job.key, w.pool))
            b.reasons.append(
                f"Shrink: {_who(b, w)} removed before it was scheduled: kube-scheduler has refused it in "
                f"{w.pool} for serving's forecast for {held:.0f}s (PodScheduled Unschedulable, the ROSE "
                f"extender's refusal; bound {settings.refused_after_s:g}s); no new worker of this job in "
                f"{w.pool} for {settings.refused_cooldown_s:g}s"
            )


def _room(book: _Book, b: _JobBook, pool: str, new: bool = False) -> float:
    """Room in ``pool`` for resuming a parked worker of ``b`` in place, or (``new``) for a new one."""
    if book.frozen(pool):
        return -math.inf
    seconds = max(book.interval + b.job.lead_s + b.job.min_useful_run_s, book.lead(pool))
    return book.room(pool, seconds, b.job, new)


def _grow_step(book: _Book, b: _JobBook) -> bool:
    """Resume one parked worker where its pool has room, else add one in the pool with most room."""
    gpw = b.job.size
    for w in b.parked:
        if w.pool is not None and w.pool in book.pools and (book.claim_held(w) or _room(book, b, w.pool) >= gpw):
            b.parked.remove(w)
            book.mark(b, w, idle=-1)
            book.hold(b, replace(w, state="resuming"))
            b.resume.append(w.name)
            return True
    pools = [p for p in book.pools if (b.job.key, p) not in book.cool]  # a refused pool cools down
    rooms = sorted(((_room(book, b, p, new=True), p) for p in pools), key=lambda r: (-r[0], r[1]))
    if not rooms or rooms[0][0] < gpw:
        return False
    if round(b.active + gpw * (len(b.parked) + len(b.waiting) + 1), 9) > b.job.max_gpus:
        # A parked worker waits for room in its own pool: never removed to grow elsewhere (its pod
        # holds its suspended state; deleting it would lose RL work, ARCHITECTURE §6).
        return False
    pool = rooms[0][1]
    book.hold(b, Worker(f"+{len(b.add)}", b.job.key, "pending", pool))
    b.add.append(pool)
    return True


def _snapshot(b: _JobBook) -> tuple[list[Worker], list[Worker], int, int, int]:
    return list(b.holding), list(b.parked), len(b.resume), len(b.add), len(b.remove)


def _grow(book: _Book, b: _JobBook) -> None:
    """To minGPUs all at once (or not at all), then one worker at a time up to maxGPUs."""
    before = _snapshot(b)
    while b.active < b.job.min_gpus and _grow_step(book, b):
        pass
    if b.active < b.job.min_gpus:  # the gang does not fit: undo
        for w in b.holding[len(before[0]) :]:
            book.release(b, w)
        for w in before[1]:
            if w not in b.parked:  # resumed by this attempt: suspended again, its claim idle again
                book.mark(b, w, idle=1)
        b.parked = before[1]
        del b.resume[before[2] :], b.add[before[3] :], b.remove[before[4] :]
        return
    while round(b.active + b.job.size, 9) <= b.job.max_gpus and _grow_step(book, b):
        pass
    grown = len(b.resume) - before[2] + len(b.add) - before[3]
    if grown:
        each = f" (a {b.job.share:g} GPU share each)" if b.job.share > 0 else ""
        b.reasons.append(
            f"Grow: {len(before[0])} -> {len(b.holding)} workers{each}; the forecast leaves room for "
            f"{b.job.min_useful_run_s:g}s"
        )


def _partial_gangs(book: _Book) -> None:
    """A job left running below minGPUs is suspended as a whole gang."""
    for b in book.jobs.values():
        if 0 < b.active < b.job.min_gpus:
            for w in list(b.holding):
                book.drop(b, w, f"GangSuspend: {w.name}; {b.active} of minGPUs {b.job.min_gpus} could run")


def _requirement_met(book: _Book, b: _JobBook) -> bool:
    """The job it requires (its trainer) holds at least its minimum (and some GPU)."""
    if b.job.requires is None:
        return True
    r = book.jobs.get(b.job.requires)
    return r is not None and r.active >= max(r.job.min_gpus, 1)


def _orphans(book: _Book) -> None:
    """A job whose required job (its trainer) is not running is suspended: rollouts without a trainer."""
    for b in book.jobs.values():
        if b.holding and not _requirement_met(book, b):
            for w in list(b.holding):
                book.drop(b, w, f"GangSuspend: {_who(b, w)}; {b.job.requires} is not running")


def _may_grow(b: _JobBook, now: float, dwell_s: float) -> bool:
    """Not after a shrink this round or within the dwell; never while a worker waits for serving (a
    time-slice group's shared claim on a GPU serving holds: the group gets no more GPUs meanwhile)."""
    last = b.job.last_shrink_at
    return not b.shrunk and not b.waiting and (last is None or now - last >= dwell_s)


def plan(inp: PlanInput) -> Plan:
    """The target of every job at ``inp.now``; see the module docstring for the rules."""
    book = _Book(inp)
    _enforce_max(book)
    _reclaim(book)
    _refused(book, inp.settings)
    _unplaceable(book)
    for b in sorted(book.jobs.values(), key=lambda x: x.job.grow_order()):
        if _may_grow(b, inp.now, inp.settings.dwell_s) and _requirement_met(book, b):
            _grow(book, b)
    _partial_gangs(book)
    _orphans(book)
    return Plan(
        inp.now,
        {k: b.target() for k, b in book.jobs.items()},
        tuple(book.reclaims),
        {p: book.lent(p) for p in sorted(book.pools)},
        {p: book.shares(p) for p in sorted(book.pools) if book.shares(p)},
        {p: book.claimed(p) for p in sorted(book.pools)},
        tuple(book.refused),
    )


def merge_roles(targets: dict[str, JobTarget], jobs: tuple[Job, ...]) -> dict[str, JobTarget]:
    """The plan's targets per ElasticRLJob: the targets of a job's roles (``<key>#trainer``,
    ``<key>#rollout``) joined into one under ``<key>`` (trainer first; ``add_roles`` says whose each
    new worker is, ``role_workers`` how many each role holds); other targets unchanged (pure)."""
    by_key = {j.key: j for j in jobs}
    out: dict[str, JobTarget] = {}
    for key in sorted(targets, key=lambda k: (k.partition(ROLE_SEP)[0], 0 if k.endswith(ROLE_TRAINER) else 1)):
        t, job = targets[key], by_key.get(key)
        if job is None or job.role is None:
            out[key] = t
            continue
        m = out.get(job.owner, JobTarget(job.owner, 0))
        out[job.owner] = JobTarget(
            job.owner,
            m.active_gpus + t.active_gpus,
            m.suspend + t.suspend,
            m.resume + t.resume,
            m.remove + t.remove,
            m.add + t.add,
            m.reasons + t.reasons,
            m.add_roles + (job.role,) * len(t.add),
            (*m.role_workers, (job.role, t.active_gpus // job.gpus_per_worker)),
            waiting=m.waiting + t.waiting,
        )
    return out


def without_reclaims(result: Plan, gpus_per_worker: dict[str, int], shares: dict[str, float] | None = None) -> Plan:
    """The plan with its planned reclaims taken out (pure): the workers they would suspend or
    remove keep running, their GPUs (or, for a job in ``shares``, their fractions) stay in the
    job's target, their reasons leave the Events."""
    reclaimed: dict[str, set[str]] = {}
    for r in result.reclaims:
        reclaimed.setdefault(r.job, set()).update(r.workers)
    targets = {}
    for key, t in result.targets.items():
        gone = reclaimed.get(key, set())
        kept = sum(1 for n in (*t.suspend, *t.remove) if n in gone)
        share = (shares or {}).get(key, 0.0)
        targets[key] = replace(
            t,
            active_gpus=t.active_gpus + (0 if share else kept * gpus_per_worker.get(key, 1)),
            active_share=round(t.active_share + kept * share, 9),
            suspend=tuple(n for n in t.suspend if n not in gone),
            remove=tuple(n for n in t.remove if n not in gone),
            reasons=tuple(r for r in t.reasons if not r.startswith(PLANNED_REASONS)),
        )
    return replace(result, targets=targets, reclaims=())
