"""The planner's reclaim taint, carried onto a GPU's share devices (issue 27 §2 and §3).

I/O boundary: none (the watch is :mod:`dra_driver.rulewatch`, the slice
:mod:`dra_driver.publisher`). Decisions: :func:`planned_reclaims` here and
:func:`rose_common.slices.taint_reclaim_planned`.

The elastic controller taints a pool it expects serving to need within the reclaim lead with one
``NoSchedule`` DeviceTaintRule ``rose.io/reclaim-planned`` per *lendable* device
(``elastic_controller/taints.py``). With ``--gpu-shares`` the same GPU is also published as
``gpu-N-share``, which no rule names: without more, a share claim would land on a GPU about to be
reclaimed. So the driver watches those rules, and every GPU whose lent device a rule taints is
published with the same taint on its other lent devices (its share devices) in the driver's own
ResourceSlice; the taint goes from them when the rule goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rose_common import names
from rose_common.kube import objects
from rose_common.slices import parse_device_name

Planned = dict[int, dict[str, str]]  # GPU index → its reclaim taint (key, value, effect)


def planned_reclaims(
    rules: Iterable[Mapping[str, Any]], node: str, driver: str = names.DRIVER_NAME
) -> tuple[Planned, frozenset[str]]:
    """``(GPU index → reclaim taint, device names the rules name)`` on ``node``: the
    DeviceTaintRules with key ``rose.io/reclaim-planned`` whose ``deviceSelector`` names a lent
    device (lendable or share) of ``driver`` in the pool ``node`` (a selector without driver or
    pool matches any). A rule without a device taints the whole pool already (shares included) and
    adds nothing here; another key, driver, pool or a device that is not a lent GPU device is
    ignored. Two rules on one GPU: the first by name wins. Pure."""
    planned: Planned = {}
    ruled: set[str] = set()
    for rule in sorted(rules, key=objects.name):
        spec = rule.get("spec") or {}
        taint, sel = spec.get("taint") or {}, spec.get("deviceSelector") or {}
        if taint.get("key") != names.TAINT_RECLAIM_PLANNED or not sel.get("device"):
            continue
        if sel.get("driver", driver) != driver or sel.get("pool", node) != node:
            continue
        try:
            index, role = parse_device_name(str(sel["device"]))
        except ValueError:
            continue
        if role not in names.LENT_ROLES:
            continue
        ruled.add(str(sel["device"]))
        planned.setdefault(
            index, {"key": str(taint["key"]), "value": str(taint.get("value", "")), "effect": str(taint.get("effect"))}
        )
    return planned, frozenset(ruled)
