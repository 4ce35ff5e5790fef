"""ResourceSlice publisher: one pool per node, every GPU twice (serving + lendable).

:func:`plan_slices` is the pure decision (existing slices + desired slice → writes); the
:class:`SlicePublisher` loop applies it now, after every (re)registration, and whenever a watch
shows the node's slices changed or were wiped by the kubelet; :meth:`SlicePublisher.remove`
deletes them on shutdown. A content hash in an annotation tells "ours and current" apart from
anything else without comparing server-normalised fields.

While serving holds a GPU on this node (a serving claim prepared, or allocated and being bound:
``NodeDriver.on_serving_holds``; or a serving claim allocated there in the API, before any prepare:
:mod:`dra_driver.servingalloc`), that GPU's *lendable* device is published with the ``NoSchedule``
taint ``rose.io/serving-holds`` (:func:`rose_common.slices.taint_serving_held`), so the scheduler
allocates no new lendable claim there; :meth:`SlicePublisher.set_serving_holds` and
:meth:`SlicePublisher.set_serving_allocated` republish at once.
With GPU shares, a GPU the planner's DeviceTaintRule ``rose.io/reclaim-planned`` taints (on its
lendable device) is published with the same taint on its share devices
(:mod:`dra_driver.reclaimtaints`, :mod:`dra_driver.rulewatch`, :meth:`SlicePublisher.set_reclaim_planned`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_driver.metrics import DriverMetrics
from rose_common import names
from rose_common.informer import Informer, InformerSettings, ListWatch
from rose_common.kube import objects
from rose_common.slices import taint_lent_held, taint_reclaim_planned, taint_serving_held

log = logging.getLogger("rose.driver.slices")

HASH_ANNOTATION = "gpu.rose.io/spec-hash"


class SliceApi(ListWatch, Protocol):
    """This node's slices (``dra_driver.kube.KubeSlices``): reads, writes, and what to watch."""

    settings: InformerSettings

    def list(self) -> tuple[list[dict[str, Any]], str]: ...
    def create(self, body: dict[str, Any]) -> None: ...
    def replace(self, body: dict[str, Any]) -> None: ...
    def delete(self, name: str) -> None: ...


def spec_hash(desired: dict[str, Any]) -> str:
    spec = copy.deepcopy(desired["spec"])
    spec["pool"].pop("generation", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class SlicePlan:
    create: dict[str, Any] | None = None
    replace: dict[str, Any] | None = None
    delete: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return self.create is None and self.replace is None and not self.delete


def _generation(s: dict[str, Any]) -> int:
    return int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def is_current(existing: dict[str, Any], desired: dict[str, Any]) -> bool:
    return bool(
        objects.name(existing) == desired["metadata"]["name"]
        and objects.annotations(existing).get(HASH_ANNOTATION) == spec_hash(desired)
    )


@dataclass(frozen=True)
class LentHolds:
    """GPU indices lent in shares (``shared``), lent whole (``whole``), with serving's fractions
    (``fractions``) on this node."""

    shared: frozenset[int] = frozenset()
    whole: frozenset[int] = frozenset()
    fractions: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ReclaimPlanned:
    """The planner's reclaim taints on this node as the driver sees its DeviceTaintRules
    (:func:`dra_driver.reclaimtaints.planned_reclaims`): GPU index → taint, and the devices a rule
    names (tainted by the rule itself, not the slice)."""

    taints: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    ruled: frozenset[str] = frozenset()


def with_serving_holds(
    desired: dict[str, Any],
    serving_holds: frozenset[int],
    lent: LentHolds = LentHolds(),
    reclaim: ReclaimPlanned = ReclaimPlanned(),
) -> dict[str, Any]:
    """``desired`` with the lendable (and share) device of each GPU index in ``serving_holds``
    tainted, a GPU lent in shares or whole tainted against the other kind (``lent``), and the lent
    devices no rule names of a GPU with a reclaim taint carrying it (``reclaim``). Pure."""
    body = copy.deepcopy(desired)
    devices = taint_serving_held(body["spec"]["devices"], serving_holds)
    devices = taint_lent_held(devices, lent.shared, lent.whole, lent.fractions)
    body["spec"]["devices"] = taint_reclaim_planned(devices, reclaim.taints, reclaim.ruled)
    return body


def devices_tainted(body: dict[str, Any], key: str) -> int:
    """How many devices of the slice ``body`` carry a taint with ``key``. Pure."""
    return sum(1 for d in body["spec"]["devices"] if any(t.get("key") == key for t in d.get("taints") or []))


def plan_slices(
    existing: list[dict[str, Any]],
    desired: dict[str, Any],
    min_generation: int = 0,
    serving_holds: frozenset[int] = frozenset(),
    lent: LentHolds = LentHolds(),
    reclaim: ReclaimPlanned = ReclaimPlanned(),
) -> SlicePlan:
    """What to write so the node's pool is exactly ``desired``, with the lendable devices of the
    GPUs ``serving_holds`` names tainted ``rose.io/serving-holds`` (NoSchedule), and the other
    taints :func:`with_serving_holds` adds.

    Slices of this driver and node other than ``desired``'s name are deleted. The generation of
    a rewritten pool is above every generation seen (so consumers take the new one).
    """
    desired = with_serving_holds(desired, serving_holds, lent, reclaim)
    name = desired["metadata"]["name"]
    plan = SlicePlan(delete=sorted(str(s["metadata"]["name"]) for s in existing if s["metadata"]["name"] != name))
    mine = [s for s in existing if s["metadata"]["name"] == name]
    if mine and is_current(mine[0], desired) and not plan.delete:
        return plan
    gen = max([min_generation, *(_generation(s) for s in existing)]) + 1
    body = copy.deepcopy(desired)
    body["spec"]["pool"]["generation"] = gen
    body["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = spec_hash(desired)
    if mine:
        if is_current(mine[0], desired):
            return plan  # only strays to delete; our slice stays as it is
        body["metadata"]["resourceVersion"] = mine[0]["metadata"].get("resourceVersion")
        plan.replace = body
    else:
        plan.create = body
    return plan


def needs_reconcile(event_type: str, obj: dict[str, Any], desired: dict[str, Any]) -> bool:
    if event_type in ("BOOKMARK",):
        return False
    if event_type == "DELETED":
        return True
    return not is_current(obj, desired)


class SlicePublisher:
    def __init__(self, api: SliceApi, desired: dict[str, Any], metrics: DriverMetrics) -> None:
        self.api = api
        self.desired = desired
        self.metrics = metrics
        self.generation = 0
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The GPU indices serving holds on this node (their lendable devices tainted), and the wake-up
        # of the thread that republishes when they change (the caller holds the node lock: no I/O there)
        self.serving_holds: frozenset[int] = frozenset()
        # The GPUs whose serving device a claim is allocated in the API (servingalloc.py): tainted
        # like serving_holds from the allocation on, before the kubelet's prepare
        self.serving_allocated: frozenset[int] = frozenset()
        self.lent_holds = LentHolds()  # GPU shares: lent in shares / whole (rose_common.slices.taint_lent_held)
        self.reclaim = ReclaimPlanned()  # the planner's reclaim taints, onto share devices (rulewatch.py)
        self._hmu = threading.Lock()
        self._kick = threading.Event()
        self._kicker: threading.Thread | None = None

    def set_serving_holds(self, gpus: frozenset[int]) -> None:
        """Serving now holds exactly ``gpus`` here: republish soon (non-blocking; called under the
        node lock by ``NodeDriver``)."""
        with self._hmu:  # not self._mu: a reconcile holds that through its API calls
            if gpus == self.serving_holds:
                return
            self.serving_holds = frozenset(gpus)
        self._kick.set()

    def set_serving_allocated(self, gpus: frozenset[int]) -> None:
        """Serving claims are now allocated on exactly ``gpus`` here (the claim watch,
        :mod:`dra_driver.servingalloc`): republish soon (non-blocking)."""
        with self._hmu:
            if gpus == self.serving_allocated:
                return
            self.serving_allocated = frozenset(gpus)
        self._kick.set()

    def held(self) -> frozenset[int]:
        """The GPUs whose lent devices carry ``rose.io/serving-holds``: serving prepared there (or
        being bound) by the node's word, or allocated there by the API's."""
        with self._hmu:
            return self.serving_holds | self.serving_allocated

    def set_lent_holds(self, holds: LentHolds) -> None:
        """The GPUs now lent in shares and lent whole here: republish soon (non-blocking; called
        under the node lock by ``NodeDriver``)."""
        with self._hmu:
            if holds == self.lent_holds:
                return
            self.lent_holds = holds
        self._kick.set()

    def set_reclaim_planned(self, taints: Mapping[int, Mapping[str, str]], ruled: frozenset[str]) -> None:
        """The planner's DeviceTaintRules now taint these GPUs (index → taint) through the devices
        ``ruled``: republish soon (non-blocking; called by the rule watch)."""
        planned = ReclaimPlanned({i: dict(t) for i, t in taints.items()}, frozenset(ruled))
        with self._hmu:
            if planned == self.reclaim:
                return
            self.reclaim = planned
        self._kick.set()

    def _republish_loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(timeout=1.0)
            if self._stop.is_set() or not self._kick.is_set():
                continue
            self._kick.clear()
            try:
                self.reconcile()
            except Exception as e:  # retried: the holds are still what is wanted
                log.warning("republish for serving holds failed; retrying", extra={"err": repr(e)})
                self._kick.set()
                self._stop.wait(1.0)

    def reconcile(self) -> SlicePlan:
        with self._mu:
            if self._stop.is_set():  # shutting down: never re-create what remove() deletes
                return SlicePlan()
            existing, _ = self.api.list()
            holds, lent, reclaim = self.held(), self.lent_holds, self.reclaim
            plan = plan_slices(existing, self.desired, self.generation, holds, lent, reclaim)
            try:
                for name in plan.delete:
                    self.api.delete(name)
                if plan.create is not None:
                    self.api.create(plan.create)
                    self.generation = plan.create["spec"]["pool"]["generation"]
                if plan.replace is not None:
                    self.api.replace(plan.replace)
                    self.generation = plan.replace["spec"]["pool"]["generation"]
            except Exception:
                self.metrics.slice_publish_total.labels("error").inc()
                raise
            self._count_tainted(holds, lent, reclaim)
            if not plan.empty():
                self.metrics.slice_publish_total.labels("ok").inc()
                log.info(
                    "resourceslices published",
                    extra={
                        "generation": self.generation,
                        "deleted": plan.delete,
                        "servingHolds": sorted(holds),
                        "servingAllocated": sorted(self.serving_allocated),
                        "sharesHold": sorted(lent.shared),
                        "lentWhole": sorted(lent.whole),
                        "reclaimPlanned": sorted(reclaim.taints),
                    },
                )
            return plan

    def _count_tainted(self, holds: frozenset[int], lent: LentHolds, reclaim: ReclaimPlanned) -> None:
        """The taint gauges: devices published with the serving-holds taint, GPUs by taint."""
        body = with_serving_holds(self.desired, holds, lent, reclaim)
        self.metrics.lendable_tainted.set(devices_tainted(body, names.TAINT_SERVING_HOLDS))
        self.metrics.gpus_tainted.labels(names.TAINT_SERVING_HOLDS).set(len(holds))
        self.metrics.gpus_tainted.labels(names.TAINT_RECLAIM_PLANNED).set(len(reclaim.taints))

    # ------------------------------------------------------------------ informer handler
    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.reconcile()

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if needs_reconcile(
            event_type, obj, with_serving_holds(self.desired, self.held(), self.lent_holds, self.reclaim)
        ):
            self.reconcile()

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        """Publish now, then again whenever the watch shows the node's slices changed or gone."""
        restarts = self.metrics.watch_restarts_total
        Informer(
            self.api, self.api.settings, self, on_restart=lambda kind: restarts.labels(kind).inc(), stop=self._stop
        ).run()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="slice-publisher", daemon=True)
        self._thread.start()
        self._kicker = threading.Thread(target=self._republish_loop, name="slice-republish", daemon=True)
        self._kicker.start()

    def stop(self) -> None:
        self._stop.set()

    def remove(self) -> None:
        """Delete this node's slices (shutdown)."""
        self.stop()
        with self._mu:
            existing, _ = self.api.list()
            for s in existing:
                self.api.delete(str(s["metadata"]["name"]))
