"""RFC 3339 timestamps as Kubernetes writes them: one formatter and one parser for every package.

``rfc3339(t)`` writes UTC with a ``Z`` suffix, to the second (``metav1.Time``: Events, conditions,
annotations) or, with ``micros=True``, to the microsecond (``metav1.MicroTime``: Lease times).
``parse_rfc3339(s)`` reads what the API server (or another writer of RFC 3339) wrote: ``Z`` or a
numeric offset, any fractional seconds (beyond microseconds truncated). A time without a zone is
refused (ValueError saying so): it would be read as local time. Pure.
"""

from __future__ import annotations

import datetime as dt
import re

_FMT_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
_FMT_MICROS = "%Y-%m-%dT%H:%M:%S.%fZ"
_RFC3339 = re.compile(
    r"(?P<base>\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?(?P<zone>[Zz]|[+-]\d{2}:\d{2})?"
)


def rfc3339(t: dt.datetime, *, micros: bool = False) -> str:
    """``t`` in UTC, ``Z`` suffix: ``2026-12-02T01:02:03Z`` (``micros``: ``…03.000456Z``).
    ValueError for a naive datetime (its zone is unknown)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"timestamp {t.isoformat()} has no time zone: give an aware datetime (e.g. in dt.UTC)")
    return t.astimezone(dt.UTC).strftime(_FMT_MICROS if micros else _FMT_SECONDS)


def parse_rfc3339(s: str) -> dt.datetime:
    """The aware UTC datetime of an RFC 3339 timestamp (``Z`` or ``±HH:MM``, optional fraction).
    ValueError saying what is wrong otherwise, a missing zone included."""
    m = _RFC3339.fullmatch(s.strip()) if isinstance(s, str) else None
    if m is None:
        raise ValueError(f"timestamp {s!r} is not RFC 3339 (e.g. 2026-12-02T01:02:03Z)")
    if m["zone"] is None:
        raise ValueError(f"timestamp {s!r} has no time zone: RFC 3339 needs Z or an offset such as +00:00")
    frac = (m["frac"] or "")[:6].ljust(6, "0")
    zone = "+00:00" if m["zone"] in ("Z", "z") else m["zone"]
    try:
        t = dt.datetime.fromisoformat(f"{m['base'][:10]}T{m['base'][11:]}.{frac}{zone}")
    except ValueError as e:  # well-formed but no such date or time (month 13, hour 25)
        raise ValueError(f"timestamp {s!r} is not a valid date and time: {e}") from None
    return t.astimezone(dt.UTC)
