"""The driver's only module that talks to the API server (the official ``kubernetes`` client).

Objects cross this boundary as plain JSON dicts (``_preload_content=False``), so the rest of the
driver never depends on the client's generated models.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from dra_driver import resize
from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from dra_driver.node import POD_RUNNING, POD_SUSPENDED, ClaimNotFoundError
from rose_common import kwatch, names
from rose_common.events import pod_event

log = logging.getLogger("rose.driver.kube")


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account when none is given."""
    cfg_mod: Any = _config
    if kubeconfig:
        api: client.ApiClient = cfg_mod.new_client_from_config(config_file=kubeconfig)
        return api
    cfg = client.Configuration()
    cfg_mod.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


class Raw:
    """Plain-JSON requests through the official client's transport (auth, TLS, proxies)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = 30.0,
    ) -> Any:
        m, url, headers, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=headers, body=data, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp

    def json(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        resp = self.call(method, path, query=query, body=body, content_type=content_type)
        out: dict[str, Any] = json.loads(resp.read() or b"{}")
        return out

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        q = dict(query, watch="true", timeoutSeconds=str(timeout_seconds))
        resp = self.call("GET", path, query=q, timeout=timeout_seconds + 10)
        raw = resp.response
        try:
            lines: Any = _watch.iter_resp_lines
            yield from kwatch.events(lines(raw))
        finally:
            raw.release_conn()


class KubeClaimSource:
    def __init__(self, api: client.ApiClient) -> None:
        self.raw = Raw(api)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.raw.json("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
        except ApiException as e:
            if e.status == 404:
                raise ClaimNotFoundError(f"{namespace}/{name}") from e
            raise

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.raw.json("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiException as e:
            if e.status == 404:
                return None
            raise


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
        except ApiException as e:
            if e.status != 404:
                raise
            return
        if self.resizer is not None and state in (POD_SUSPENDED, POD_RUNNING):
            self.resizer.enqueue(pod)

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
    annotation and the resize, on one worker thread (ordered, one request per pod at a time).
    It is level-triggered: each sync reads the pod and acts on its *current* ``suspend-state``,
    and :meth:`observe` (called by the pod watch) queues pods whose annotations disagree with
    their CPU, so a driver restart or a lost queue entry is repaired. Failures are logged,
    counted and reported as a warning Event; they never raise out of the worker.
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
        self.retry_after = retry_after_error_seconds
        self._q: queue.Queue[PodRef | None] = queue.Queue()
        self._pending: set[str] = set()  # queued, not yet picked up (a pod is queued at most once)
        self._busy = False
        self._failed_at: dict[str, float] = {}
        self._mu = threading.Lock()
        self._thread: threading.Thread | None = None

    def enqueue(self, pod: PodRef) -> None:
        with self._mu:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pod-resize", daemon=True)
                self._thread.start()
            if pod.uid in self._pending:
                return
            self._pending.add(pod.uid)
        self._q.put(pod)

    def observe(self, pod: dict[str, Any]) -> None:
        """A pod of this node as seen by the watch: queue it if its CPU needs shrinking or restoring."""
        if resize.decide(pod) is None:
            return
        m = pod.get("metadata") or {}
        uid = str(m.get("uid", ""))
        failed = self._failed_at.get(uid)
        if failed is not None and time.monotonic() - failed < self.retry_after:
            return
        self.enqueue(PodRef(namespace=str(m.get("namespace", "")), name=str(m.get("name", "")), uid=uid))

    def stop(self) -> None:
        self._q.put(None)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests: True once nothing is queued or running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mu:
                if not self._pending and not self._busy and self._q.empty():
                    return True
            time.sleep(0.02)
        return False

    def _run(self) -> None:
        while True:
            ref = self._q.get()
            if ref is None:
                return
            with self._mu:  # a state change from now on queues the pod again: its sync reads it afresh
                self._pending.discard(ref.uid)
                self._busy = True
            try:
                self.sync(ref)
            except Exception as e:  # never let one pod kill the worker
                log.exception("pod resize failed", extra={"pod": f"{ref.namespace}/{ref.name}", "err": repr(e)})
            finally:
                with self._mu:
                    self._busy = False

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
            except ApiException as e:
                if e.status == 404:
                    return ""
                return self._failed(ref, action, f"reading the pod failed: {e.status} {e.reason}")
            except Exception as e:  # the API server unreachable, ...
                return self._failed(ref, action, f"reading the pod failed: {e!r}")
            if str((pod.get("metadata") or {}).get("uid", "")) != ref.uid:
                return ""  # replaced by another pod of the same name
            state = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_SUSPEND_STATE)
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
            except ApiException as e:
                if e.status == 409 and attempt + 1 < attempts:  # the pod changed since our GET
                    continue
                if e.status == 404:
                    return ""
                if e.status == 422 and action == "shrink" and "without support for resize" in _api_message(e):
                    return self._unsupported(ref, _api_message(e))
                return self._failed(ref, action, f"{e.status} {e.reason}: {_api_message(e)}")
            except Exception as e:
                return self._failed(ref, action, repr(e))
        return self._failed(ref, action, "the pod kept changing (409 conflicts)")

    def _failed(self, ref: PodRef, action: str, why: str) -> str:
        self._failed_at[ref.uid] = time.monotonic()
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
            ref, names.EVENT_CPU_RESIZE_SKIPPED, f"cpu not released: the node's kubelet refuses it ({why})", True
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
            rv = str((pod.get("metadata") or {}).get("resourceVersion", "")) or None
            self._annotate(ref, resize.encode_saved(plan.saved), rv)
        if plan.skipped and plan.saved is not None:
            why = "; ".join(f"{c}: {r}" for c, r in plan.skipped)
            self._tell(ref, names.EVENT_CPU_RESIZE_SKIPPED, f"cpu not released for {why}", True)
        if plan.patch is None:
            self._failed_at.pop(ref.uid, None)
            self._count("shrink", "skipped")
            return "shrink/skipped"
        self._resize(ref, plan.patch)
        self._failed_at.pop(ref.uid, None)
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
        self._failed_at.pop(ref.uid, None)
        if plan.patch is None:
            self._count("restore", "skipped")
            return "restore/skipped"
        self._count("restore", "ok")
        msg = "resumed: cpu restored through pods/resize: " + "; ".join(plan.changes)
        log.info("pod cpu restored", extra={"pod": f"{ref.namespace}/{ref.name}", "changes": list(plan.changes)})
        self._tell(ref, names.EVENT_CPU_RESTORED, msg, False)
        return "restore/ok"


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message", "")) or str(e.body)
    except (TypeError, ValueError):
        return str(e.body)


class KubeEvictor:
    """Evicts a workload's pod (policy/v1 Eviction) after its durable checkpoint is confirmed."""

    def __init__(self, api: client.ApiClient) -> None:
        self.raw = Raw(api)

    def evict(self, reg: Any, reason: str) -> None:
        ns, name = str(getattr(reg, "pod_namespace", "")), str(getattr(reg, "pod_name", ""))
        if not ns or not name:
            log.warning("cannot evict a workload without pod name", extra={"podUID": getattr(reg, "pod_uid", "")})
            return
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
        log.info("evicting checkpointed workload", extra={"pod": f"{ns}/{name}", "reason": reason})
        try:
            self.raw.json("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body=body)
        except ApiException as e:
            if e.status != 404:
                raise


class KubeNode:
    """This node's Node object (annotations only)."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.raw = Raw(api)
        self.node_name = node_name

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

    def __init__(self, api: client.ApiClient, node_name: str, driver: str = names.DRIVER_NAME) -> None:
        self.raw = Raw(api)
        self.selector = f"spec.nodeName={node_name},spec.driver={driver}"

    def list(self) -> tuple[list[dict[str, Any]], str]:
        doc = self.raw.json("GET", SLICES_PATH, {"fieldSelector": self.selector})
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def create(self, body: dict[str, Any]) -> None:
        self.raw.json("POST", SLICES_PATH, body=body)

    def replace(self, body: dict[str, Any]) -> None:
        self.raw.json("PUT", f"{SLICES_PATH}/{body['metadata']['name']}", body=body)

    def delete(self, name: str) -> None:
        try:
            self.raw.json("DELETE", f"{SLICES_PATH}/{name}")
        except ApiException as e:
            if e.status != 404:
                raise

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.raw.watch(
            SLICES_PATH,
            {"fieldSelector": self.selector, "resourceVersion": resource_version},
            timeout_seconds,
        )


class KubePods:
    """Pods bound to one node."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.raw = Raw(api)
        self.selector = f"spec.nodeName={node_name}"

    def list(self) -> tuple[list[dict[str, Any]], str]:
        doc = self.raw.json("GET", "/api/v1/pods", {"fieldSelector": self.selector})
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.raw.watch(
            "/api/v1/pods",
            {"fieldSelector": self.selector, "resourceVersion": resource_version},
            timeout_seconds,
        )
