"""Where the engine reports decisions as Kubernetes Events (the driver supplies the API writer)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from dra_driver.claims import PodRef
from dra_driver.suspend.model import stand_in_claim

EventType = Literal["Normal", "Warning"]

# Event reasons the engine emits.
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_SUSPEND_FAILED = "SuspendFailed"
REASON_RESUME_FAILED = "ResumeFailed"
REASON_FALLBACK_CHECKPOINT = "SuspendFallbackCheckpoint"
REASON_FALLBACK_FAILED = "SuspendFallbackCheckpointFailed"
REASON_SPILLED = "SuspendedStateSpilled"  # DRAM copy moved to the disk tier
REASON_SPILL_FAILED = "SpillFailed"  # the disk tier could not take it (full, I/O error)
REASON_SPILL_CORRUPT = "SpilledStateCorrupt"  # a spilled copy failed its checksum: never resumed
# a cooperative workload wrote a verified spill file but did not free its host copy: not counted as spilled
REASON_SPILL_NOT_FREED = "SpillNotFreed"


@dataclass(frozen=True)
class EngineEvent:
    pod_uid: str
    pod_namespace: str
    pod_name: str
    reason: str
    message: str
    type: EventType


class EventSink(Protocol):
    def record(self, event: EngineEvent) -> None: ...


class LogEventSink:
    """Writes events to the structured log only (standalone agent, no API server)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("rose.suspend.events")

    def record(self, event: EngineEvent) -> None:
        pod = f"{event.pod_namespace}/{event.pod_name}" if event.pod_name else event.pod_uid
        level = logging.WARNING if event.type == "Warning" else logging.INFO
        self._log.log(level, "event", extra={"pod": pod, "reason": event.reason, "detail": event.message})


class RecordingEventSink:
    """Keeps events in memory, in order (tests; also handy to chain behind another sink)."""

    def __init__(self, then: EventSink | None = None) -> None:
        self._events: list[EngineEvent] = []
        self._lock = threading.Lock()
        self._then = then

    def record(self, event: EngineEvent) -> None:
        with self._lock:
            self._events.append(event)
        if self._then is not None:
            self._then.record(event)

    @property
    def events(self) -> list[EngineEvent]:
        with self._lock:
            return list(self._events)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


class PodEventWriter(Protocol):
    """What the driver's API module offers (dra_driver.kube.KubeNotifier.event)."""

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None: ...


ClaimPods = Callable[[], Mapping[str, Sequence[PodRef]]]


def event_pods(pod_uid: str, claims: Mapping[str, Sequence[PodRef]]) -> list[PodRef]:
    """Pure: the real pods an engine Event about workload ``pod_uid`` goes to, from the driver's
    claim records (each claim's ``status.reservedFor``, as the API server gave it): the pod of that
    UID; for a claim's simulated stand-in (``simulated-claim-<uid>``), every pod of that claim;
    none when no record names it (the Event is then only logged)."""
    claim = stand_in_claim(pod_uid)
    if claim is not None:
        return list(claims.get(claim, ()))
    return next(([p] for pods in claims.values() for p in pods if p.uid == pod_uid), [])


class NotifierEventSink:
    """Engine events as Kubernetes Events on the pod, through the driver's notifier; also logged.

    With ``claim_pods`` (the driver's claim records: claim UID -> its reservedFor pods) the pod is
    found there (:func:`event_pods`), never taken from what the workload reported, and a simulated
    occupant's Event reaches the pod holding its claim. Without it, the registration's pod (set
    from the claim socket's reservedFor); a registration without one is only logged.
    """

    def __init__(
        self, notifier: PodEventWriter, logger: logging.Logger | None = None, claim_pods: ClaimPods | None = None
    ) -> None:
        self._notifier = notifier
        self._log = LogEventSink(logger)
        self.claim_pods = claim_pods

    def _targets(self, event: EngineEvent) -> list[PodRef]:
        if self.claim_pods is not None:
            return event_pods(event.pod_uid, self.claim_pods())
        if event.pod_namespace and event.pod_name:
            return [PodRef(event.pod_namespace, event.pod_name, event.pod_uid)]
        return []

    def record(self, event: EngineEvent) -> None:
        self._log.record(event)
        try:
            targets = self._targets(event)
        except Exception as e:  # an Event is a report; failing to resolve its pod must not fail a suspend
            logging.getLogger("rose.suspend.events").warning("event pods unknown", extra={"err": repr(e)})
            return
        for pod in targets:
            try:
                self._notifier.event(pod, event.reason, event.message, event.type == "Warning")
            except Exception as e:  # an Event is a report; failing to write one must not fail a suspend
                logging.getLogger("rose.suspend.events").warning(
                    "event not written", extra={"pod": f"{pod.namespace}/{pod.name}", "err": repr(e)}
                )
