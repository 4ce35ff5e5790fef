"""The driver's only module that talks to the API server (the official ``kubernetes`` client).

Objects cross this boundary as plain JSON dicts (``_preload_content=False``), so the rest of the
driver never depends on the client's generated models.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from dra_driver.claims import PodRef
from dra_driver.node import ClaimNotFoundError
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
    """Writes ``rose.io/suspend-state`` on RL pods and records Events about them."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.raw = Raw(api)
        self.node_name = node_name

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

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        ev = pod_event(
            pod.name, pod.namespace, pod.uid, reason, message, "rose-dra-driver", warning=warning, host=self.node_name
        )
        self.raw.json("POST", f"/api/v1/namespaces/{pod.namespace}/events", body=ev)


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
