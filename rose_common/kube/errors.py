"""Typed Kubernetes API errors, each carrying the parsed ``Status`` the API server sent.

:func:`from_api_exception` is the one translation from the official client's ``ApiException``
(or any object with ``status``, ``reason`` and ``body``); callers catch :class:`NotFound`,
:class:`Conflict`, :class:`Unprocessable` or :class:`Gone` instead of comparing status codes, and
read ``err.status.reason`` / ``err.status.message`` instead of parsing bodies. No I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410
HTTP_UNPROCESSABLE = 422


@dataclass(frozen=True)
class Status:
    """The fields of a ``meta/v1`` ``Status`` object that callers decide on."""

    code: int
    reason: str = ""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class ApiError(Exception):
    """The API server refused a request; ``status`` is what it said."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"{status.code} {status.reason}: {status.message}".rstrip(": "))
        self.status = status

    @property
    def code(self) -> int:
        return self.status.code


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409: a precondition (resourceVersion, uid) failed, or the object already exists."""


class Gone(ApiError):
    """410: the resourceVersion is too old (a watch must relist)."""


class Unprocessable(ApiError):
    """422: the object is invalid (``status.details.causes`` says why)."""


_BY_CODE: dict[int, type[ApiError]] = {
    HTTP_NOT_FOUND: NotFound,
    HTTP_CONFLICT: Conflict,
    HTTP_GONE: Gone,
    HTTP_UNPROCESSABLE: Unprocessable,
}


def parse_status(code: int, body: str | bytes | None, reason: str = "") -> Status:
    """A :class:`Status` from a response body that should be a ``Status`` JSON object; a body that
    is not one (a proxy's HTML page, nothing) becomes the message as it is."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Status(code=code, reason=reason, message=text[:500])
    details = doc.get("details")
    return Status(
        code=int(doc.get("code") or code),
        reason=str(doc.get("reason") or reason),
        message=str(doc.get("message") or ""),
        details=details if isinstance(details, dict) else {},
    )


def error_for(status: Status) -> ApiError:
    """The typed error for a ``Status`` (:class:`ApiError` itself for codes without a subclass)."""
    return _BY_CODE.get(status.code, ApiError)(status)


def from_api_exception(e: Any) -> ApiError:
    """Translate the official client's ``ApiException`` (``status``, ``reason``, ``body``)."""
    code = int(getattr(e, "status", 0) or 0)
    return error_for(parse_status(code, getattr(e, "body", None), str(getattr(e, "reason", "") or "")))
