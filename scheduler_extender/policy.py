"""The extender's decisions: pure functions of plain data (no I/O, no clock, no globals).

- RL workers (ElasticRLJob pods) are filtered to nodes with a free lendable GPU, room in host
  memory for suspended state, and a pool the forecast says serving will not need within the
  job's minimum useful run (the forecast: the GPUs serving may need over each window at the
  configured risk when the predictor serves it, else the upper quantile; see ``forecast.py``);
  they are scored by predicted idle window, headroom (the pool's
  spare GPUs at the forecast's upper quantile over the minimum useful run: the lower, the
  likelier a reclaim before that run ends), free lendable GPUs and closeness to the job's
  other workers.
- Serving pods are never filtered; they are scored towards GPUs with no lent occupant, then
  towards those cheapest to take back.
- Preemption never evicts an RL worker: RL victims are taken out of the lists and suspended.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rose_common import extender_names, forecast_risk, lending, names
from rose_common.timefmt import parse_rfc3339
from scheduler_extender.model import NodeState, PodInfo, PodKind, PoolForecast, PoolState, Snapshot
from scheduler_extender.wire import MAX_EXTENDER_PRIORITY, MIN_EXTENDER_PRIORITY

RL_OWNER_KIND = names.KIND


@dataclass(frozen=True)
class PolicyConfig:
    default_min_run_s: float = 600.0
    default_grace_s: float = 30.0
    # Quantile of serving demand used as "what serving may need" (upper quantile: conservative).
    quantile: str = "0.9"
    # Fallback when a pool has no usable forecast: lend only when at least this fraction of the
    # pool stays free after placing the pod, and then assume this idle window.
    fallback_headroom: float = 0.25
    fallback_window_s: float = 600.0
    # Longest horizon scored; windows at or beyond it get the full idle-window score.
    max_horizon_s: float = 3600.0
    # Host to device link for suspend cost estimates (PCIe Gen5 x16, pinned, one direction).
    link_bytes_per_s: float = 55e9
    # One point of serving score per this many seconds of reclaim cost.
    reclaim_cost_step_s: float = 10.0


# ---------------------------------------------------------------------------------------------
# Pods


def _int_annotation(annotations: Mapping[str, str], key: str) -> int | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def classify(labels: Mapping[str, str], owner_kinds: Iterable[str]) -> tuple[PodKind, str]:
    """RL worker by label ``rose.io/elastic-rl-job`` or an ElasticRLJob owner; serving by role label."""
    job = labels.get(names.LABEL_JOB, "")
    if job:
        return PodKind.RL, job
    if RL_OWNER_KIND in owner_kinds:
        return PodKind.RL, ""
    if labels.get(names.LABEL_ROLE) == names.ROLE_SERVING:
        return PodKind.SERVING, ""
    return PodKind.OTHER, ""


def pod_info(
    *,
    namespace: str,
    name: str,
    uid: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    owners: Sequence[tuple[str, str]] = (),  # (kind, name)
    node: str | None = None,
    priority: int | None = None,
    termination_grace_s: int | None = None,
    claim_count: int = 0,
    terminating: bool = False,
    cfg: PolicyConfig | None = None,
) -> PodInfo:
    """Build :class:`PodInfo` from a pod's fields (request bodies and the watch cache share this)."""
    cfg = cfg or PolicyConfig()
    labels = labels or {}
    annotations = annotations or {}
    kind, job = classify(labels, (k for k, _ in owners))
    if kind is PodKind.RL and not job:
        job = next((n for k, n in owners if k == RL_OWNER_KIND), "")
    gpus = _int_annotation(annotations, extender_names.ANNOTATION_GPUS)
    if gpus is None or gpus == 0:
        gpus = max(1, claim_count)
    grace = _int_annotation(annotations, names.ANNOTATION_GRACE)
    if grace is None:
        grace = termination_grace_s if termination_grace_s is not None else int(cfg.default_grace_s)
    min_run = _int_annotation(annotations, extender_names.ANNOTATION_MIN_RUN)
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid,
        kind=kind,
        job=job,
        gpus=gpus,
        state_bytes=_int_annotation(annotations, names.ANNOTATION_STATE_BYTES) or 0,
        grace_s=float(grace),
        at_safe_point=annotations.get(extender_names.ANNOTATION_AT_SAFE_POINT, "").lower() == "true",
        min_run_s=float(min_run) if min_run is not None else None,
        node=node or "",
        priority=priority or 0,
        suspend_requested=names.ANNOTATION_SUSPEND_REQUEST in annotations,
        terminating=terminating,
    )


def reclaim_cost_s(occupants: Iterable[PodInfo], cfg: PolicyConfig) -> float:
    """Seconds to take back every lent GPU of a node: the longest wait for a safe point
    (none for occupants already at one) plus the state transfer over the host link."""
    wait = 0.0
    total_bytes = 0
    for pod in occupants:
        if not pod.at_safe_point:
            wait = max(wait, pod.grace_s)
        total_bytes += pod.state_bytes
    return wait + total_bytes / cfg.link_bytes_per_s


# ---------------------------------------------------------------------------------------------
# Forecast → idle window


upper_demand = forecast_risk.upper_demand  # the wanted quantile, else the highest given


def forecast_age(forecast: PoolForecast | None, now: float | None) -> float:
    """Seconds since the reply was generated (its horizons count from then); 0 when either is unknown."""
    if forecast is None or forecast.generated_at is None or now is None:
        return 0.0
    return now - forecast.generated_at


def idle_window_s(
    pool: PoolState, forecast: PoolForecast | None, need: int, cfg: PolicyConfig, now: float | None = None
) -> tuple[float, bool]:
    """How long ``need`` more GPUs of the pool are predicted to stay free of serving.

    Returns ``(seconds, fallback_used)``. With a forecast: ``rose_common.lending.idle_window``, the
    planner's reading of the same reply (every point ahead, horizons from the reply's time when
    ``now`` is given, must leave capacity - serving's need - GPUs already claimed ≥ need; 0 if not
    even now). Without one: the conservative rule — ``fallback_window_s`` only when at least
    ``fallback_headroom`` of the pool stays free after placing the pod, else 0.
    """
    # every GPU a lent claim is allocated on, whatever its worker's state (rose_common.lending's rule);
    # a GPU lent in shares cannot be lent whole
    lent = pool.lent + pool.shared_gpus
    free_now = lending.spare_for_new_claim(pool.capacity, pool.serving_used, lent)
    points = () if forecast is None else forecast.points
    return window_over(pool.capacity, free_now, lent, points, need, cfg, forecast_age(forecast, now))


def window_over(
    capacity: int,
    free_now: float,
    lent: float,
    points: Sequence[tuple[int, float]],
    need: float,
    cfg: PolicyConfig,
    age_s: float = 0.0,
) -> tuple[float, bool]:
    """:func:`idle_window_s` on plain numbers (GPU shares use it with fractions): ``free_now`` GPUs
    free now, ``lent`` GPUs lent, serving's forecast ``points`` as (horizon s, GPUs) from a reply
    ``age_s`` old."""
    if not points:
        ok = free_now - need >= cfg.fallback_headroom * capacity
        return (cfg.fallback_window_s if ok and free_now >= need else 0.0), True
    if free_now < need:
        return 0.0, False
    return lending.idle_window(capacity, lent, points, need, age_s), False


@dataclass(frozen=True, slots=True)
class PoolOutlook:
    """What a pool's forecast promises a pod needing ``need`` GPUs (see :func:`pool_outlook`)."""

    window_s: float  # idle window: :func:`idle_window_s`
    capacity: int
    spare_now: float  # GPUs free now once the pod is placed
    # (horizon s, GPUs free at the upper quantile once the pod is placed), sorted by horizon;
    # empty when the pool has no usable forecast (headroom then comes from now alone)
    spare: tuple[tuple[int, float], ...] = ()
    fallback: bool = False
    basis: str = "quantile"  # what the forecast points are: PoolForecast.basis


def pool_outlook(
    pool: PoolState, forecast: PoolForecast | None, need: int, cfg: PolicyConfig, now: float | None = None
) -> PoolOutlook:
    """Idle window and spare-GPU profile of one pool for a pod needing ``need`` GPUs (``now``: the
    wall clock, so a reply's horizons count from its time; None: from now)."""
    window, fallback = idle_window_s(pool, forecast, need, cfg, now)
    lent = pool.lent + pool.shared_gpus
    spare_now = float(lending.spare_for_new_claim(pool.capacity, pool.serving_used, lent) - need)
    points = () if forecast is None else forecast.points
    spare = tuple((h, lending.spare_for_new_claim(pool.capacity, demand, lent) - need) for h, demand in points)
    basis = "quantile" if forecast is None else forecast.basis
    return PoolOutlook(window, pool.capacity, spare_now, spare, fallback, basis)


def headroom(outlook: PoolOutlook, min_run_s: float) -> float:
    """Fewest spare GPUs from now through the minimum useful run, as a share of the pool (0..1).

    The run is covered by every forecast point before ``min_run_s`` and the first one at or
    after it (the forecast says nothing between points). Spare GPUs at the upper quantile are
    the margin before serving takes a lent GPU back: the smaller, the likelier a reclaim before
    the run has been useful. 0 when the pool has no capacity or no margin left.
    """
    if outlook.capacity <= 0:
        return 0.0
    least = outlook.spare_now
    for horizon, spare in outlook.spare:
        least = min(least, spare)
        if horizon >= min_run_s:
            break
    return max(0.0, min(1.0, least / outlook.capacity))


def pool_outlooks(
    snapshot: Snapshot,
    forecasts: Mapping[str, PoolForecast | None],
    need: int,
    cfg: PolicyConfig,
    now: float | None = None,
) -> tuple[dict[str, PoolOutlook], list[str]]:
    """:class:`PoolOutlook` per pool for a pod needing ``need`` GPUs, and the pools that used the
    fallback (no usable forecast). O(pools x forecast points) per call."""
    outlooks: dict[str, PoolOutlook] = {}
    fallbacks: list[str] = []
    for pool_name, pool in snapshot.pools.items():
        outlook = pool_outlook(pool, forecasts.get(pool_name), need, cfg, now)
        outlooks[pool_name] = outlook
        if outlook.fallback:
            fallbacks.append(pool_name)
    return outlooks, fallbacks


# ---------------------------------------------------------------------------------------------
# filter


@dataclass
class FilterDecision:
    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


def _window(outlooks: Mapping[str, PoolOutlook], pool: str) -> float:
    outlook = outlooks.get(pool)
    return 0.0 if outlook is None else outlook.window_s


def _rl_group_reason(
    pool: str, lendable_free: int, need: int, outlooks: Mapping[str, PoolOutlook], min_run: float
) -> str | None:
    if lendable_free < need:
        return f"{lendable_free} lendable GPUs free, pod needs {need}"
    window = _window(outlooks, pool)
    if window < min_run:
        outlook = outlooks.get(pool)
        at = "" if outlook is None or outlook.basis == "quantile" else f" (at {outlook.basis})"
        return (
            f"{extender_names.REFUSAL_SERVING_FORECAST}{at} needs pool {pool!r} within {window:.0f}s "
            f"< min useful run {min_run:.0f}s"
        )
    return None


def host_state_free(dram_free: object, disk_free: object) -> int | None:
    """Pure: bytes a node can still take of suspended state, from its annotations
    ``rose.io/host-memory-free-bytes`` (DRAM) and ``rose.io/host-state-disk-free-bytes`` (the
    driver's disk tier, absent without one): their sum. None when DRAM is not published (or not a
    non-negative integer: the filter then does not judge the node); a malformed disk value counts 0."""

    def parse(raw: object) -> int | None:
        try:
            v = int(str(raw)) if raw is not None else None
        except ValueError:
            return None
        return v if v is not None and v >= 0 else None

    dram = parse(dram_free)
    if dram is None:
        return None
    return dram + (parse(disk_free) or 0)


def filter_nodes(
    pod: PodInfo,
    node_names: Sequence[str],
    snapshot: Snapshot,
    outlooks: Mapping[str, PoolOutlook],
    cfg: PolicyConfig,
) -> FilterDecision:
    """Serving and other pods pass every node (ROSE never blocks them), and so does an RL worker
    whose lent claims are all allocated already (``PodInfo.claims_allocated``: it takes no new
    device). Other RL workers need:

    - a node the cache knows (else ``FailedNodes``: the cache may catch up; resolvable),
    - ``gpus`` free lendable GPUs, a pool whose idle window covers the minimum useful run, and
      host memory for their suspended state. Evicting pods cannot change any of these (RL
      victims are suspended, never evicted, so their lendable devices stay allocated; the
      forecast does not depend on pods), so they go to ``FailedAndUnresolvableNodes`` and
      kube-scheduler does not try preemption on those nodes.

    Decisions are computed once per (pool, free lendable GPUs) group, then looked up per node.
    """
    if pod.kind is not PodKind.RL or pod.claims_allocated:
        # an RL worker whose lent claims are all allocated (a time-slice group's shared claim) asks for
        # no new device: DRA holds it to the claim's node, and the new-claim rule does not apply
        return FilterDecision(passed=list(node_names))
    need = pod.gpus
    min_run = pod.min_run_s if pod.min_run_s is not None else cfg.default_min_run_s
    reasons = [_rl_group_reason(pool, free, need, outlooks, min_run) for pool, free in snapshot.groups]
    ok = [r is None for r in reasons]
    ok.append(False)  # index -1: node unknown
    group_get = snapshot.group_of.get
    passed = [n for n in node_names if ok[group_get(n, -1)]]
    out = FilterDecision(passed=passed)
    if len(passed) < len(node_names):
        for name in node_names:
            g = group_get(name)
            if g is None:
                out.failed[name] = "node not in the ROSE extender cache yet"
            elif reasons[g] is not None:
                out.unresolvable[name] = str(reasons[g])
    state = pod.state_bytes
    if state > 0 and snapshot.host_mem:
        mem_get = snapshot.host_mem.get
        keep = []
        for name in passed:
            free = mem_get(name)
            if free is not None and free < state:
                out.unresolvable[name] = (
                    f"host memory for suspended state: {free} bytes free (DRAM + disk tiers), pod needs {state}"
                )
            else:
                keep.append(name)
        out.passed = keep
    return out


# ---------------------------------------------------------------------------------------------
# prioritize


def _clamp(score: int) -> int:
    return max(MIN_EXTENDER_PRIORITY, min(MAX_EXTENDER_PRIORITY, score))


def serving_score(node: NodeState, cfg: PolicyConfig) -> int:
    """10 with no GPU lent (whole or in shares), else 9 minus one point per ``reclaim_cost_step_s`` (at least 1)."""
    if node.lent == 0 and node.shared_gpus == 0:
        return MAX_EXTENDER_PRIORITY
    return max(1, 9 - int(node.reclaim_cost_s // cfg.reclaim_cost_step_s))


# RL score points: idle window 0..WINDOW_POINTS, headroom 0..HEADROOM_POINTS, room for the pod
# twice on the node 0..1, togetherness 0..2 (a worker of the job in the pool, on the node).
WINDOW_POINTS = 4
HEADROOM_POINTS = 3


def pool_points(outlook: PoolOutlook | None, min_run_s: float, cfg: PolicyConfig) -> int:
    """A pool's share of an RL worker's score: the idle window (0..4, linear up to
    ``max_horizon_s``) plus the headroom over the minimum useful run (0..3, linear in the
    pool's spare share). Two pools that both stay free for the whole horizon differ by
    headroom: the roomier one, less likely to reclaim the GPU early, scores higher."""
    if outlook is None:
        return 0
    horizon = cfg.max_horizon_s
    window = round(WINDOW_POINTS * min(outlook.window_s, horizon) / horizon)
    return window + round(HEADROOM_POINTS * headroom(outlook, min_run_s))


def prioritize_nodes(
    pod: PodInfo,
    node_names: Sequence[str],
    snapshot: Snapshot,
    outlooks: Mapping[str, PoolOutlook],
    cfg: PolicyConfig,
) -> list[int]:
    """Scores 0..10 (MaxExtenderPriority) for every input node, in input order.

    RL worker: :func:`pool_points` (idle window 0..4 + headroom 0..3) + 1 where the node's free
    lendable GPUs fit the pod twice + togetherness (2 on a node with a worker of the same job,
    1 in a pool with one). Serving: :func:`serving_score`. Others and unknown nodes: 0.
    Computed once per pool and per (pool, free lendable GPUs) group, then looked up per node.
    """
    if pod.kind is PodKind.SERVING:
        get = snapshot.serving_score.get
        return [get(n, 0) for n in node_names]
    if pod.kind is not PodKind.RL:
        return [0] * len(node_names)
    need = max(1, pod.gpus)
    min_run = pod.min_run_s if pod.min_run_s is not None else cfg.default_min_run_s
    job_nodes = snapshot.job_nodes.get(f"{pod.namespace}/{pod.job}", frozenset()) if pod.job else frozenset()
    nodes = snapshot.nodes
    job_pools = {nodes[n].pool for n in job_nodes if n in nodes}
    per_pool = {pool: pool_points(outlooks.get(pool), min_run, cfg) for pool in {p for p, _ in snapshot.groups}}
    table = []
    for pool, free in snapshot.groups:
        score = per_pool[pool]
        if free >= 2 * need:
            score += 1
        if pool in job_pools:
            score += 1
        table.append(_clamp(score))
    table.append(0)  # unknown node
    group_get = snapshot.group_of.get
    scores = [table[group_get(n, -1)] for n in node_names]
    if job_nodes:
        # one more point (2 in all) on nodes already running a worker of the job
        for i, name in enumerate(node_names):
            if name in job_nodes:
                scores[i] = _clamp(scores[i] + 1)
    return scores


def index_nodes(
    states: Mapping[str, NodeState], cfg: PolicyConfig
) -> tuple[dict[str, int], list[tuple[str, int]], dict[str, int], dict[str, int]]:
    """Per-node indexes of a :class:`Snapshot`: group_of, groups, host_mem, serving_score."""
    group_of: dict[str, int] = {}
    groups: list[tuple[str, int]] = []
    index: dict[tuple[str, int], int] = {}
    host_mem: dict[str, int] = {}
    serving: dict[str, int] = {}
    for name, node in states.items():
        key = (node.pool, node.lendable_free)
        if key not in index:
            index[key] = len(groups)
            groups.append(key)
        group_of[name] = index[key]
        if node.host_mem_free is not None:
            host_mem[name] = node.host_mem_free
        serving[name] = serving_score(node, cfg)
    return group_of, groups, host_mem, serving


def build_snapshot(
    states: Mapping[str, NodeState],
    pods: Mapping[str, PodInfo],
    cfg: PolicyConfig,
    job_nodes: Mapping[str, frozenset[str]] | None = None,
) -> Snapshot:
    """A snapshot from plain node states (tests, tools); the cache maintains the same incrementally."""
    pools: dict[str, PoolState] = {}
    for n in states.values():
        p = pools.get(n.pool, PoolState(0, 0, 0))
        memory = min((m for m in (p.gpu_memory, n.gpu_memory) if m > 0), default=0)
        pools[n.pool] = PoolState(
            p.capacity + n.gpus,
            p.serving_used + n.serving_used,
            p.lent + n.lent,
            p.shared_gpus + n.shared_gpus,
            p.share_lent + n.share_lent,
            memory,
        )
    group_of, groups, host_mem, serving = index_nodes(states, cfg)
    return Snapshot(
        nodes=states,
        pools=pools,
        pods=pods,
        rl_pods={uid: p for uid, p in pods.items() if p.kind is PodKind.RL},
        job_nodes=job_nodes or {},
        group_of=group_of,
        groups=groups,
        host_mem=host_mem,
        serving_score=serving,
    )


# ---------------------------------------------------------------------------------------------
# preempt


MAX_SUSPEND_PER_CALL = 16  # more RL workers than a node has GPUs is never a legitimate victim list


@dataclass
class PreemptDecision:
    # node → (victim UIDs in the order given, NumPDBViolations)
    victims: dict[str, tuple[list[str], int]]
    suspend: list[PodInfo]  # RL workers to suspend instead of evicting
    kept_unknown: int = 0  # victims the cache does not know (kept: they cannot be RL workers we track)
    dropped_nodes: list[str] = field(default_factory=list)
    # nodes whose RL victims may not be suspended for this preemptor: (reason label, message)
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)


def verify_preemptor(claimed_uid: str, found: PodInfo | None) -> str:
    """Why the API server's view of the preemptor forbids suspending anything for it ("" = it may):
    it must exist with the UID the call names and still be pending (unbound)."""
    if found is None:
        return "preemptor not found"
    if not claimed_uid or found.uid != claimed_uid:
        return "preemptor UID does not match the pod's"
    if found.node:
        return "preemptor is already bound"
    if found.terminating:
        return "preemptor is being deleted"
    return ""


# why a node's RL victims may not be suspended (the metric's reason label, then a message)
REFUSE_PREEMPTOR = "preemptor-unverified"
REFUSE_PRIORITY = "not-outranked"
REFUSE_NODE = "wrong-node"
REFUSE_CAP = "victim-cap"


def _rl_refusal(
    node: str, rl: Sequence[PodInfo], preemptor_priority: int | None, max_suspend: int
) -> tuple[str, str] | None:
    """Why this node's RL victims may not be suspended (None = they may)."""
    if preemptor_priority is None:
        return REFUSE_PREEMPTOR, "the preemptor is not a pending pod the API server knows"
    if len(rl) > max_suspend:
        return REFUSE_CAP, f"{len(rl)} RL victims exceed the per-call cap of {max_suspend}"
    for p in rl:
        if p.node != node:
            return REFUSE_NODE, f"victim {p.key} runs on {p.node or 'no node'}, not {node}"
        if p.priority >= preemptor_priority:
            return REFUSE_PRIORITY, f"preemptor priority {preemptor_priority} does not outrank {p.key} ({p.priority})"
    return None


def preempt(
    candidates: Mapping[str, tuple[Sequence[str], int]],
    snapshot: Snapshot,
    preemptor_priority: int | None,
    max_suspend: int = MAX_SUSPEND_PER_CALL,
) -> PreemptDecision:
    """Turn kube-scheduler's preemption candidates into ones that never evict an RL worker.

    Victims are UIDs, looked up in the watch-fed cache only (never trusted from a request body).
    For each candidate node the victims split into RL workers and the rest.
    1. Nodes whose victims include no RL worker ("pure") are returned unchanged. If any exist,
       only they are returned and nothing is suspended: kube-scheduler can make room without
       touching RL work. Mixed nodes are dropped, because their other victims alone would not
       make room (evicting them would be wasted).
    2. Otherwise one node is chosen among those whose RL victims may be suspended for this
       preemptor (``preemptor_priority`` from the API server, None when the preemptor could not be
       verified: then none may; each victim must run on that node, be outranked by the preemptor,
       and be at most ``max_suspend`` in number) — the fewest victims that must be evicted, then RL
       workers already asked to suspend (a retry keeps its choice), then the cheapest reclaim, then
       the name — and its RL workers are suspended instead of evicted. It is returned with its other
       victims if it has any; a node left with no victim is dropped (kube-scheduler requires at
       least one victim per node), and the pod is retried once the suspended workers give back
       their resources. Refused nodes are dropped: an RL worker is never handed back for eviction.
    Victims the cache does not know are kept (never silently protected or dropped, never
    suspended). Victim order (decreasing priority, which kube-scheduler relies on) is preserved.
    """
    cached = snapshot.pods
    rl_pods = snapshot.rl_pods
    if rl_pods is None:
        rl_pods = {uid: p for uid, p in cached.items() if p.kind is PodKind.RL}
    rl_uids = rl_pods.keys()
    pure: dict[str, tuple[list[str], int]] = {}
    mixed: dict[str, tuple[list[str], list[PodInfo], int]] = {}
    refused: dict[str, tuple[str, str]] = {}
    unknown = 0
    known = cached.__contains__
    for node, (uids, pdb) in candidates.items():
        if rl_uids.isdisjoint(uids):
            # the common case, screened in C: no RL worker among this node's victims
            if uids:
                pure[node] = (uids if isinstance(uids, list) else list(uids), pdb)
                unknown += len(uids) - sum(map(known, uids))
            continue
        others: list[str] = []
        rl: list[PodInfo] = []
        for uid in uids:
            info = cached.get(uid)
            if info is None:
                unknown += 1
                others.append(uid)
            elif info.kind is PodKind.RL:
                rl.append(info)
            else:
                others.append(uid)
        why = _rl_refusal(node, rl, preemptor_priority, max_suspend)
        if why:
            refused[node] = why
        else:
            mixed[node] = (others, rl, pdb)
    if pure:
        dropped = sorted([*mixed, *refused])
        return PreemptDecision(victims=pure, suspend=[], kept_unknown=unknown, dropped_nodes=dropped, refused=refused)
    if not mixed:
        return PreemptDecision(
            victims={}, suspend=[], kept_unknown=unknown, dropped_nodes=sorted(refused), refused=refused
        )
    nodes = snapshot.nodes

    def rank(item: tuple[str, tuple[list[str], list[PodInfo], int]]) -> tuple[int, int, int, float, str]:
        name, (others, rl, pdb) = item
        pending = sum(1 for p in rl if not p.suspend_requested)
        node = nodes.get(name)
        cost = node.reclaim_cost_s if node is not None else math.inf
        return (len(others), pdb, pending, cost, name)

    chosen, (others, rl, pdb) = min(mixed.items(), key=rank)
    victims = {chosen: (others, pdb)} if others else {}
    dropped = sorted(n for n in [*mixed, *refused] if n not in victims)
    return PreemptDecision(victims=victims, suspend=rl, kept_unknown=unknown, dropped_nodes=dropped, refused=refused)


# ---------------------------------------------------------------------------------------------
# withdrawal of the extender's own suspend requests

WITHDRAW_BOUND = "preemptor-bound"
WITHDRAW_GONE = "preemptor-gone"
WITHDRAW_TTL = "ttl"


@dataclass(frozen=True)
class OwnRequest:
    """A suspend request the extender wrote (``by`` is the extender), and for which preemptor."""

    preemptor_namespace: str
    preemptor_name: str
    preemptor_uid: str
    at: datetime.datetime


def own_request(raw: str) -> OwnRequest | None:
    """The extender's request in a ``rose.io/suspend-request`` value; None when another owner
    (the planner, the time-slice orchestrator) wrote it or it is not one the extender can read:
    the extender withdraws only its own requests."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("by") != extender_names.EXTENDER_COMPONENT:
        return None
    pre = doc.get("preemptor")
    at = doc.get("at")
    if not isinstance(pre, dict) or not isinstance(at, str):
        return None
    ns, name, uid = pre.get("namespace"), pre.get("name"), pre.get("uid")
    if not (isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str)):
        return None
    try:
        stamp = parse_rfc3339(at)
    except ValueError:
        return None
    return OwnRequest(ns, name, uid, stamp)


def withdraw_reason(req: OwnRequest, preemptor: PodInfo | None, now: datetime.datetime, ttl_s: float) -> str:
    """Why the extender's request should be withdrawn now ("" = keep it): the preemptor it was
    made for is bound (it got its place) or gone (deleted, or recreated with another UID), or
    the request outlived ``ttl_s`` (nothing stays parked because nobody removes it)."""
    if preemptor is None or preemptor.uid != req.preemptor_uid or preemptor.terminating:
        return WITHDRAW_GONE
    if preemptor.node:
        return WITHDRAW_BOUND
    if (now - req.at).total_seconds() >= ttl_s:
        return WITHDRAW_TTL
    return ""
