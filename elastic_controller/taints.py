"""The planner's intent as device taints (issue 27 §2).

I/O boundary: none. When the forecast says serving will need a pool's GPUs within the reclaim lead
time, a new lendable claim there would be reclaimed at once: the pool's *lendable* devices get a
``NoSchedule`` taint (``rose.io/reclaim-planned``), so the scheduler's DynamicResources plugin
allocates no new lendable claim on them; the taint goes when the forecast falls. Serving devices
are never tainted (serving is what the taint makes room for), and claims already allocated keep
running (``NoSchedule`` evicts nothing: a reclaim suspends the workload, it does not evict it).

The taint is a set of DeviceTaintRules (resource.k8s.io/v1 on Kubernetes v1.37), one per lendable
device: a rule's ``deviceSelector`` names a driver, a pool and a device, and a pool-wide rule would
also taint the serving devices the driver publishes in the same DRA pool (the node).

- :func:`decide` — per planner pool: a reason to taint (the numbers behind it), ``None`` to
  untaint, or no entry (a frozen pool, a forecast that does not cover the window: no decision,
  existing rules stay as they are).
- :func:`desired_rules` — the rules for the pools to taint.
- :func:`diff` — what to create and delete so the owned rules match.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_controller.planner import Plan, PlanInput
from rose_common import names
from rose_common.kube import objects

RULE_PREFIX = "rose-reclaim-"
ANNOTATION_REASON = f"{names.LABEL_PREFIX}/reclaim-taint-reason"
_NAME_OK = re.compile(r"[^a-z0-9.-]")


@dataclass(frozen=True)
class Decision:
    pool: str
    taint: bool
    reason: str  # why (both ways), for the log, the rule's annotation and the Event-free audit trail


def decide(inp: PlanInput, result: Plan, lead_s: float) -> dict[str, Decision]:
    """Per pool: taint when serving's forecast need over ``[now, now + window]`` leaves no GPU to
    lend once this plan's reclaims are done (``capacity - ceil(peak) - lent <= 0``), where the
    window is the time to the next plan plus the longest reclaim lead of the pool's occupants, and
    at least ``lead_s`` (the lead a new lent claim would need). A frozen pool, or one whose forecast
    does not cover the window, gets no decision."""
    if lead_s < 0:
        raise ValueError(f"taint lead must be >= 0 seconds, got {lead_s}")
    leads: dict[str, float] = {}
    jobs = {j.key: j for j in inp.jobs}
    for w in inp.workers:
        if w.pool is not None and w.job in jobs:
            leads[w.pool] = max(leads.get(w.pool, 0.0), jobs[w.job].lead_s)
    placing = _placing(inp, result)
    out: dict[str, Decision] = {}
    for p in inp.pools:
        window = inp.settings.interval_s + max(lead_s, leads.get(p.name, 0.0))
        if p.frozen:
            continue
        peak = p.forecast.peak(inp.now, inp.now + window)
        if math.isinf(peak):
            continue
        need, lent, new = math.ceil(peak), result.lent.get(p.name, 0), placing.get(p.name, 0)
        # The planner's own new workers (added now, or pending from an earlier plan) are lent claims
        # still to be allocated: a NoSchedule taint would keep them off the GPUs the plan gave them.
        room = p.capacity - need - (lent - new)
        why = (
            f"serving may need {need} of {p.capacity} GPUs within {window:.0f}s "
            f"({lent} lent after this plan, {new} of them being placed): {max(room, 0)} left to lend"
        )
        out[p.name] = Decision(p.name, room <= 0, why)
    return out


def _placing(inp: PlanInput, result: Plan) -> dict[str, int]:
    """Per pool: the planner's workers whose lent claims are still to be allocated — this plan's
    adds and the workers still pending from an earlier plan (not removed by this one)."""
    removed = {w for t in result.targets.values() for w in t.remove}
    out: dict[str, int] = {}
    for t in result.targets.values():
        for pool in t.add:
            out[pool] = out.get(pool, 0) + 1
    for w in inp.workers:
        if w.state == "pending" and w.pool is not None and w.name not in removed:
            out[w.pool] = out.get(w.pool, 0) + 1
    return out


def rule_name(node: str, device: str) -> str:
    """A DNS-subdomain name for the rule of one device (a hash keeps long names unique)."""
    base = _NAME_OK.sub("-", f"{node}.{device}".lower()).strip(".-")
    if len(RULE_PREFIX) + len(base) <= 253:
        return RULE_PREFIX + base
    h = hashlib.sha256(base.encode()).hexdigest()[:12]
    return f"{RULE_PREFIX}{base[: 253 - len(RULE_PREFIX) - 13]}-{h}"


def desired_rules(
    decisions: Mapping[str, Decision], devices: Mapping[str, Iterable[tuple[str, str]]]
) -> dict[str, dict[str, Any]]:
    """The DeviceTaintRules for the pools to taint: one per lendable device ``(node, device)`` of
    the pool (the DRA pool of the ROSE driver is the node)."""
    out: dict[str, dict[str, Any]] = {}
    for pool, d in sorted(decisions.items()):
        if not d.taint:
            continue
        for node, device in sorted(devices.get(pool, ())):
            name = rule_name(node, device)
            out[name] = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {
                    "name": name,
                    "labels": {names.LABEL_TAINT_POOL: pool},
                    "annotations": {ANNOTATION_REASON: d.reason},
                },
                "spec": {
                    "deviceSelector": {"driver": names.DRIVER_NAME, "pool": node, "device": device},
                    "taint": {"key": names.TAINT_RECLAIM_PLANNED, "value": pool, "effect": "NoSchedule"},
                },
            }
    return out


def diff(
    existing: Iterable[Mapping[str, Any]], desired: Mapping[str, dict[str, Any]], decided: Iterable[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(rules to create, rule names to delete): owned rules of a decided pool that are not desired
    go; rules of a pool without a decision (frozen) stay; desired ones missing are created."""
    decided_pools = set(decided)
    have = {objects.name(r): r for r in existing}
    create = [body for name, body in sorted(desired.items()) if name not in have]
    delete = sorted(
        name
        for name, r in have.items()
        if name not in desired and objects.labels(r).get(names.LABEL_TAINT_POOL, "") in decided_pools
    )
    return create, delete
