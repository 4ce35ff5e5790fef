"""The one Kubernetes API client factory and raw JSON transport (I/O: the API server).

:func:`api_client` builds an official ``kubernetes.client.ApiClient`` from a kubeconfig file, else
from the pod's service account. :class:`Raw` sends plain-JSON requests through that client's
transport (auth, TLS, proxies) so objects cross this boundary as dicts and no component depends on
the client's generated models; every non-2xx answer raises the typed :mod:`.errors`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _watch

from rose_common import kwatch
from rose_common.kube.errors import error_for, from_api_exception, parse_status

CONNECT_TIMEOUT_S = 10.0
WATCH_READ_SLACK_S = 30.0


def api_client(kubeconfig: str | Path | None, connections: int | None = None) -> client.ApiClient:
    """An API client from a kubeconfig file, else from the pod's service account; ``connections``:
    the HTTP connections kept open (the client's default is 5 per CPU, and each watch holds one)."""
    cfg_mod: Any = _config
    cfg = client.Configuration()
    if connections is not None:
        cfg.connection_pool_maxsize = connections
    if kubeconfig:
        api: client.ApiClient = cfg_mod.new_client_from_config(config_file=str(kubeconfig), client_configuration=cfg)
        return api
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
        timeout: float | tuple[float, float] | None = 30.0,
    ) -> Any:
        """The raw response of one request; a non-2xx answer raises an :class:`~rose_common.kube.errors.ApiError`."""
        m, url, headers, data, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(m, url, header_params=headers, body=data, _request_timeout=timeout)
        except ApiException as e:  # the transport itself refused (e.g. a 5xx during connect)
            raise from_api_exception(e) from e
        if not 200 <= resp.status <= 299:
            raise error_for(parse_status(resp.status, resp.read(), str(resp.reason or "")))
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
        """``(type, object)`` events of one watch request; ends when the server ends it."""
        q = dict(query, watch="true", timeoutSeconds=str(timeout_seconds))
        resp = self.call("GET", path, query=q, timeout=(CONNECT_TIMEOUT_S, timeout_seconds + WATCH_READ_SLACK_S))
        raw = resp.response
        try:
            lines: Any = _watch.iter_resp_lines
            yield from kwatch.events(lines(raw))
        finally:
            raw.close()
            raw.release_conn()
