"""The driver's only module that talks to the API server (the official ``kubernetes`` client).

Objects cross this boundary as plain JSON dicts (``_preload_content=False``), so the rest of the
driver never depends on the client's generated models.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from dra_driver.claims import PodRef
from dra_driver.node import ClaimNotFoundError
from rose_common import names

log = logging.getLogger("rose.driver.kube")


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account when none is given."""
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def _json(resp: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(resp.data)
    return out


class KubeClaimSource:
    def __init__(self, api: client.ApiClient) -> None:
        self.resource = client.ResourceV1Api(api)
        self.core = client.CoreV1Api(api)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return _json(self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                raise ClaimNotFoundError(f"{namespace}/{name}") from e
            raise

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise


class KubeNotifier:
    """Writes ``rose.io/suspend-state`` on RL pods and records Events about them."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name

    def suspend_state(self, pod: PodRef, state: str, message: str) -> None:
        body = {"metadata": {"annotations": {names.ANNOTATION_SUSPEND_STATE: state}}}
        try:
            self.core.patch_namespaced_pod(pod.name, pod.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise

    def event(self, pod: PodRef, reason: str, message: str, warning: bool) -> None:
        now = dt.datetime.now(dt.UTC)
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                               "namespace": pod.namespace, "uid": pod.uid},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "rose-dra-driver", "host": self.node_name},
            "reportingComponent": "gpu.rose.io/driver",
            "reportingInstance": self.node_name,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        self.core.create_namespaced_event(pod.namespace, ev)


class KubeSlices:
    """ResourceSlices of one driver on one node."""

    def __init__(self, api: client.ApiClient, node_name: str, driver: str = names.DRIVER_NAME) -> None:
        self.resource = client.ResourceV1Api(api)
        self.selector = f"spec.nodeName={node_name},spec.driver={driver}"

    def list(self) -> tuple[list[dict[str, Any]], str]:
        doc = _json(self.resource.list_resource_slice(field_selector=self.selector, _preload_content=False))
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def create(self, body: dict[str, Any]) -> None:
        self.resource.create_resource_slice(body)

    def replace(self, body: dict[str, Any]) -> None:
        self.resource.replace_resource_slice(body["metadata"]["name"], body)

    def delete(self, name: str) -> None:
        try:
            self.resource.delete_resource_slice(name)
        except ApiException as e:
            if e.status != 404:
                raise

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = self.resource.list_resource_slice(
            field_selector=self.selector, watch=True, resource_version=resource_version,
            timeout_seconds=timeout_seconds, allow_watch_bookmarks=False, _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                ev = json.loads(line)
                yield str(ev.get("type")), dict(ev.get("object") or {})
        finally:
            resp.release_conn()


class KubePods:
    """Pods bound to one node."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.selector = f"spec.nodeName={node_name}"

    def list(self) -> tuple[list[dict[str, Any]], str]:
        doc = _json(self.core.list_pod_for_all_namespaces(field_selector=self.selector, _preload_content=False))
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=self.selector, watch=True, resource_version=resource_version,
            timeout_seconds=timeout_seconds, _preload_content=False,
        )
        try:
            for line in iter_resp_lines(resp):
                ev = json.loads(line)
                yield str(ev.get("type")), dict(ev.get("object") or {})
        finally:
            resp.release_conn()
