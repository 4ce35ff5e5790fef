"""The one module that talks to the Kubernetes API server.

- :class:`Watcher`: LIST then WATCH of nodes, pods, ResourceClaims and ResourceSlices
  (``resource.k8s.io/v1``) as raw JSON, fed into :class:`ClusterCache`; relists on 410 Gone and
  on any error, with a short backoff.
- :class:`KubeSuspender`: asks the node agent to suspend an RL worker by patching the pod's
  ``rose.io/suspend-request`` annotation (with a UID precondition) and records an Event on it.
  Runs on its own thread so a preempt call never waits on the API server.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines as _iter_resp_lines

from rose_common import extender_names, kwatch, names
from rose_common.events import pod_event
from scheduler_extender.cache import ClusterCache
from scheduler_extender.model import PodInfo

log = logging.getLogger(__name__)

_watch_lines: Callable[[Any], Iterator[str]] = _iter_resp_lines


def api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An API client from a kubeconfig file, else the in-cluster service account."""
    if kubeconfig is not None:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=str(kubeconfig)
        )
        return api
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call,unused-ignore]
    return client.ApiClient(cfg)


def _listers(api: client.ApiClient) -> dict[str, Callable[..., Any]]:
    core = client.CoreV1Api(api)
    res = client.ResourceV1Api(api)
    return {
        "Node": core.list_node,
        "Pod": core.list_pod_for_all_namespaces,
        "ResourceClaim": res.list_resource_claim_for_all_namespaces,
        "ResourceSlice": res.list_resource_slice,
    }


_SELECTORS: dict[str, dict[str, str]] = {
    "Pod": {"field_selector": "spec.nodeName!="},
    "ResourceSlice": {"field_selector": f"spec.driver={names.DRIVER_NAME}"},
}


class Watcher:
    """One thread per kind: list, replace the cache's view, watch from the list's resourceVersion.

    A watch that ends normally (server timeout) is resumed from the last resourceVersion seen; a
    watch that fails (410 Gone, connection error, bad event) is followed by a relist, with a backoff
    that only resets once a watch has delivered an event, so a watch that keeps failing cannot
    turn into a relist loop. Every restart calls ``on_restart(kind)`` (a metric)."""

    def __init__(
        self,
        api: client.ApiClient,
        cache: ClusterCache,
        timeout_s: int = 300,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self._api = api
        self._cache = cache
        self._timeout_s = timeout_s
        self._on_restart = on_restart or (lambda kind: None)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for kind, lister in _listers(self._api).items():
            t = threading.Thread(target=self._loop, args=(kind, lister), name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    @staticmethod
    def _selector(kind: str) -> dict[str, Any]:
        # Only bound pods matter (occupants, victims, a job's nodes): like kube-scheduler's
        # assigned-pod informer, pending pods are filtered out by the API server (half the
        # pod events of a burst of new workers never reach this process).
        return _SELECTORS.get(kind, {})

    def _list(self, kind: str, lister: Callable[..., Any]) -> str:
        resp = lister(_preload_content=False, _request_timeout=60, **self._selector(kind))
        body = json.loads(resp.data)
        self._cache.replace(kind, list(body.get("items") or []))
        self._cache.mark_synced(kind)
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, kind: str, lister: Callable[..., Any], rv: str) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = lister(
            watch=True,
            resource_version=rv,
            timeout_seconds=self._timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(10, self._timeout_s + 30),
            **self._selector(kind),
        )
        try:
            status = getattr(resp, "status", 200)
            if not 200 <= int(status) <= 299:
                raise kwatch.WatchError(int(status), resp.data.decode(errors="replace")[:300])
            yield from kwatch.events(_watch_lines(resp))
        finally:
            resp.close()
            resp.release_conn()

    def _loop(self, kind: str, lister: Callable[..., Any]) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                rv = self._list(kind, lister)
                while not self._stop.is_set():
                    for etype, obj in self._watch(kind, lister, rv):
                        rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                        backoff = 0.2  # this watch works
                        if etype != "BOOKMARK":
                            self._cache.apply(kind, etype, obj)
                        if self._stop.is_set():
                            break
            except Exception as err:  # relist on anything (410 Gone included)
                if self._stop.is_set():
                    return
                self._on_restart(kind)
                log.warning("watch failed, relisting", extra={"kind": kind, "err": str(err), "backoffSeconds": backoff})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


class KubeSuspender:
    """Writes suspend requests (annotation + Event) from a background thread."""

    def __init__(self, api: client.ApiClient, on_result: Callable[[str], None] | None = None) -> None:
        self._core = client.CoreV1Api(api)
        self._queue: queue.Queue[tuple[PodInfo, str] | None] = queue.Queue()
        self._on_result = on_result or (lambda result: None)
        self._thread = threading.Thread(target=self._run, name="suspender", daemon=True)
        self._thread.start()

    def request(self, pod: PodInfo, reason: str) -> None:
        self._queue.put((pod, reason))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            pod, reason = item
            try:
                self.write(pod, reason)
                self._on_result("ok")
            except Exception as err:
                self._on_result("error")
                log.error("suspend request failed", extra={"pod": pod.key, "err": str(err)})

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
        self._core.patch_namespaced_pod(pod.name, pod.namespace, patch)
        event = pod_event(
            pod.name,
            pod.namespace,
            pod.uid,
            extender_names.EVENT_REASON_SUSPEND_REQUESTED,
            reason,
            extender_names.EXTENDER_COMPONENT,
            now=now,
        )
        self._core.create_namespaced_event(pod.namespace, event)
        log.info("suspend requested", extra={"pod": pod.key, "uid": pod.uid, "node": pod.node})
