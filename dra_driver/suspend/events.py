"""Where the engine reports decisions as Kubernetes Events (the driver supplies the API writer)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal, Protocol

from dra_driver.claims import PodRef

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


class NotifierEventSink:
    """Engine events as Kubernetes Events on the pod, through the driver's notifier; also logged.

    Simulated occupants (no pod name) are only logged.
    """

    def __init__(self, notifier: PodEventWriter, logger: logging.Logger | None = None) -> None:
        self._notifier = notifier
        self._log = LogEventSink(logger)

    def record(self, event: EngineEvent) -> None:
        self._log.record(event)
        if not (event.pod_namespace and event.pod_name):
            return
        try:
            self._notifier.event(
                PodRef(event.pod_namespace, event.pod_name, event.pod_uid),
                event.reason,
                event.message,
                event.type == "Warning",
            )
        except Exception as e:  # an Event is a report; failing to write one must not fail a suspend
            logging.getLogger("rose.suspend.events").warning(
                "event not written", extra={"pod": f"{event.pod_namespace}/{event.pod_name}", "err": repr(e)}
            )
