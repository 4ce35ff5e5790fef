"""The one module that talks to the Kubernetes API server (through :mod:`rose_common.kube.client`).

- :class:`Watcher`: one :class:`rose_common.informer.Informer` per kind — LIST then WATCH of
  nodes, bound pods, ResourceClaims and ResourceSlices (``resource.k8s.io/v1``) as raw JSON, fed
  into :class:`ClusterCache`; relists on 410 Gone and on any error, with a backoff that resets
  only once a watch delivered an event; every restart is counted (``on_restart``).
- :class:`KubeSuspender`: asks the node agent to suspend an RL worker by patching the pod's
  ``rose.io/suspend-request`` annotation (with a UID precondition) and records an Event on it.
  Works from a :class:`rose_common.workqueue.WorkQueue` keyed by pod UID on its own thread, so a
  preempt call never waits on the API server and repeated requests for one pod collapse.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from rose_common import extender_names, names
from rose_common.events import pod_event
from rose_common.informer import Informer, InformerSettings
from rose_common.kube import client as kube_client
from rose_common.kube.client import Raw
from rose_common.kube.errors import ApiError
from rose_common.workqueue import Backoff, WorkQueue, start_workers
from scheduler_extender.cache import ClusterCache
from scheduler_extender.model import PodInfo

log = logging.getLogger(__name__)

RESOURCE_API = "/apis/resource.k8s.io/v1"
MAX_SUSPEND_ATTEMPTS = 5


def api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An API client from a kubeconfig file, else the in-cluster service account."""
    return kube_client.api_client(kubeconfig)


def informer_settings(timeout_s: int) -> list[InformerSettings]:
    """What the cache lists and watches. Only bound pods matter (occupants, victims, a job's
    nodes): like kube-scheduler's assigned-pod informer, pending pods are filtered out by the API
    server (half the pod events of a burst of new workers never reach this process)."""
    return [
        InformerSettings(kind="Node", path="/api/v1/nodes", watch_timeout_seconds=timeout_s),
        InformerSettings(
            kind="Pod", path="/api/v1/pods", field_selector="spec.nodeName!=", watch_timeout_seconds=timeout_s
        ),
        InformerSettings(kind="ResourceClaim", path=f"{RESOURCE_API}/resourceclaims", watch_timeout_seconds=timeout_s),
        InformerSettings(
            kind="ResourceSlice",
            path=f"{RESOURCE_API}/resourceslices",
            field_selector=f"spec.driver={names.DRIVER_NAME}",
            watch_timeout_seconds=timeout_s,
        ),
    ]


class CacheFeed:
    """Informer handler for one kind: a list replaces the cache's view, an event updates it."""

    def __init__(self, cache: ClusterCache, kind: str) -> None:
        self.cache = cache
        self.kind = kind

    def on_list(self, items: list[dict[str, Any]]) -> None:
        objs: list[Mapping[str, Any]] = list(items)
        self.cache.replace(self.kind, objs)
        self.cache.mark_synced(self.kind)

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        self.cache.apply(self.kind, event_type, obj)


class Watcher:
    """One informer thread per kind, all stopped by :meth:`stop`; every restart calls
    ``on_restart(kind)`` (a metric)."""

    def __init__(
        self,
        api: client.ApiClient,
        cache: ClusterCache,
        timeout_s: int = 300,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self._stop = threading.Event()
        raw = Raw(api)
        self.informers = [
            Informer(raw, s, CacheFeed(cache, s.kind), on_restart=on_restart, stop=self._stop)
            for s in informer_settings(timeout_s)
        ]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._threads = [i.start() for i in self.informers]

    def stop(self) -> None:
        self._stop.set()


class KubeSuspender:
    """Writes suspend requests (annotation + Event) from a background worker.

    Requests are keyed by pod UID: a second request for a pod still queued replaces the reason of
    the first (one write). A write refused by the API server (the pod is gone, its UID changed:
    404/409, or invalid) is not retried; other failures (the server unreachable, 5xx) are retried
    with the pod's exponential backoff, at most ``MAX_SUSPEND_ATTEMPTS`` times. Every attempt's
    outcome goes to ``on_result`` (a metric)."""

    def __init__(
        self,
        api: client.ApiClient,
        on_result: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._raw = Raw(api)
        self._on_result = on_result or (lambda result: None)
        self._pending: dict[str, tuple[PodInfo, str]] = {}
        self._mu = threading.Lock()
        self.queue: WorkQueue[str] = WorkQueue("suspender", backoff=backoff or Backoff(0.5, 10.0))
        self._threads = start_workers(self.queue, self._work)

    def request(self, pod: PodInfo, reason: str) -> None:
        with self._mu:
            self._pending[pod.uid] = (pod, reason)
        if not self.queue.add(pod.uid):
            self._on_result("error")
            log.error("suspend request dropped: queue full", extra={"pod": pod.key})

    def stop(self) -> None:
        self.queue.shutdown()
        for t in self._threads:
            t.join(timeout=5)

    def _work(self, uid: str) -> None:
        with self._mu:
            item = self._pending.get(uid)
        if item is None:
            return
        pod, reason = item
        try:
            self.write(pod, reason)
        except Exception as err:
            self._on_result("error")
            final = (isinstance(err, ApiError) and err.code < 500) or self.queue.failures(
                uid
            ) + 1 >= MAX_SUSPEND_ATTEMPTS
            log.error("suspend request failed", extra={"pod": pod.key, "err": str(err), "retry": not final})
            if not final:
                self.queue.requeue(uid)
                return
        else:
            self._on_result("ok")
        self.queue.forget(uid)
        with self._mu:
            if self._pending.get(uid) == item:
                del self._pending[uid]

    def write(self, pod: PodInfo, reason: str) -> None:
        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        request = {
            "by": extender_names.EXTENDER_COMPONENT,
            "reason": reason,
            "graceSeconds": int(pod.grace_s),
            "at": stamp,
        }
        # The uid in the patch is a precondition: a recreated pod with the same name is not touched.
        patch = {
            "metadata": {
                "uid": pod.uid,
                "annotations": {names.ANNOTATION_SUSPEND_REQUEST: json.dumps(request, separators=(",", ":"))},
            }
        }
        self._raw.json(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )
        event = pod_event(
            pod.name,
            pod.namespace,
            pod.uid,
            extender_names.EVENT_REASON_SUSPEND_REQUESTED,
            reason,
            extender_names.EXTENDER_COMPONENT,
            now=now,
        )
        self._raw.json("POST", f"/api/v1/namespaces/{pod.namespace}/events", body=event)
        log.info("suspend requested", extra={"pod": pod.key, "uid": pod.uid, "node": pod.node})
