"""The binding watch: serving claims allocated on this node, freed while the scheduler waits.

I/O: the API server through :class:`ClaimApi` (``dra_driver.kube.KubeClaims``), the node through
:class:`BindingNode` (``dra_driver.node.NodeDriver``), Events through a callable. Decisions are
:mod:`dra_driver.binding`'s.

A :class:`rose_common.informer.Informer` of every ResourceClaim hands each one to
:meth:`BindingWatcher.on_event`: a claim that owes a binding condition here
(:func:`~dra_driver.binding.demand`) is queued by UID on a :class:`~rose_common.workqueue.WorkQueue`
(several workers: a hung occupant on one GPU holds up no other GPU's serving pod); a claim this
node holds for that is no longer allocated here (deallocated by a failed or timed-out binding,
deleted) has its hold released. Each relist (``on_list``) hands the node the full set
(:meth:`~dra_driver.node.NodeDriver.sync_bindings`), so a restart neither forgets a hold nor keeps a
stale one. The worker frees the GPU (:meth:`~dra_driver.node.NodeDriver.free_for_binding`), then
writes ``rose.io/device-freed`` or ``rose.io/device-free-failed`` (reason, message) into the claim's
``status.devices`` — read afresh, merge-patched with its resourceVersion, retried on a conflict —
and tells the waiting pod with an Event.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from dra_driver import binding
from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from rose_common import names
from rose_common.informer import DELETED, Informer, InformerSettings, ListWatch
from rose_common.kube import objects
from rose_common.kube.errors import Conflict
from rose_common.workqueue import Backoff, WorkQueue, start_workers

log = logging.getLogger("rose.driver.binding")

WRITE_ATTEMPTS = 5


class ClaimApi(ListWatch, Protocol):
    settings: InformerSettings

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class BindingNode(Protocol):
    def free_for_binding(
        self, d: binding.Demand, started: Callable[[list[str]], None] | None = None
    ) -> binding.Outcome: ...
    def release_binding(self, claim_uid: str) -> None: ...
    def sync_bindings(self, allocated: dict[str, frozenset[int]]) -> None: ...
    def binding_claims(self) -> set[str]: ...


EventFn = Callable[[PodRef, str, str, bool], None]


class BindingWatcher:
    def __init__(
        self,
        api: ClaimApi,
        node: BindingNode,
        node_name: str,
        metrics: DriverMetrics,
        event: EventFn,
        *,
        driver_name: str = names.DRIVER_NAME,
        workers: int = 4,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.api = api
        self.node = node
        self.node_name = node_name
        self.driver_name = driver_name
        self.metrics = metrics
        self._event = event
        self._clock = clock
        self._workers = workers
        self._mu = threading.Lock()
        self._pending: dict[str, tuple[binding.Demand, float]] = {}  # uid -> latest demand, first seen
        self.queue: WorkQueue[str] = WorkQueue("binding", backoff=Backoff(0.5, 10.0))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ informer handler
    def on_list(self, items: list[dict[str, Any]]) -> None:
        allocated = {}
        for claim in items:
            gpus = binding.bound_here(claim, self.driver_name, self.node_name)
            if gpus:
                allocated[objects.uid(claim)] = frozenset(gpus)
        self.node.sync_bindings(allocated)
        for claim in items:
            self._offer(claim)

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        uid = objects.uid(obj)
        if event_type == DELETED or not binding.bound_here(obj, self.driver_name, self.node_name):
            if uid in self.node.binding_claims():
                self.node.release_binding(uid)
            return
        self._offer(obj)

    def _offer(self, claim: dict[str, Any]) -> None:
        d = binding.demand(claim, self.driver_name, self.node_name)
        if d is None:
            return
        with self._mu:
            first = self._pending.get(d.claim_uid, (d, time.monotonic()))[1]
            self._pending[d.claim_uid] = (d, first)
        self.queue.add(d.claim_uid)

    # ------------------------------------------------------------------ the work
    def _work(self, uid: str) -> None:
        with self._mu:
            got = self._pending.pop(uid, None)
        if got is None:
            return
        d, seen = got
        pods = ", ".join(f"{p.namespace}/{p.name}" for p in d.pods)

        def started(occupants: list[str]) -> None:
            self._tell(
                d,
                names.EVENT_DEVICE_FREEING,
                f"GPU {','.join(map(str, d.gpus))} of {self.node_name} is lent to {', '.join(occupants)}: suspending"
                " it before this pod binds (the scheduler waits in PreBind)",
                False,
            )

        try:
            outcome = self.node.free_for_binding(d, started)
        except Exception:  # the worker requeues the key with its backoff: keep what it is for
            with self._mu:
                self._pending.setdefault(uid, (d, seen))
            raise
        try:
            written = self._report(d, outcome)
        except Exception as e:
            log.warning("reporting the binding condition failed", extra={"claim": d.key(), "err": repr(e)})
            with self._mu:  # retry with the claim's own backoff, unless a newer demand came meanwhile
                self._pending.setdefault(uid, (d, seen))
            self.queue.requeue(uid)
            return
        self.queue.forget(uid)
        if not written:
            return
        waited = time.monotonic() - seen
        self.metrics.binding_wait_seconds.observe(waited)
        self.metrics.binding_total.labels("freed" if outcome.freed else "failed").inc()
        log.info(
            "binding condition reported",
            extra={"claim": d.key(), "pods": pods, "freed": outcome.freed, "reason": outcome.reason, "s": waited},
        )
        if outcome.freed:
            msg = f"GPU {','.join(map(str, d.gpus))} of {self.node_name} free ({outcome.reason}): {outcome.message}"
            self._tell(d, names.EVENT_DEVICE_FREED, msg, False)
        else:
            msg = (
                f"GPU {','.join(map(str, d.gpus))} of {self.node_name} not freed ({outcome.reason}):"
                f" {outcome.message}; the scheduler fails this binding and reschedules the pod"
            )
            self._tell(d, names.EVENT_DEVICE_NOT_FREED, msg, True)

    def _report(self, d: binding.Demand, outcome: binding.Outcome) -> bool:
        """Write the condition on the claim as it is now. False: nothing to write any more (the
        claim is gone, was re-created, or no longer allocated so: the scheduler moved on)."""
        for _ in range(WRITE_ATTEMPTS):
            claim = self.api.get(d.namespace, d.name)
            if claim is None or objects.uid(claim) != d.claim_uid:
                return False
            now_owed = binding.demand(claim, self.driver_name, self.node_name)
            if now_owed is None or not set(d.devices) <= set(now_owed.devices):
                return False
            body = binding.status_patch(claim, self.driver_name, self.node_name, d.devices, outcome, self._clock())
            try:
                self.api.patch_status(d.namespace, d.name, body)
                return True
            except Conflict:
                continue
        raise RuntimeError(f"claim {d.key()}: {WRITE_ATTEMPTS} conflicting writes in a row")

    def _tell(self, d: binding.Demand, reason: str, message: str, warning: bool) -> None:
        for p in d.pods:
            try:
                self._event(p, reason, message, warning)
            except Exception as e:  # the API being down must not block the binding
                log.warning("event failed", extra={"pod": f"{p.namespace}/{p.name}", "err": str(e)})

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        restarts = self.metrics.watch_restarts_total
        Informer(
            self.api, self.api.settings, self, on_restart=lambda kind: restarts.labels(kind).inc(), stop=self._stop
        ).run()

    def start(self, own_watch: bool = True) -> None:
        """Start the workers, and this watch's own informer unless another hands it every claim
        (``own_watch=False``: ``dra_driver.servingalloc.ServingAllocWatch``, one watch for both)."""
        start_workers(self.queue, self._work, count=self._workers)
        if own_watch:
            self._thread = threading.Thread(target=self.run, name="binding-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
