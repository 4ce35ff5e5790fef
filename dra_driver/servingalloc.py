"""Serving claims allocated on this node, seen from the API: their GPUs' lent devices tainted at
allocation, not only at prepare (issue 25, soak finding T2).

I/O: the API server through a :class:`rose_common.informer.ListWatch` (``dra_driver.kube.KubeClaims``,
every ResourceClaim); what this node publishes through a callable
(``SlicePublisher.set_serving_allocated``). The decision is :func:`serving_allocated`, pure.

Why: the driver taints a GPU's lendable device ``rose.io/serving-holds`` (NoSchedule) while a
serving claim is *prepared* there (``NodeDriver.on_serving_holds``). Between the scheduler
allocating a serving claim on ``gpu-N-serving`` and the kubelet's prepare of it (seconds: the
kubelet's own pod sync, a loaded node), ``gpu-N-lendable`` stayed untainted, so a lent claim
scheduled in that window was allocated the same physical GPU (both allocations are first fit, so
they meet on the lowest free GPU). Once serving was prepared the driver refused the lent claim's
prepare ("serving wins") for as long as serving stayed, and a shared (time-slice) claim's
allocation never moves while a member reserves it. This watch closes the window: the taint follows
the serving *allocation* as the API records it, in both ``--serving-wait`` modes.

One informer serves this watch and, with ``--serving-wait=prebind``, the binding watch
(``dra_driver.bindwatch``): :class:`ServingAllocWatch` hands every list and event on to the
handlers it is given, so a driver watches every claim once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from rose_common import names
from rose_common.informer import DELETED, Handler, Informer, InformerSettings, ListWatch
from rose_common.kube import objects
from rose_common.slices import parse_device_name


def serving_allocated(claim: dict[str, Any], driver: str, node: str) -> frozenset[int]:
    """The GPU indices of ``node`` whose *serving* device the claim is allocated (results of
    ``driver`` in the pool ``node``); empty for a claim being deleted, not allocated, allocated
    elsewhere, or to lent devices only. A result naming no ROSE device is ignored. Pure."""
    if objects.deleting(claim):
        return frozenset()
    alloc = (claim.get("status") or {}).get("allocation") or {}
    out: set[int] = set()
    for r in (alloc.get("devices") or {}).get("results") or []:
        if r.get("driver") != driver or r.get("pool") != node:
            continue
        try:
            index, role = parse_device_name(str(r.get("device", "")))
        except ValueError:
            continue
        if role == names.ROLE_SERVING:
            out.add(index)
    return frozenset(out)


class ServingAllocWatch:
    """Keeps claim UID → serving GPUs allocated on this node; after each list and each event that
    changes them hands ``publish`` their union (the publisher republishes only on a change). Every
    list and event is then handed on to ``also`` (the binding watch, when it runs)."""

    def __init__(
        self,
        api: ListWatch,
        settings: InformerSettings,
        node: str,
        publish: Callable[[frozenset[int]], None],
        *,
        driver: str = names.DRIVER_NAME,
        also: Sequence[Handler] = (),
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.api, self.settings, self.node, self.driver = api, settings, node, driver
        self.publish = publish
        self.also = list(also)
        self._claims: dict[str, frozenset[int]] = {}
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._on_restart = on_restart

    def on_list(self, items: list[dict[str, Any]]) -> None:
        held = {objects.uid(c): g for c in items if (g := serving_allocated(c, self.driver, self.node))}
        with self._mu:
            self._claims = held
        self._push()
        for h in self.also:
            h.on_list(items)

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        uid = objects.uid(obj)
        gpus = frozenset() if event_type == DELETED else serving_allocated(obj, self.driver, self.node)
        with self._mu:
            changed = self._claims.get(uid, frozenset()) != gpus
            if gpus:
                self._claims[uid] = gpus
            else:
                self._claims.pop(uid, None)
        if changed:
            self._push()
        for h in self.also:
            h.on_event(event_type, obj)

    def allocated(self) -> frozenset[int]:
        """The GPUs serving claims are allocated on here now (the union)."""
        with self._mu:
            return frozenset().union(*self._claims.values())

    def _push(self) -> None:
        self.publish(self.allocated())

    def start(self) -> threading.Thread:
        return Informer(self.api, self.settings, self, on_restart=self._on_restart, stop=self._stop).start()

    def stop(self) -> None:
        self._stop.set()
