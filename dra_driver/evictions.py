"""Evictions of lent workloads, said where they happen.

Every pod the driver evicts to return a lent GPU gets a Warning Event ``LentWorkloadEvicted`` on
itself (the pod from the driver's claim records, i.e. the claim's ``status.reservedFor``: never a
name the workload reported), saying why and whether its state was lost or saved by its SDK
checkpoint, and is counted in ``rose_driver_lent_evictions_total{state}``. Two paths evict:

* the enforcement at the deadline (``dra_driver.enforce``): the driver reports it
  (``NodeDriver``), state lost unless the workload's durable checkpoint had been confirmed;
* the suspend engine's checkpoint-and-evict fallback, only after a verified durable checkpoint:
  its evictor is wrapped in :class:`ReportingEvictor` (state saved).

I/O boundary: the wrapped evictor, the notifier's Event, the counter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, Protocol

from dra_driver.claims import PodRef

log = logging.getLogger("rose.driver.evictions")

EVENT_LENT_EVICTED: Final = "LentWorkloadEvicted"
STATE_LOST: Final = "lost"
STATE_SAVED: Final = "saved"
STATES: Final = (STATE_LOST, STATE_SAVED)


class PodLike(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


class EventWriter(Protocol):
    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None: ...


class Evictor(Protocol):
    def evict(self, pod: PodRef, reason: str) -> None: ...


def eviction_state(saved: bool) -> str:
    """Pure: the metric's ``state`` label."""
    return STATE_SAVED if saved else STATE_LOST


def eviction_message(why: str, saved: bool) -> str:
    """Pure: the Event's message: why the driver evicted the pod, and what became of its state."""
    if saved:
        fate = "its state was saved by its SDK durable checkpoint: it restarts from that checkpoint"
    else:
        fate = (
            "its state was lost: no suspend and no durable checkpoint held it, so it restarts from its"
            " last checkpoint of its own, if any"
        )
    return f"evicted to return its lent GPU to serving: {why}; {fate}"


Count = Callable[[str], None]  # one eviction, by state (DriverMetrics.count_lent_eviction)


def report_eviction(notifier: EventWriter, count: Count, pod: PodRef, why: str, saved: bool) -> None:
    """The Event on the evicted pod and the count; an API failure is logged, never raised."""
    count(eviction_state(saved))
    try:
        notifier.event(pod, EVENT_LENT_EVICTED, eviction_message(why, saved), True)
    except Exception as e:  # the API being down must not stop serving's reclaim
        log.warning("eviction event failed", extra={"pod": f"{pod.namespace}/{pod.name}", "err": repr(e)})


class ReportingEvictor:
    """The suspend engine's evictor (it evicts only after a verified durable checkpoint): evicts
    through ``inner``, then reports the eviction with the state saved."""

    def __init__(self, inner: Evictor, notifier: EventWriter, count: Count) -> None:
        self.inner = inner
        self.notifier = notifier
        self.count = count

    def evict(self, pod: PodLike, reason: str) -> None:
        ref = PodRef(pod.namespace, pod.name, pod.uid)
        self.inner.evict(ref, reason)
        report_eviction(self.notifier, self.count, ref, reason, saved=True)
