"""The body of a core/v1 Event about a Pod: every decision ROSE takes on a pod is recorded so."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rose_common.timefmt import rfc3339


def pod_event(
    name: str,
    namespace: str,
    uid: str,
    reason: str,
    message: str,
    component: str,
    *,
    warning: bool = False,
    host: str | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """An Event (``POST /api/v1/namespaces/{namespace}/events``) on the pod ``namespace/name``."""
    stamp = rfc3339(now or dt.datetime.now(dt.UTC))
    source: dict[str, str] = {"component": component}
    if host:
        source["host"] = host
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": source,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": host or component,
    }
