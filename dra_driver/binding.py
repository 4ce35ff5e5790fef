"""Serving waits in the scheduler: the pure half of the driver's binding conditions.

I/O boundary: none. The driver publishes every serving device (whole, and with ``--gpu-shares``
serving's fraction device ``gpu-N-servingshare``) with the binding condition
``rose.io/device-freed`` and its failure twin ``rose.io/device-free-failed``
(:func:`rose_common.slices.gpu_devices`). The scheduler's DynamicResources plugin then writes a
serving claim's allocation and waits in PreBind (at most its ``bindingTimeout``) until every
allocated device's condition is True in ``status.devices[].conditions``, or fails the binding
(deallocates the claim, reschedules the pod) when the failure condition is True.

This module decides, from a claim as the API returns it:

- :func:`demand`: what the driver still owes a claim allocated on this node (the serving
  devices whose binding condition it has not reported yet, and what its fractions consumed);
- :func:`bound_here`: the GPUs a claim allocated on this node with ROSE's binding conditions
  holds, reported or not (a hold the driver keeps until the claim is prepared or deallocated);
- :func:`status_patch`: the ``status`` merge patch that reports an outcome, keeping every other
  driver's and device's entries;
- :func:`resolve_mode`: ``--serving-wait`` against what the API server keeps.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from dra_driver.claims import PodRef
from rose_common import names
from rose_common.kube import objects
from rose_common.quantity import to_int
from rose_common.slices import parse_device_name
from rose_common.timefmt import rfc3339

MODE_PREBIND = "prebind"
MODE_PREPARE = "prepare"
MODE_AUTO = "auto"
MODES = (MODE_AUTO, MODE_PREBIND, MODE_PREPARE)
REASON_FREED = "Freed"  # an occupant was reclaimed and the device observed free
REASON_NO_OCCUPANT = "NoOccupant"  # nothing lent on the GPU
REASON_NOT_FREED = "NotFreed"  # still observed occupied after the enforcement
REASON_OVERRIDE = "ServingOnOccupiedDevice"  # --allow-serving-on-occupied-device let it through
MESSAGE_MAX = 1024  # of the 32 KiB a condition's message may hold: enough, and Events stay short


@dataclass(frozen=True)
class Fraction:
    """Serving's fraction of one GPU in an allocation (``gpu-N-servingshare``): what it consumed."""

    gpu: int
    memory_bytes: int
    compute_percent: int


@dataclass(frozen=True)
class Demand:
    """A serving claim allocated on this node whose binding condition the driver still owes."""

    claim_uid: str
    namespace: str
    name: str
    devices: tuple[str, ...]  # the serving devices of this node's pool to report on
    gpus: tuple[int, ...]  # their physical GPU indexes
    pods: tuple[PodRef, ...]  # reservedFor: the pods waiting in PreBind
    # serving's fractions among them (servingshare results, one per share): on their GPUs only the
    # RL shares that no longer fit are reclaimed (``shares.reclaim_for_serving``), not every occupant
    fractions: tuple[Fraction, ...] = ()

    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Outcome:
    """What :meth:`dra_driver.node.NodeDriver.free_for_binding` found: freed, or not and why."""

    freed: bool
    reason: str
    message: str
    seconds: float = 0.0


def _results(claim: dict[str, Any], driver: str, node: str) -> list[dict[str, Any]]:
    """The allocation's results on this node's pool that carry ROSE's binding condition."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    out = []
    for r in (alloc.get("devices") or {}).get("results") or []:
        if r.get("driver") != driver or r.get("pool") != node:
            continue
        if names.BINDING_CONDITION_FREED not in (r.get("bindingConditions") or []):
            continue
        try:
            _, role = parse_device_name(str(r.get("device", "")))
        except ValueError:
            continue
        if role in names.SERVING_ROLES:
            out.append(r)
    return out


def fraction(result: dict[str, Any]) -> Fraction | None:
    """A serving-fraction result's consumed capacity; None for a whole device, or one whose
    ``consumedCapacity`` is missing or bad (the scheduler always writes it; the prepare refuses it)."""
    try:
        gpu, role = parse_device_name(str(result.get("device", "")))
        consumed = result.get("consumedCapacity") or {}
        memory = to_int(str(consumed[names.CAPACITY_MEMORY]))
        compute = to_int(str(consumed[names.CAPACITY_COMPUTE]))
    except (KeyError, ValueError):
        return None
    if role != names.ROLE_SERVING_SHARE or memory <= 0 or compute <= 0:
        return None
    return Fraction(gpu, memory, compute)


def _reported(claim: dict[str, Any], driver: str, node: str, device: str) -> bool:
    """True when the claim's status already says freed or failed for this device."""
    for d in (claim.get("status") or {}).get("devices") or []:
        if (d.get("driver"), d.get("pool"), d.get("device")) != (driver, node, device):
            continue
        for c in d.get("conditions") or []:
            if c.get("type") in (names.BINDING_CONDITION_FREED, names.BINDING_CONDITION_FREE_FAILED) and (
                c.get("status") == "True"
            ):
                return True
    return False


def bound_here(claim: dict[str, Any], driver: str, node: str) -> tuple[int, ...]:
    """The GPU indexes of this node a claim holds through ROSE's binding conditions (empty: none)."""
    if objects.deleting(claim):
        return ()
    return tuple(sorted({parse_device_name(str(r["device"]))[0] for r in _results(claim, driver, node)}))


def demand(claim: dict[str, Any], driver: str, node: str) -> Demand | None:
    """The binding conditions the driver owes this claim (None: nothing owed here).

    Owed: the claim is allocated on this node's pool, one of its results is a serving device with
    ROSE's binding condition, the scheduler reserved it for a pod (it is in PreBind), and the
    claim's status does not yet report that device freed or failed. A claim being deleted is owed
    nothing."""
    if objects.deleting(claim):
        return None
    results = [r for r in _results(claim, driver, node) if not _reported(claim, driver, node, str(r["device"]))]
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    if not results or not reserved:
        return None
    ns = objects.namespace(claim)
    pods = tuple(
        PodRef(namespace=ns, name=str(r.get("name", "")), uid=str(r.get("uid", "")))
        for r in reserved
        if r.get("resource") == "pods" and r.get("name")
    )
    devices = tuple(sorted({str(r["device"]) for r in results}))
    fractions = tuple(f for r in results if (f := fraction(r)) is not None)
    return Demand(
        claim_uid=objects.uid(claim),
        namespace=ns,
        name=objects.name(claim),
        devices=devices,
        gpus=tuple(sorted({parse_device_name(d)[0] for d in devices})),
        pods=pods,
        fractions=fractions,
    )


def condition(outcome: Outcome, now: datetime.datetime) -> dict[str, Any]:
    """The metav1.Condition that reports ``outcome`` (True: the scheduler acts on it)."""
    return {
        "type": names.BINDING_CONDITION_FREED if outcome.freed else names.BINDING_CONDITION_FREE_FAILED,
        "status": "True",
        "reason": outcome.reason,
        "message": outcome.message[:MESSAGE_MAX],
        "lastTransitionTime": rfc3339(now),
    }


def status_patch(
    claim: dict[str, Any], driver: str, node: str, devices: tuple[str, ...], outcome: Outcome, now: datetime.datetime
) -> dict[str, Any]:
    """A JSON merge patch of the claim's ``status.devices`` reporting ``outcome`` on ``devices``.

    A merge patch replaces the whole list, so every other entry (other drivers, other devices) and
    every other condition of ours is kept; ``metadata.resourceVersion`` makes the API server refuse
    it (409) when the claim changed since it was read. ValueError: a device not in the allocation."""
    results = _results(claim, driver, node)
    allocated = {str(r["device"]) for r in results}
    missing = [d for d in devices if d not in allocated]
    if missing:
        raise ValueError(f"claim {objects.namespace(claim)}/{objects.name(claim)}: {missing} not allocated here")
    cond = condition(outcome, now)
    entries = [dict(d) for d in (claim.get("status") or {}).get("devices") or []]
    for r in results:
        if str(r["device"]) not in devices:
            continue
        # a serving fraction's result has a shareID: its status entry names the same share (the API
        # server checks every entry against the allocation; the scheduler matches driver/pool/device)
        key = (driver, node, str(r["device"]), r.get("shareID"))
        entry = next((e for e in entries if _entry_key(e) == key), None)
        if entry is None:
            entry = {"driver": driver, "pool": node, "device": key[2]}
            if key[3]:
                entry["shareID"] = key[3]
            entries.append(entry)
        kept = [c for c in entry.get("conditions") or [] if c.get("type") != cond["type"]]
        entry["conditions"] = [*kept, cond]
    return {"metadata": {"resourceVersion": objects.resource_version(claim)}, "status": {"devices": entries}}


def _entry_key(e: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (e.get("driver"), e.get("pool"), e.get("device"), e.get("shareID"))


def resolve_mode(requested: str, api_keeps_binding_conditions: bool | None) -> tuple[str, str]:
    """``--serving-wait`` against the API server: (mode, what to report at start).

    ``api_keeps_binding_conditions`` is whether a dry-run create of a ResourceSlice kept a device's
    ``bindingConditions`` (the API server drops fields of disabled feature gates); None: the probe
    itself failed. ``auto`` takes prebind only on a yes. ValueError: ``prebind`` asked for where the
    API server drops the field (serving pods would never wait, and never be held back either)."""
    if requested not in MODES:
        raise ValueError(f"--serving-wait must be one of {', '.join(MODES)}, got {requested!r}")
    if requested == MODE_PREPARE:
        return MODE_PREPARE, "serving waits in NodePrepareResources (--serving-wait=prepare)"
    if api_keeps_binding_conditions:
        return MODE_PREBIND, "serving waits in the scheduler's PreBind: the API server keeps device bindingConditions"
    why = (
        "the API server drops device bindingConditions (feature gates DRADeviceBindingConditions and"
        " DRAResourceClaimDeviceStatus off)"
        if api_keeps_binding_conditions is False
        else "probing the API server for device bindingConditions failed"
    )
    if requested == MODE_PREBIND:
        raise ValueError(f"--serving-wait=prebind: {why}; use --serving-wait=prepare or auto")
    return MODE_PREPARE, f"serving waits in NodePrepareResources: {why}"
