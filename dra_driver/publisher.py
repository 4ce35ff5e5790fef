"""ResourceSlice publisher: one pool per node, every GPU twice (serving + lendable).

:func:`plan_slices` is the pure decision (existing slices + desired slice → writes); the
:class:`SlicePublisher` loop applies it now, after every (re)registration, and whenever a watch
shows the node's slices changed or were wiped by the kubelet; :meth:`SlicePublisher.remove`
deletes them on shutdown. A content hash in an annotation tells "ours and current" apart from
anything else without comparing server-normalised fields.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_driver.metrics import DriverMetrics
from rose_common.informer import Informer, InformerSettings, ListWatch
from rose_common.kube import objects

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


def plan_slices(existing: list[dict[str, Any]], desired: dict[str, Any], min_generation: int = 0) -> SlicePlan:
    """What to write so the node's pool is exactly ``desired``.

    Slices of this driver and node other than ``desired``'s name are deleted. The generation of
    a rewritten pool is above every generation seen (so consumers take the new one).
    """
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

    def reconcile(self) -> SlicePlan:
        with self._mu:
            if self._stop.is_set():  # shutting down: never re-create what remove() deletes
                return SlicePlan()
            existing, _ = self.api.list()
            plan = plan_slices(existing, self.desired, self.generation)
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
            if not plan.empty():
                self.metrics.slice_publish_total.labels("ok").inc()
                log.info("resourceslices published", extra={"generation": self.generation, "deleted": plan.delete})
            return plan

    # ------------------------------------------------------------------ informer handler
    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.reconcile()

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if needs_reconcile(event_type, obj, self.desired):
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

    def stop(self) -> None:
        self._stop.set()

    def remove(self) -> None:
        """Delete this node's slices (shutdown)."""
        self.stop()
        with self._mu:
            existing, _ = self.api.list()
            for s in existing:
                self.api.delete(str(s["metadata"]["name"]))
