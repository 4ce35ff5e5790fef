"""Give a suspended RL worker's CPU back to the scheduler through ``pods/resize``, and restore it.

Pure decisions, no I/O (:mod:`dra_driver.kube` does the requests). While a worker's GPU state sits
in host memory its process only waits, yet its CPU requests keep counting in the scheduler's
accounting, so a serving pod that needs that CPU cannot be placed on the node. On ``Suspended``
the driver saves the original CPU values in ``rose.io/suspended-cpu`` (JSON, see
:func:`encode_saved`), then lowers them to a small target through the pod's ``resize``
subresource; on ``Running`` it writes the originals back and removes the annotation.

Rules per regular container (``spec.containers``; init containers are left alone):

- no cpu request, or request <= target: nothing to do;
- ``resizePolicy`` for cpu is ``RestartContainer``: skipped (a resize would restart the RL process
  and lose the state the suspend exists to keep), the reason reported;
- Guaranteed pod: cpu request *and* limit set to the target (the API refuses a QoS change);
- otherwise only the cpu request is lowered; limits stay.

Pods with pod-level cpu resources (``spec.resources``) are skipped as a whole: the scheduler
accounts for those, and they are not resized here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rose_common import names
from rose_common.kube import objects
from rose_common.quantity import QuantityError, parse_quantity, to_millis

DEFAULT_TARGET = "100m"
SAVED_VERSION = 1


class ResizeError(ValueError):
    """Input the driver cannot act on (malformed quantity or saved annotation); names the pod."""


def cpu_millis(s: str) -> int:
    """CPU quantity → millicores, rounded up like the API's ``MilliValue``; negative refused."""
    if parse_quantity(s) < 0:
        raise QuantityError(f"negative cpu quantity: {s!r}")
    return to_millis(s)


@dataclass(frozen=True)
class Saved:
    """What ``rose.io/suspended-cpu`` holds: the target applied and, per container, the original
    cpu request (and the original cpu limit where the shrink changed it too)."""

    target: str
    containers: dict[str, dict[str, str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """One resize step: the ``pods/resize`` strategic-merge-patch body (None: nothing to resize),
    what to save in / whether to remove the annotation, and what was skipped and why."""

    action: str  # "shrink" | "restore"
    patch: dict[str, Any] | None
    saved: Saved | None = None  # shrink: the annotation to write first (None: already saved)
    remove_annotation: bool = False  # restore: drop the annotation after the patch
    changes: tuple[str, ...] = ()  # human-readable "main: cpu request 60 -> 100m"
    skipped: tuple[tuple[str, str], ...] = ()  # (container, reason)


def pod_key(pod: dict[str, Any]) -> str:
    return f"{objects.namespace(pod)}/{objects.name(pod)}"


def _containers(pod: dict[str, Any], key: str = "containers") -> list[dict[str, Any]]:
    spec = pod.get("spec")
    items = spec.get(key) if isinstance(spec, dict) else None
    return [c for c in items or [] if isinstance(c, dict)]


def _res(c: dict[str, Any], kind: str) -> dict[str, Any]:
    r = c.get("resources")
    v = r.get(kind) if isinstance(r, dict) else None
    return v if isinstance(v, dict) else {}


def _cpu_restart_policy(c: dict[str, Any]) -> str:
    for p in c.get("resizePolicy") or []:
        if isinstance(p, dict) and p.get("resourceName") == "cpu":
            return str(p.get("restartPolicy") or "NotRequired")
    return "NotRequired"


def _qty(pod: dict[str, Any], container: str, what: str, value: Any) -> int:
    try:
        return cpu_millis(value)
    except QuantityError as e:
        raise ResizeError(f"pod {pod_key(pod)} container {container!r}: {what} {value!r} is malformed: {e}") from e


def is_guaranteed(pod: dict[str, Any]) -> bool:
    """The pod's QoS class: ``status.qosClass`` when the API set it, else computed like the API
    (every container, init containers included, has cpu and memory limits equal to its requests)."""
    status = pod.get("status")
    qos = status.get("qosClass") if isinstance(status, dict) else None
    if qos:
        return bool(qos == "Guaranteed")
    all_containers = _containers(pod, "initContainers") + _containers(pod)
    if not all_containers:
        return False
    for c in all_containers:
        req, lim = _res(c, "requests"), _res(c, "limits")
        for r in ("cpu", "memory"):
            if r not in lim:
                return False
            if r in req:
                try:
                    if parse_quantity(str(req[r])) != parse_quantity(str(lim[r])):
                        return False
                except QuantityError:
                    return False
    return True


def read_saved(pod: dict[str, Any]) -> Saved | None:
    """The pod's ``rose.io/suspended-cpu`` (None when absent); malformed → :class:`ResizeError`."""
    raw = objects.annotations(pod).get(names.ANNOTATION_SUSPENDED_CPU)
    if raw is None:
        return None
    where = f"pod {pod_key(pod)}: annotation {names.ANNOTATION_SUSPENDED_CPU}={raw!r}"
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise ResizeError(f"{where} is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("containers"), dict):
        raise ResizeError(f'{where} must be an object with "containers"')
    target = doc.get("target")
    if not isinstance(target, str):
        raise ResizeError(f'{where}: "target" must be a quantity string')
    _qty(pod, "-", "saved target", target)
    containers: dict[str, dict[str, str]] = {}
    for name, orig in doc["containers"].items():
        if (
            not isinstance(orig, dict)
            or not isinstance(orig.get("request"), str)
            or not orig.keys()
            <= {
                "request",
                "limit",
            }
        ):
            raise ResizeError(f'{where}: container {name!r} must be {{"request": Q[, "limit": Q]}}')
        for k, v in orig.items():
            if not isinstance(v, str):
                raise ResizeError(f"{where}: container {name!r} {k} {v!r} is not a quantity string")
            _qty(pod, name, f"saved {k}", v)
        containers[str(name)] = {str(k): str(v) for k, v in orig.items()}
    skipped = doc.get("skipped") or {}
    if not isinstance(skipped, dict):
        raise ResizeError(f'{where}: "skipped" must be an object')
    return Saved(target=target, containers=containers, skipped={str(k): str(v) for k, v in skipped.items()})


def encode_saved(saved: Saved) -> str:
    doc: dict[str, Any] = {"version": SAVED_VERSION, "target": saved.target, "containers": saved.containers}
    if saved.skipped:
        doc["skipped"] = saved.skipped
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _describe(orig: dict[str, str]) -> str:
    return f"cpu request {orig['request']}" + (f", limit {orig['limit']}" if "limit" in orig else "")


def _patch(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    return {"spec": {"containers": entries}} if entries else None


def plan_shrink(pod: dict[str, Any], target: str = DEFAULT_TARGET) -> Plan:
    """The shrink for a suspended pod. When the originals are already saved (a repeated
    ``Suspended``, a driver restart) they are kept, never overwritten, and only containers whose
    spec is not at the saved target yet are patched (so nothing is shrunk twice)."""
    target_m = _qty(pod, "-", "target", target)
    prior = read_saved(pod)
    by_name = {str(c.get("name", "")): c for c in _containers(pod)}
    guaranteed = is_guaranteed(pod)
    entries: list[dict[str, Any]] = []
    changes: list[str] = []
    if prior is not None:
        for name, orig in sorted(prior.containers.items()):
            c = by_name.get(name)
            if c is None:
                raise ResizeError(f"pod {pod_key(pod)}: saved container {name!r} is not in the pod")
            res: dict[str, Any] = {}
            req = _res(c, "requests").get("cpu")
            if req is None or _qty(pod, name, "cpu request", req) != _qty(pod, name, "target", prior.target):
                res["requests"] = {"cpu": prior.target}
            lim = _res(c, "limits").get("cpu")
            if "limit" in orig and (
                lim is None or _qty(pod, name, "cpu limit", lim) != _qty(pod, name, "target", prior.target)
            ):
                res["limits"] = {"cpu": prior.target}
            if res:
                entries.append({"name": name, "resources": res})
                changes.append(f"{name}: {_describe(orig)} -> {prior.target}")
        return Plan("shrink", _patch(entries), None, changes=tuple(changes), skipped=tuple(prior.skipped.items()))
    saved: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    pod_cpu = (_res(pod.get("spec") or {}, "requests") or {}).get("cpu")
    if pod_cpu is not None and _qty(pod, "(pod)", "pod-level cpu request", pod_cpu) > target_m:
        skipped["(pod)"] = "pod-level cpu resources (spec.resources) are not resized"
        return Plan("shrink", None, Saved(target, {}, skipped), skipped=tuple(skipped.items()))
    for c in _containers(pod):
        name = str(c.get("name", ""))
        req = _res(c, "requests").get("cpu")
        if req is None or _qty(pod, name, "cpu request", req) <= target_m:
            continue
        if _cpu_restart_policy(c) == "RestartContainer":
            skipped[name] = (
                "resizePolicy cpu=RestartContainer: a resize would restart the RL process and lose its state"
            )
            continue
        orig = {"request": str(req)}
        res = {"requests": {"cpu": target}}
        lim = _res(c, "limits").get("cpu")
        if guaranteed and lim is not None:
            _qty(pod, name, "cpu limit", lim)
            orig["limit"] = str(lim)
            res["limits"] = {"cpu": target}
        saved[name] = orig
        entries.append({"name": name, "resources": res})
        changes.append(f"{name}: {_describe(orig)} -> {target}")
    return Plan(
        "shrink", _patch(entries), Saved(target, saved, skipped), changes=tuple(changes), skipped=tuple(skipped.items())
    )


def plan_restore(pod: dict[str, Any]) -> Plan:
    """Write the saved originals back (only where the spec differs), then drop the annotation."""
    prior = read_saved(pod)
    if prior is None:
        return Plan("restore", None)
    by_name = {str(c.get("name", "")): c for c in _containers(pod)}
    entries: list[dict[str, Any]] = []
    changes: list[str] = []
    for name, orig in sorted(prior.containers.items()):
        c = by_name.get(name)
        if c is None:
            raise ResizeError(f"pod {pod_key(pod)}: saved container {name!r} is not in the pod")
        res: dict[str, Any] = {}
        if _res(c, "requests").get("cpu") != orig["request"]:
            res["requests"] = {"cpu": orig["request"]}
        if "limit" in orig and _res(c, "limits").get("cpu") != orig["limit"]:
            res["limits"] = {"cpu": orig["limit"]}
        if res:
            entries.append({"name": name, "resources": res})
            changes.append(f"{name}: cpu back to {_describe(orig)}")
    return Plan("restore", _patch(entries), remove_annotation=True, changes=tuple(changes))


def decide(pod: dict[str, Any]) -> str | None:
    """What a pod on this node needs, from its own annotations (level-triggered, so a driver
    restart or a lost request is repaired by the pod watch): ``"shrink"`` when it is
    ``Suspended`` and its originals are not saved yet, ``"restore"`` when it is running again
    (``Running`` or no suspend state) and still has saved originals, else None."""
    ann = objects.annotations(pod)
    if objects.deleting(pod):
        return None
    state = ann.get(names.ANNOTATION_SUSPEND_STATE)
    has_saved = names.ANNOTATION_SUSPENDED_CPU in ann
    if state == names.SuspendState.SUSPENDED and not has_saved:
        return "shrink"
    if state in (None, names.SuspendState.RUNNING) and has_saved:
        return "restore"
    return None


def resize_unsupported(pod: dict[str, Any]) -> str | None:
    """Why the API server will refuse any resize of this pod, or None: a running container whose
    status reports no ``resources`` means its kubelet has no in-place resize (the API server's
    own rule, "Pod running on node without support for resize")."""
    statuses = objects.status(pod).get("containerStatuses")
    for cs in statuses if isinstance(statuses, list) else []:
        running = isinstance(cs, dict) and isinstance((cs.get("state") or {}).get("running"), dict)
        if running and cs.get("resources") is None:
            return f"container {cs.get('name', '')!r} runs on a node whose kubelet reports no container resources"
    return None
