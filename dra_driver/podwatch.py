"""Acts on ``rose.io/suspend-request`` annotations of this node's pods (the API-server path).

:func:`decide` is the pure decision; :class:`PodWatcher` lists and watches the node's pods and
calls the node driver. The request value is JSON ``{"by","reason","graceSeconds","at"}``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.claims import PodRef
from dra_driver.node import NodeDriver
from rose_common import names

log = logging.getLogger("rose.driver.pods")


class PodApi(Protocol):
    def list(self) -> tuple[list[dict[str, Any]], str]: ...
    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


class BadSuspendRequestError(ValueError):
    pass


@dataclass(frozen=True)
class Action:
    kind: str  # "suspend" | "resume"
    pod: PodRef
    grace_seconds: float | None = None


def parse_request(raw: str) -> float | None:
    """The grace period of a suspend request (None: use the pod's own); refuses malformed JSON."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise BadSuspendRequestError(f"{names.ANNOTATION_SUSPEND_REQUEST} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise BadSuspendRequestError(f"{names.ANNOTATION_SUSPEND_REQUEST} must be a JSON object")
    grace = doc.get("graceSeconds")
    if grace is None:
        return None
    if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < 0:
        raise BadSuspendRequestError(f"graceSeconds must be a number >= 0, got {grace!r}")
    return float(grace)


def decide(pod: dict[str, Any], held: set[str]) -> Action | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if names.LABEL_JOB not in labels:
        return None
    ref = PodRef(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta.get("uid", "")))
    ann = meta.get("annotations") or {}
    raw = ann.get(names.ANNOTATION_SUSPEND_REQUEST)
    deleting = bool(meta.get("deletionTimestamp"))
    if raw is not None and not deleting:
        if ref.uid in held:  # acted on already (its outcome is in rose.io/suspend-state and an Event)
            return None
        return Action("suspend", ref, parse_request(raw))
    if ref.uid in held:
        return Action("resume", ref)
    return None


class PodWatcher:
    def __init__(
        self,
        api: PodApi,
        driver: NodeDriver,
        watch_timeout_seconds: int = 60,
        observers: Sequence[Callable[[dict[str, Any]], None]] = (),
    ) -> None:
        self.api = api
        self.driver = driver
        self.watch_timeout = watch_timeout_seconds
        self.observers = list(observers)  # also see every pod (e.g. the CPU resizer's repair)
        self._stop = threading.Event()

    def handle(self, pod: dict[str, Any]) -> None:
        for observe in self.observers:
            try:
                observe(pod)
            except Exception as e:
                meta = pod.get("metadata") or {}
                log.warning("pod observer failed", extra={"pod": f"{meta.get('namespace')}/{meta.get('name')}",
                                                          "err": repr(e)})  # fmt: skip
        try:
            action = decide(pod, self.driver.held_pods())
        except BadSuspendRequestError as e:
            meta = pod.get("metadata") or {}
            log.warning(
                "bad suspend request ignored",
                extra={"pod": f"{meta.get('namespace')}/{meta.get('name')}", "err": str(e)},
            )
            self.driver.metrics.suspend_requests_total.labels("error").inc()
            return
        if action is None:
            return
        if action.kind == "suspend":
            self.driver.request_suspend(action.pod, action.grace_seconds)
        else:
            self.driver.cancel_suspend(action.pod)

    def run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                pods, rv = self.api.list()
                for p in pods:
                    self.handle(p)
                for etype, obj in self.api.watch(rv, self.watch_timeout):
                    if self._stop.is_set():
                        return
                    if etype in ("ADDED", "MODIFIED"):
                        self.handle(obj)
                backoff = 1.0
            except Exception as e:
                log.warning("pod watch failed; retrying", extra={"err": repr(e), "backoffSeconds": backoff})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="pod-watcher", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
