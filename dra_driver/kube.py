"""The driver's only module that talks to the API server (through :mod:`rose_common.kube.client`).

Objects cross this boundary as plain JSON dicts, so the rest of the driver never depends on the
client's generated models; failures arrive as the typed :mod:`rose_common.kube.errors`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client

from dra_driver import resize
from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from dra_driver.node import POD_RUNNING, POD_SUSPENDED, ClaimNotFoundError
from rose_common import names
from rose_common.events import pod_event
from rose_common.informer import InformerSettings
from rose_common.kube import objects
from rose_common.kube.client import Raw, api_client
from rose_common.kube.errors import ApiError, Conflict, NotFound
from rose_common.workqueue import Backoff, WorkQueue, start_workers

__all__ = ["Raw", "api_client"]

log = logging.getLogger("rose.driver.kube")


class KubeClaimSource:
    def __init__(self, api: client.ApiClient) -> None:
        self.raw = Raw(api)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.raw.json("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
        except NotFound as e:
            raise ClaimNotFoundError(f"{namespace}/{name}") from e

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.raw.json("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None


class KubeCheckpointPaths:
    """``verify.CheckpointPaths`` from the API server: the job's ``checkpointPath`` is the pod's
    ``ROSE_CHECKPOINT_PATH`` env value (the controller sets it from ``spec.checkpointPath``) as the
    API server has the pod — never what the workload says. Cached by pod UID (a pod's env cannot
    change); a pod whose UID differs (recreated under the name) has none."""

    def __init__(self, api: client.ApiClient) -> None:
        self.raw = Raw(api)
        self._mu = threading.Lock()
        self._cache: dict[str, str | None] = {}

    def checkpoint_path(self, namespace: str, name: str, uid: str) -> str | None:
        with self._mu:
            if uid in self._cache:
                return self._cache[uid]
        try:
            pod = self.raw.json("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None
        got = pod_checkpoint_path(pod) if objects.uid(pod) == uid else None
        with self._mu:
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[uid] = got
        return got


def pod_checkpoint_path(pod: dict[str, Any]) -> str | None:
    """Pure: the first literal ``ROSE_CHECKPOINT_PATH`` of the pod's containers (None: none)."""
    for c in pod.get("spec", {}).get("containers", []) or []:
        for e in c.get("env", []) or []:
            if e.get("name") == names.ENV_CHECKPOINT_PATH and isinstance(e.get("value"), str) and e["value"]:
                return str(e["value"])
    return None


class KubeNotifier:
    """Writes ``rose.io/suspend-state`` on RL pods and records Events about them.

    With a :class:`PodResizer`, a pod that becomes ``Suspended`` gives its CPU back and one that
    becomes ``Running`` gets it again; that work is queued to the resizer's own thread, so the
    suspend / resume (and the serving prepare waiting on it) never waits on it.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        suspended_cpu: str = "",
        metrics: DriverMetrics | None = None,
    ) -> None:
        self.raw = Raw(api)
        self.node_name = node_name
        self.resizer = PodResizer(self.raw, suspended_cpu, self.event, metrics) if suspended_cpu else None

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        body = {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: state}}}
        try:
            self.raw.json(
                "PATCH",
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
                body=body,
                content_type="application/merge-patch+json",
            )
        except NotFound:
            return
        if self.resizer is not None and state in (POD_SUSPENDED, POD_RUNNING):
            self.resizer.enqueue(pod)

    def annotate(self, pod: PodRef, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into the pod's (the workload reports: dra_driver.agent.reports)."""
        body = {"metadata": {"annotations": annotations}}
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
        with contextlib.suppress(NotFound):
            self.raw.json("PATCH", path, body=body, content_type="application/merge-patch+json")

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        ev = pod_event(
            pod.name, pod.namespace, pod.uid, reason, message, "rose-dra-driver", warning=warning, host=self.node_name
        )
        self.raw.json("POST", f"/api/v1/namespaces/{pod.namespace}/events", body=ev)

    def close(self) -> None:
        if self.resizer is not None:
            self.resizer.stop()


class PodResizer:
    """Shrinks a suspended RL pod's CPU through ``pods/resize`` and restores it on resume.

    The decisions are :mod:`dra_driver.resize`'s; this class only reads the pod, writes the
    annotation and the resize, from a :class:`~rose_common.workqueue.WorkQueue` keyed by pod UID
    (one worker: ordered, one request per pod at a time, a pod queued at most once). It is
    level-triggered: each sync reads the pod and acts on its *current* ``suspend-state``, and
    :meth:`observe` (called by the pod watch) queues pods whose annotations disagree with their
    CPU, so a driver restart or a lost queue entry is repaired. A failed sync is retried with the
    pod's own exponential backoff (``retry_after_error_seconds`` at most), during which the watch
    does not queue it again. Failures are logged, counted and reported as a warning Event; they
    never raise out of the worker.
    """

    def __init__(
        self,
        raw: Raw,
        target: str,
        event: Callable[[PodRef, str, str, bool], None],
        metrics: DriverMetrics | None = None,
        retry_after_error_seconds: float = 60.0,
    ) -> None:
        resize.cpu_millis(target)  # refuse a malformed target at start, not per pod
        self.raw = raw
        self.target = target
        self._event = event
        self.metrics = metrics
        self.queue: WorkQueue[str] = WorkQueue(
            "pod-resize", backoff=Backoff(min(5.0, retry_after_error_seconds), retry_after_error_seconds)
        )
        self._refs: dict[str, PodRef] = {}  # uid -> the latest ref queued for it
        self._mu = threading.Lock()
        self._started = False

    def enqueue(self, pod: PodRef) -> None:
        with self._mu:
            self._refs[pod.uid] = pod
            if not self._started:
                self._started = True
                start_workers(self.queue, self._work)
        self.queue.add(pod.uid)

    def observe(self, pod: dict[str, Any]) -> None:
        """A pod of this node as seen by the watch: queue it if its CPU needs shrinking or restoring."""
        if resize.decide(pod) is None:
            return
        uid = objects.uid(pod)
        if self.queue.waiting(uid):  # failed recently: its backoff decides when to retry
            return
        self.enqueue(PodRef(namespace=objects.namespace(pod), name=objects.name(pod), uid=uid))

    def stop(self) -> None:
        self.queue.shutdown()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests: True once nothing is queued or running."""
        return self.queue.wait_idle(timeout)

    def _work(self, uid: str) -> None:
        with self._mu:
            ref = self._refs.get(uid)
        if ref is None:
            return
        try:
            result = self.sync(ref)
        except Exception as e:  # never let one pod kill the worker
            log.exception("pod resize failed", extra={"pod": f"{ref.namespace}/{ref.name}", "err": repr(e)})
            result = "error"
        if result.endswith("error"):
            self.queue.requeue(uid)
            return
        self.queue.forget(uid)
        with self._mu:
            if self._refs.get(uid) is ref:  # not queued again meanwhile: nothing left to remember
                del self._refs[uid]

    def _path(self, ref: PodRef) -> str:
        return f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}"

    def _count(self, action: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.pod_resize_total.labels(action, result).inc()

    def _tell(self, ref: PodRef, reason: str, message: str, warning: bool) -> None:
        try:
            self._event(ref, reason, message, warning)
        except Exception as e:
            log.warning("event failed", extra={"pod": f"{ref.namespace}/{ref.name}", "reason": reason, "err": str(e)})

    def sync(self, ref: PodRef, attempts: int = 3) -> str:
        """Bring one pod's CPU in line with its suspend state; returns what was done
        (``""``, ``"shrink/ok"``, ``"restore/skipped"``, ``"shrink/error"``, ...)."""
        action = "shrink"
        for attempt in range(attempts):
            try:
                pod = self.raw.json("GET", self._path(ref))
            except NotFound:
                return ""
            except ApiError as e:
                return self._failed(ref, action, f"reading the pod failed: {e.code} {e.status.reason}")
            except Exception as e:  # the API server unreachable, ...
                return self._failed(ref, action, f"reading the pod failed: {e!r}")
            if objects.uid(pod) != ref.uid:
                return ""  # replaced by another pod of the same name
            state = objects.annotations(pod).get(names.ANNOTATION_SUSPEND_STATE)
            if state == POD_SUSPENDED:
                action = "shrink"
            elif state in (None, POD_RUNNING):
                action = "restore"
            else:
                return ""  # Suspending / Resuming / CheckpointedEvicted: not now
            try:
                return self._shrink(ref, pod) if action == "shrink" else self._restore(ref, pod)
            except resize.ResizeError as e:
                return self._failed(ref, action, str(e))
            except Conflict:
                if attempt + 1 < attempts:  # the pod changed since our GET
                    continue
            except NotFound:
                return ""
            except ApiError as e:
                return self._failed(ref, action, f"{e.code} {e.status.reason}: {e.status.message}")
            except Exception as e:
                return self._failed(ref, action, repr(e))
        return self._failed(ref, action, "the pod kept changing (409 conflicts)")

    def _failed(self, ref: PodRef, action: str, why: str) -> str:
        self._count(action, "error")
        log.warning(
            "pod cpu resize failed; the suspend/resume itself is unaffected",
            extra={"pod": f"{ref.namespace}/{ref.name}", "action": action, "err": why},
        )
        self._tell(ref, names.EVENT_CPU_RESIZE_FAILED, f"{action} of the cpu request failed: {why}", True)
        return f"{action}/error"

    def _unsupported(self, ref: PodRef, why: str) -> str:
        """The node's kubelet does not report container resources (no in-place resize): not an
        error of ours; the saved originals stay until the resume removes them."""
        self._count("shrink", "skipped")
        log.info("pod cpu not released: no in-place resize on its node", extra={"pod": f"{ref.namespace}/{ref.name}"})
        self._tell(
            ref, names.EVENT_CPU_RESIZE_SKIPPED, f"cpu not released: no in-place resize on its node ({why})", True
        )
        return "shrink/skipped"

    def _annotate(self, ref: PodRef, value: str | None, resource_version: str | None = None) -> None:
        """Merge patch of ``rose.io/suspended-cpu`` (None removes it); preconditions: this very pod
        (uid) and, when given, the version whose spec the value was computed from."""
        meta: dict[str, Any] = {"uid": ref.uid, "annotations": {names.ANNOTATION_SUSPENDED_CPU: value}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"metadata": meta}
        self.raw.json("PATCH", self._path(ref), body=body, content_type="application/merge-patch+json")

    def _resize(self, ref: PodRef, patch: dict[str, Any]) -> None:
        self.raw.json(
            "PATCH", self._path(ref) + "/resize", body=patch, content_type="application/strategic-merge-patch+json"
        )

    def _shrink(self, ref: PodRef, pod: dict[str, Any]) -> str:
        plan = resize.plan_shrink(pod, self.target)
        if plan.saved is None and plan.patch is None:
            return ""  # already shrunk (a repeated Suspended, a driver restart)
        if plan.saved is not None:  # first the originals, so a crash after the resize cannot lose them
            rv = objects.resource_version(pod) or None
            self._annotate(ref, resize.encode_saved(plan.saved), rv)
        if plan.skipped and plan.saved is not None:
            why = "; ".join(f"{c}: {r}" for c, r in plan.skipped)
            self._tell(ref, names.EVENT_CPU_RESIZE_SKIPPED, f"cpu not released for {why}", True)
        if plan.patch is None:
            self._count("shrink", "skipped")
            return "shrink/skipped"
        unsupported = resize.resize_unsupported(pod)
        if unsupported is not None:
            return self._unsupported(ref, unsupported)
        self._resize(ref, plan.patch)
        self._count("shrink", "ok")
        msg = "suspended: cpu released through pods/resize: " + "; ".join(plan.changes)
        log.info("pod cpu released", extra={"pod": f"{ref.namespace}/{ref.name}", "changes": list(plan.changes)})
        self._tell(ref, names.EVENT_CPU_RELEASED, msg, False)
        return "shrink/ok"

    def _restore(self, ref: PodRef, pod: dict[str, Any]) -> str:
        plan = resize.plan_restore(pod)
        if not plan.remove_annotation:
            return ""  # nothing saved: nothing was shrunk
        if plan.patch is not None:
            self._resize(ref, plan.patch)
        self._annotate(ref, None)  # only after the originals are back in the spec
        if plan.patch is None:
            self._count("restore", "skipped")
            return "restore/skipped"
        self._count("restore", "ok")
        msg = "resumed: cpu restored through pods/resize: " + "; ".join(plan.changes)
        log.info("pod cpu restored", extra={"pod": f"{ref.namespace}/{ref.name}", "changes": list(plan.changes)})
        self._tell(ref, names.EVENT_CPU_RESTORED, msg, False)
        return "restore/ok"


class KubeEvictor:
    """Evicts a pod from the driver's claim records (policy/v1 Eviction): after its durable
    checkpoint is verified (the fallback), or after the enforcement stopped its processes at the
    deadline (``reason`` says which). The UID precondition makes the API server refuse the eviction when
    the name now belongs to another pod (``409 Conflict``)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.raw = Raw(api)

    def evict(self, pod: Any, reason: str) -> None:
        body = eviction_body(str(pod.namespace), str(pod.name), str(pod.uid))
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        log.info("evicting lent workload", extra={"pod": f"{ns}/{name}", "podUID": pod.uid, "reason": reason})
        with contextlib.suppress(NotFound):
            self.raw.json("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body=body)


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """Pure: a policy/v1 Eviction of exactly the pod with ``uid``; ValueError when a field is empty."""
    if not (namespace and name and uid):
        raise ValueError(f"an eviction needs the pod's namespace, name and UID, got {namespace!r}/{name!r} uid {uid!r}")
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


class KubeNode:
    """This node's Node object (its labels; its annotations)."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.raw = Raw(api)
        self.node_name = node_name

    def labels(self) -> dict[str, str]:
        node = self.raw.json("GET", f"/api/v1/nodes/{self.node_name}")
        return dict((node.get("metadata") or {}).get("labels") or {})

    def annotate(self, annotations: dict[str, str]) -> None:
        self.raw.json(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}",
            body={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
        )


SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class KubeSlices:
    """ResourceSlices of one driver on one node."""

    def __init__(
        self, api: client.ApiClient, node_name: str, driver: str = names.DRIVER_NAME, watch_timeout_seconds: int = 60
    ) -> None:
        self.raw = Raw(api)
        self.selector = f"spec.nodeName={node_name},spec.driver={driver}"
        self.settings = InformerSettings(
            kind="ResourceSlice",
            path=SLICES_PATH,
            field_selector=self.selector,
            watch_timeout_seconds=watch_timeout_seconds,
            resync_seconds=watch_timeout_seconds,  # level-triggered repair: every pod/slice seen again
            backoff_initial_s=1.0,
            backoff_max_s=30.0,
        )

    def list(self) -> tuple[list[dict[str, Any]], str]:
        doc = self.raw.json("GET", SLICES_PATH, {"fieldSelector": self.selector})
        return objects.items(doc), objects.resource_version(doc)

    def create(self, body: dict[str, Any]) -> None:
        self.raw.json("POST", SLICES_PATH, body=body)

    def replace(self, body: dict[str, Any]) -> None:
        self.raw.json("PUT", f"{SLICES_PATH}/{body['metadata']['name']}", body=body)

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.raw.json("DELETE", f"{SLICES_PATH}/{name}")

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.raw.json(method, path, query)

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.raw.watch(path, query, timeout_seconds)


class KubePods:
    """Pods bound to one node: what the pod informer lists and watches (server-side field selector)."""

    def __init__(self, api: client.ApiClient, node_name: str, watch_timeout_seconds: int = 60) -> None:
        self.raw = Raw(api)
        self.settings = InformerSettings(
            kind="Pod",
            path="/api/v1/pods",
            field_selector=f"spec.nodeName={node_name}",
            watch_timeout_seconds=watch_timeout_seconds,
            resync_seconds=watch_timeout_seconds,  # level-triggered repair: every pod/slice seen again
            backoff_initial_s=1.0,
            backoff_max_s=30.0,
        )

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.raw.json(method, path, query)

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.raw.watch(path, query, timeout_seconds)


CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


class KubeClaims:
    """Every ResourceClaim (all namespaces: a serving claim may come from any), for the binding
    watch (``dra_driver.bindwatch``): list and watch, read one, patch its status. The API offers
    no server-side selector for "allocated on this node", so every driver watches every claim;
    the full relist comes every 5 minutes, not every minute as for the node's own pods."""

    def __init__(self, api: client.ApiClient, watch_timeout_seconds: int = 300) -> None:
        self.raw = Raw(api)
        self.settings = InformerSettings(
            kind="ResourceClaim",
            path=CLAIMS_PATH,
            watch_timeout_seconds=watch_timeout_seconds,
            resync_seconds=watch_timeout_seconds,  # level-triggered: every claim seen again
            backoff_initial_s=1.0,
            backoff_max_s=30.0,
        )

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.raw.json("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
        except NotFound:
            return None

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """A merge patch of the status subresource (Conflict when its resourceVersion is stale)."""
        self.raw.json(
            "PATCH",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status",
            body=body,
            content_type="application/merge-patch+json",
        )

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.raw.json(method, path, query)

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.raw.watch(path, query, timeout_seconds)


def probe_binding_conditions(api: client.ApiClient, node_name: str) -> bool | None:
    """Does the API server keep a device's ``bindingConditions``? A dry-run create of a one-device
    ResourceSlice on this node (nothing is stored): the API server silently drops fields of
    disabled feature gates, so the answer is in what it returns. None: the probe itself failed."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"rose-binding-probe-{node_name}"[:253]},
        "spec": {
            "driver": names.DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": f"rose-binding-probe-{node_name}"[:253], "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "probe",
                    "bindingConditions": [names.BINDING_CONDITION_FREED],
                    "bindingFailureConditions": [names.BINDING_CONDITION_FREE_FAILED],
                }
            ],
        },
    }
    try:
        got = Raw(api).json("POST", SLICES_PATH, {"dryRun": "All"}, body=body)
    except Exception as e:  # any failure (refused, unreachable): unknown, reported by resolve_mode
        log.warning("probing the API server for device bindingConditions failed", extra={"err": repr(e)})
        return None
    devices = (got.get("spec") or {}).get("devices") or [{}]
    return bool(devices[0].get("bindingConditions"))
