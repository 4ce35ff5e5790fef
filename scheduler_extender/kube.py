"""The one module that talks to the Kubernetes API server (through :mod:`rose_common.kube.client`).

- :class:`Watcher`: one :class:`rose_common.informer.Informer` per kind — LIST then WATCH of
  nodes, bound pods, ResourceClaims and ResourceSlices (``resource.k8s.io/v1``) as raw JSON, fed
  into :class:`ClusterCache`; relists on 410 Gone and on any error, with a backoff that resets
  only once a watch delivered an event; every restart is counted (``on_restart``).
- :class:`ApiPods`: reads one pod (the preemptor of a preempt call, which the bound-pods cache
  does not hold) to check it is pending and outranks its victims.
- :class:`Withdrawer`: removes the extender's own suspend requests once their preemptor is bound
  or gone, or their TTL passed (decided by :func:`policy.withdraw_reason`).
- :class:`KubeSuspender`: asks the node agent to suspend an RL worker by patching the pod's
  ``rose.io/suspend-request`` annotation (with a UID precondition) and records an Event on it.
  Works from a :class:`rose_common.workqueue.WorkQueue` keyed by pod UID on its own thread, so a
  preempt call never waits on the API server and repeated requests for one pod collapse.
"""

from __future__ import annotations

import json
import logging
import re
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
from rose_common.timefmt import rfc3339
from rose_common.workqueue import Backoff, WorkQueue, start_workers
from scheduler_extender import policy
from scheduler_extender.cache import ClusterCache
from scheduler_extender.model import PodInfo

log = logging.getLogger(__name__)

RESOURCE_API = "/apis/resource.k8s.io/v1"
MAX_SUSPEND_ATTEMPTS = 5
# At most this many distinct pods wait to be asked to suspend. Requests are keyed by pod UID
# (repeats coalesce) and only name RL workers from the cache, at most
# policy.MAX_SUSPEND_PER_CALL per preempt call, so the queue never holds more than the cluster's
# RL workers; this bound is the backstop.
SUSPEND_QUEUE_LEN = 1_000
LOOKUP_TIMEOUT_S = 2.0  # a preempt call waits at most this long for the preemptor's GET
EVENT_REASON_SUSPEND_WITHDRAWN = "SuspendWithdrawn"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


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
        self._pending: dict[str, tuple[PodInfo, str, PodInfo]] = {}
        self._mu = threading.Lock()
        self.queue: WorkQueue[str] = WorkQueue(
            "suspender", backoff=backoff or Backoff(0.5, 10.0), max_len=SUSPEND_QUEUE_LEN
        )
        self._threads = start_workers(self.queue, self._work)

    def request(self, pod: PodInfo, reason: str, preemptor: PodInfo) -> None:
        with self._mu:
            self._pending[pod.uid] = (pod, reason, preemptor)
            if self.queue.add(pod.uid):
                return
            del self._pending[pod.uid]  # nothing waits on it: the map stays as bounded as the queue
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
        pod, reason, preemptor = item
        try:
            self.write(pod, reason, preemptor)
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

    def write(self, pod: PodInfo, reason: str, preemptor: PodInfo) -> None:
        now = datetime.now(UTC)
        stamp = rfc3339(now)
        request = {
            "by": extender_names.EXTENDER_COMPONENT,
            "reason": reason,
            "graceSeconds": int(pod.grace_s),
            "at": stamp,
            # whom it is for: the extender withdraws it once that pod is bound or gone
            "preemptor": {"namespace": preemptor.namespace, "name": preemptor.name, "uid": preemptor.uid},
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


def _pod_from_json(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return policy.pod_info(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        labels=meta.get("labels"),
        annotations=meta.get("annotations"),
        node=spec.get("nodeName"),
        priority=spec.get("priority"),
        terminating=meta.get("deletionTimestamp") is not None,
    )


class ApiPods:
    """Reads one pod from the API server (the preemptor: pending pods are not in the watch cache)."""

    def __init__(self, api: client.ApiClient, timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
        self._raw = Raw(api)
        self._timeout_s = timeout_s

    def get(self, namespace: str, name: str) -> PodInfo | None:
        if not (_DNS_LABEL.fullmatch(namespace) and _DNS_SUBDOMAIN.fullmatch(name)):
            return None  # not a pod name (a body's "../" never reaches a URL path)
        try:
            resp = self._raw.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", timeout=self._timeout_s)
        except ApiError as err:
            if err.code == 404:
                return None
            raise
        return _pod_from_json(json.loads(resp.read() or b"{}"))


class Withdrawer:
    """Removes the extender's own suspend requests once :func:`policy.withdraw_reason` says so
    (preemptor bound or gone, or the TTL passed), every ``interval_s``. The removal is a JSON
    patch that first tests the pod's UID and the annotation's exact value: a request another
    owner wrote or rewrote meanwhile is left alone. Each withdrawal is an Event on the pod and a
    metric (``on_withdrawn(reason)``).

    The driver's annotation holds one request (one owner): the extender never removes a request
    it did not write."""

    def __init__(
        self,
        api: client.ApiClient,
        cache: ClusterCache,
        pods: ApiPods,
        ttl_s: float,
        interval_s: float = 5.0,
        on_withdrawn: Callable[[str], None] | None = None,
    ) -> None:
        self._raw = Raw(api)
        self._cache = cache
        self._pods = pods
        self._ttl_s = ttl_s
        self._interval_s = interval_s
        self._on_withdrawn = on_withdrawn or (lambda reason: None)
        self._stop = threading.Event()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._run, name="suspend-withdrawer", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.sweep()
            except Exception as err:
                log.error("suspend withdrawal sweep failed", extra={"err": repr(err)})

    def sweep(self, now: datetime | None = None) -> list[tuple[str, str]]:
        """One pass; returns (pod key, reason) of each request withdrawn."""
        now = now or datetime.now(UTC)
        done: list[tuple[str, str]] = []
        for pod, raw in self._cache.suspend_requests():
            req = policy.own_request(raw)
            if req is None:
                continue
            try:
                preemptor = self._pods.get(req.preemptor_namespace, req.preemptor_name)
                reason = policy.withdraw_reason(req, preemptor, now, self._ttl_s)
                if reason and self.withdraw(pod, raw, reason):
                    done.append((pod.key, reason))
            except Exception as err:  # one pod's failure does not hold up the others; retried next sweep
                log.error("suspend withdrawal failed", extra={"pod": pod.key, "err": repr(err)})
        return done

    def withdraw(self, pod: PodInfo, raw: str, reason: str) -> bool:
        key = names.ANNOTATION_SUSPEND_REQUEST.replace("~", "~0").replace("/", "~1")
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": pod.uid},
            {"op": "test", "path": f"/metadata/annotations/{key}", "value": raw},
            {"op": "remove", "path": f"/metadata/annotations/{key}"},
        ]
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        try:
            self._raw.json("PATCH", path, body=patch, content_type="application/json-patch+json")
        except ApiError as err:
            if err.code in (404, 409, 422):  # gone, or the request is no longer the one we wrote
                return False
            raise
        message = f"suspend request withdrawn: {reason}"
        event = pod_event(
            pod.name, pod.namespace, pod.uid, EVENT_REASON_SUSPEND_WITHDRAWN, message, extender_names.EXTENDER_COMPONENT
        )
        self._raw.json("POST", f"/api/v1/namespaces/{pod.namespace}/events", body=event)
        self._on_withdrawn(reason)
        log.info("suspend request withdrawn", extra={"pod": pod.key, "uid": pod.uid, "reason": reason})
        return True
