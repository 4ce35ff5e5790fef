"""Raw Kubernetes watch events, parsed once as plain JSON.

The official client's ``Watch`` looks up a generated model class for every kind, even when told
not to deserialize, and fails for kinds whose model name it cannot derive (``resource.k8s.io/v1``
ResourceClaim is ``ResourceV1ResourceClaim`` in kubernetes 37): every watch of ResourceClaims
raised at once, so a caller relisted in a loop. Components stream the response lines themselves
(:meth:`rose_common.kube.client.Raw.watch`) and parse them here. No I/O in this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from rose_common.kube.errors import HTTP_GONE, Status, error_for

__all__ = ["HTTP_GONE", "events"]


def events(lines: Iterable[str | bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(type, object)`` for each watch line (ADDED, MODIFIED, DELETED, BOOKMARK); blank lines are
    skipped; an ERROR event raises the typed :class:`rose_common.kube.errors.ApiError` of its
    ``Status`` (:class:`~rose_common.kube.errors.Gone` for 410: the resourceVersion is too old,
    relist); a line that is not a watch event raises
    ``ValueError`` naming what was received."""
    for line in lines:
        if not line or line.isspace():
            continue
        ev = json.loads(line)
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str) or not isinstance(ev.get("object"), dict):
            raise ValueError(f"not a watch event: {str(line)[:200]}")
        obj: dict[str, Any] = ev["object"]
        if ev["type"] == "ERROR":
            details = obj.get("details")
            raise error_for(
                Status(
                    code=int(obj.get("code") or 500),
                    reason=str(obj.get("reason") or ""),
                    message=str(obj.get("message") or "watch error"),
                    details=details if isinstance(details, dict) else {},
                )
            )
        yield ev["type"], obj
