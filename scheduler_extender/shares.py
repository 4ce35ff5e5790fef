"""The extender's decisions for RL pods that claim GPU *shares* (issue 27 §3): pure functions.

A pod's claim against DeviceClass ``share.gpu.rose.io`` with a capacity request (memory, compute)
asks for a fraction of one GPU (``rose driver --gpu-shares`` publishes ``gpu-N-share``). The
extender then counts lendable capacity in shares:

- **A share's size** is the larger of its two fractions of the GPU:
  ``max(memory ÷ GPU memory, compute % ÷ 100)`` (:func:`share_fraction`; the pool's smallest
  share device's memory, so a size is never understated).
- **A GPU lent in shares counts as the fraction its shares use** (the same ``max`` over their
  summed ``consumedCapacity``). A pool's lendable room for a share at each forecast point is
  ``capacity - ⌈serving forecast⌉ - GPUs lent whole - fractions lent in shares``.
- **Serving is counted in whole GPUs** (``⌈d⌉``, :func:`serving_gpus`). A serving claim holds a
  whole GPU, and the driver reclaims every share on a GPU serving claims (serving wins, the share
  first). So a forecast of 7.4 GPUs on 8 leaves no room for a share: the 8th GPU would be claimed
  by serving's 8th replica and the share suspended at once. The rule in one line: *a share may go
  where no whole GPU is free only on a GPU already partly lent in shares, and only if the forecast
  leaves that GPU free of serving for the pod's minimum useful run*. With no usable forecast the
  fallback rule (``--fallback-headroom`` of the pool free after placing the share) applies, with
  the share's fraction as the need.
- **A node passes** when its pool's outlook is long enough and one of its GPUs that serving does
  not hold and that is not lent whole has room for each share (first fit, largest share first:
  :func:`fit_shares`). The DRA allocator, not the extender, picks the GPU: it may open a fresh GPU
  for the share rather than fill a partly shared one (then the pool's shared GPUs grow by one).

A pod that claims shares is judged on its shares only (a pod mixing whole and share claims is
judged on the shares; ElasticRLJob workers have one claim). No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from rose_common import lending, names, slices
from rose_common.quantity import QuantityError, parse_quantity
from rose_common.slices import SHARE_COMPUTE_STEP, SHARE_COMPUTE_TOTAL, SHARE_MEMORY_STEP
from scheduler_extender.model import NodeState, PodInfo, PoolForecast, PoolState, ShareRequest, Snapshot
from scheduler_extender.policy import (
    FilterDecision,
    PolicyConfig,
    PoolOutlook,
    forecast_age,
    pool_points,
    window_over,
)
from scheduler_extender.wire import MAX_EXTENDER_PRIORITY

GIB = 2**30


# ---------------------------------------------------------------------------------------------
# Claims → share requests


def _step_up(value: Decimal, step: int, minimum: int) -> int:
    """A capacity request rounded up to the request policy's step, as the scheduler does."""
    units = math.ceil(value / step) if value > 0 else 0
    return max(minimum, units * step)


def _capacity(requests: Mapping[str, Any], key: str, step: int) -> int:
    raw = requests.get(key)
    if raw is None:
        return step  # the request policy's default (one step)
    try:
        value = parse_quantity(str(raw))
    except QuantityError:
        return step
    return _step_up(value, step, step)


def claim_share_requests(spec: Mapping[str, Any] | None) -> tuple[ShareRequest, ...]:
    """The GPU shares a ResourceClaim's ``spec`` asks for: each ``exactly`` request of DeviceClass
    ``share.gpu.rose.io`` (``count`` times), its ``capacity.requests`` rounded up to the driver's
    policy (memory in 1 GiB steps, compute in 5 % steps; an absent capacity is the policy's default,
    one step). Empty for a claim of whole GPUs."""
    devices = (spec or {}).get("devices") or {}
    out: list[ShareRequest] = []
    for req in devices.get("requests") or []:
        exact = req.get("exactly") if isinstance(req, Mapping) else None
        if not isinstance(exact, Mapping) or exact.get("deviceClassName") != names.DEVICE_CLASS_SHARE:
            continue
        capacity = exact.get("capacity") or {}
        requests = capacity.get("requests") or {} if isinstance(capacity, Mapping) else {}
        if not isinstance(requests, Mapping):
            requests = {}
        share = ShareRequest(
            memory_bytes=_capacity(requests, names.CAPACITY_MEMORY, SHARE_MEMORY_STEP),
            compute_percent=min(SHARE_COMPUTE_TOTAL, _capacity(requests, names.CAPACITY_COMPUTE, SHARE_COMPUTE_STEP)),
        )
        count = exact.get("count")
        out += [share] * (count if isinstance(count, int) and 0 < count <= 64 else 1)
    return tuple(out)


def consumed(result: Mapping[str, Any]) -> tuple[int, int]:
    """(memory bytes, compute %) an allocation result's ``consumedCapacity`` holds; (0, 0) without."""
    cap = result.get("consumedCapacity") or {}
    if not isinstance(cap, Mapping):
        return 0, 0
    out = []
    for key in (names.CAPACITY_MEMORY, names.CAPACITY_COMPUTE):
        try:
            out.append(int(parse_quantity(str(cap.get(key, "0")))))
        except QuantityError:
            out.append(0)
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# Sizes and fits


def share_fraction(req: ShareRequest, gpu_memory: int) -> float:
    """The fraction of a GPU a share takes: the larger of its memory and compute fractions."""
    return slices.share_fraction(req.memory_bytes, req.compute_percent, gpu_memory)


def used_fraction(memory_bytes: int, compute_percent: int, gpu_memory: int) -> float:
    """The fraction of one GPU its allocated shares use (their summed consumedCapacity), ≤ 1."""
    return min(1.0, share_fraction(ShareRequest(memory_bytes, compute_percent), gpu_memory))


def serving_gpus(demand: float) -> int:
    """Serving's forecast in whole GPUs: a serving claim holds a whole GPU, and the driver reclaims
    every share on a GPU serving claims, so a fractional forecast leaves no share room."""
    return max(0, math.ceil(demand - 1e-9))


def fit_shares(rooms: Iterable[tuple[int, int]], requests: Sequence[ShareRequest]) -> bool:
    """Whether every share fits a GPU's room ((free memory, free compute %) per GPU): first fit,
    largest share first (several shares of one pod may land on one GPU)."""
    free = [list(r) for r in rooms]
    for req in sorted(requests, key=lambda r: (r.memory_bytes, r.compute_percent), reverse=True):
        for room in free:
            if room[0] >= req.memory_bytes and room[1] >= req.compute_percent:
                room[0] -= req.memory_bytes
                room[1] -= req.compute_percent
                break
        else:
            return False
    return True


def describe(requests: Sequence[ShareRequest]) -> str:
    """``a share of 20 GiB + 25 %`` (or ``2 shares of …``) for verdicts."""
    sizes = ", ".join(f"{r.memory_bytes / GIB:g} GiB + {r.compute_percent} %" for r in requests)
    return f"a share of {sizes}" if len(requests) == 1 else f"{len(requests)} shares of {sizes}"


# ---------------------------------------------------------------------------------------------
# Pools


def share_outlook(
    pool: PoolState, forecast: PoolForecast | None, need: float, cfg: PolicyConfig, now: float | None = None
) -> PoolOutlook:
    """Idle window and spare profile of one pool for shares totalling ``need`` of a GPU: lent =
    GPUs lent whole + the fractions lent in shares; serving in whole GPUs (:func:`serving_gpus`)."""
    lent = pool.lent + pool.share_lent
    free_now = lending.spare_for_new_claim(pool.capacity, pool.serving_used, lent)
    points = () if forecast is None else tuple((h, float(serving_gpus(d))) for h, d in forecast.points)
    window, fallback = window_over(pool.capacity, free_now, lent, points, need, cfg, forecast_age(forecast, now))
    spare = tuple((h, lending.spare_for_new_claim(pool.capacity, d, lent) - need) for h, d in points)
    basis = "quantile" if forecast is None else forecast.basis
    return PoolOutlook(window, pool.capacity, free_now - need, spare, fallback, basis)


def pool_needs(snapshot: Snapshot, requests: Sequence[ShareRequest]) -> dict[str, float]:
    """Per pool, the fraction of a GPU the pod's shares take there."""
    return {p: sum(share_fraction(r, pool.gpu_memory) for r in requests) for p, pool in snapshot.pools.items()}


def share_outlooks(
    snapshot: Snapshot,
    forecasts: Mapping[str, PoolForecast | None],
    requests: Sequence[ShareRequest],
    cfg: PolicyConfig,
    now: float | None = None,
) -> tuple[dict[str, PoolOutlook], list[str]]:
    """:func:`share_outlook` per pool, and the pools that used the fallback (no usable forecast)."""
    needs = pool_needs(snapshot, requests)
    outlooks: dict[str, PoolOutlook] = {}
    fallbacks: list[str] = []
    for name, pool in snapshot.pools.items():
        outlooks[name] = share_outlook(pool, forecasts.get(name), needs[name], cfg, now)
        if outlooks[name].fallback:
            fallbacks.append(name)
    return outlooks, fallbacks


# ---------------------------------------------------------------------------------------------
# filter and prioritize


def _room_text(node: NodeState) -> str:
    if not node.share_room:
        return "no GPU of this node can take a share (serving holds it, it is lent whole, or no --gpu-shares)"
    best = max(node.share_room)
    return f"the roomiest GPU has {best[0] / GIB:g} GiB + {best[1]} % free for shares"


def node_reason(
    node: NodeState | None,
    pod: PodInfo,
    outlooks: Mapping[str, PoolOutlook],
    pools: Mapping[str, PoolState],
    min_run: float,
) -> str | None:
    """Why a node cannot take the pod's shares (None: it can). The verdict says it counted shares."""
    if node is None:
        return None
    what = describe(pod.shares)
    if not fit_shares(node.share_room, pod.shares):
        return f"no room for {what} on one GPU: {_room_text(node)}"
    outlook = outlooks.get(node.pool)
    window = 0.0 if outlook is None else outlook.window_s
    if window >= min_run:
        return None
    pool = pools.get(node.pool, PoolState(0, 0, 0))
    at = "" if outlook is None or outlook.basis == "quantile" else f" (at {outlook.basis})"
    return (
        f"serving forecast{at} needs pool {node.pool!r} within {window:.0f}s < min useful run {min_run:.0f}s "
        f"for {what} (counted in shares: {pool.capacity} GPUs, serving in whole GPUs, "
        f"{pool.lent} lent whole, {pool.share_lent:.2f} GPU lent in shares)"
    )


def filter_nodes(
    pod: PodInfo, node_names: Sequence[str], snapshot: Snapshot, outlooks: Mapping[str, PoolOutlook], cfg: PolicyConfig
) -> FilterDecision:
    """Filter for an RL pod with shares: every reason goes to FailedAndUnresolvableNodes (evicting
    pods frees no share room the forecast would allow), except an unknown node (FailedNodes). The
    host-memory rule is the whole-GPU one (a suspended share's state goes to host memory too)."""
    min_run = pod.min_run_s if pod.min_run_s is not None else cfg.default_min_run_s
    out = FilterDecision(passed=[])
    nodes = snapshot.nodes
    state = pod.state_bytes
    for name in node_names:
        node = nodes.get(name)
        if node is None:
            out.failed[name] = "node not in the ROSE extender cache yet"
            continue
        why = node_reason(node, pod, outlooks, snapshot.pools, min_run)
        free = snapshot.host_mem.get(name)
        if why is None and state > 0 and free is not None and free < state:
            why = f"host memory for suspended state: {free} bytes free (DRAM + disk tiers), pod needs {state}"
        if why is None:
            out.passed.append(name)
        else:
            out.unresolvable[name] = why
    return out


def prioritize_nodes(
    pod: PodInfo, node_names: Sequence[str], snapshot: Snapshot, outlooks: Mapping[str, PoolOutlook], cfg: PolicyConfig
) -> list[int]:
    """Scores 0..10 for an RL pod with shares: the pool's :func:`pool_points` on the share outlook
    (idle window 0..4, headroom in GPU fractions 0..3) + 1 where the node's GPUs take the shares
    twice + togetherness (1 in a pool, 2 on a node with a worker of the same job). 0 for a node
    with no room for the shares."""
    min_run = pod.min_run_s if pod.min_run_s is not None else cfg.default_min_run_s
    job_nodes = snapshot.job_nodes.get(f"{pod.namespace}/{pod.job}", frozenset()) if pod.job else frozenset()
    nodes = snapshot.nodes
    job_pools = {nodes[n].pool for n in job_nodes if n in nodes}
    per_pool = {p: pool_points(o, min_run, cfg) for p, o in outlooks.items()}
    twice = (*pod.shares, *pod.shares)
    scores = []
    for name in node_names:
        node = nodes.get(name)
        if node is None or not fit_shares(node.share_room, pod.shares):
            scores.append(0)
            continue
        score = per_pool.get(node.pool, 0)
        score += fit_shares(node.share_room, twice)
        score += (node.pool in job_pools) + (name in job_nodes)
        scores.append(min(MAX_EXTENDER_PRIORITY, score))
    return scores
