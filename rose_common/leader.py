"""Leader election over a coordination.k8s.io/v1 Lease: the decision, as a pure function.

I/O boundary: none. Shared by the controller and the timeslice orchestrator. :func:`decide` maps
(the Lease as read, who I am, now, the lease duration) to what to write, if anything, and whether
I lead. Each component's ``kube.LeaseLock`` reads and writes the Lease (a replace carries the read
``resourceVersion``, so of two replicas deciding at once only one write succeeds); a replica acts
only while it holds the lease and stops as soon as a renewal fails or the lease is older than its
duration.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from rose_common.timefmt import parse_rfc3339, rfc3339


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration_s: int
    acquired: dt.datetime
    renewed: dt.datetime
    transitions: int = 0

    def expired(self, now: dt.datetime) -> bool:
        return (now - self.renewed).total_seconds() > self.duration_s

    @staticmethod
    def from_spec(spec: dict[str, Any]) -> LeaseRecord | None:
        """The record of a Lease's spec; None when it has no holder or unreadable times."""
        try:
            renewed = parse_rfc3339(spec["renewTime"])
            acquired = parse_rfc3339(spec.get("acquireTime") or spec["renewTime"])
            return LeaseRecord(
                str(spec["holderIdentity"]),
                int(spec.get("leaseDurationSeconds") or 15),
                acquired,
                renewed,
                int(spec.get("leaseTransitions") or 0),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": rfc3339(self.acquired, micros=True),
            "renewTime": rfc3339(self.renewed, micros=True),
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Decision:
    write: LeaseRecord | None  # what to write (None: nothing)
    leader: bool  # whether I lead once the write (if any) succeeds
    reason: str


def decide(current: LeaseRecord | None, me: str, now: dt.datetime, duration_s: int) -> Decision:
    """Acquire a free or expired lease, renew my own, follow a live one held by another."""
    if duration_s < 1:
        raise ValueError(f"lease duration must be >= 1 second, got {duration_s}")
    if current is None:
        return Decision(LeaseRecord(me, duration_s, now, now), True, "acquired a new lease")
    if current.holder == me:
        return Decision(replace(current, renewed=now, duration_s=duration_s), True, "renewed")
    if current.holder and not current.expired(now):
        return Decision(None, False, f"held by {current.holder}")
    record = LeaseRecord(me, duration_s, now, now, current.transitions + 1)
    return Decision(record, True, f"took over an expired lease from {current.holder or 'nobody'}")
