"""The time-slice orchestrator's group Lease as its readers see it (the shared contract).

I/O boundary: none. A group belongs to one namespace (its key is ``namespace/name``). The
orchestrator (``timeslice.store``) writes one coordination.k8s.io/v1 Lease per group, named by
:func:`lease_name` (collision-free: a hash of the key), labelled ``rose.io/timeslice-group`` with
the group's name (a DNS-1123 label, so it fits a label value): ``holderIdentity`` the holder (a job
``namespace/name``), ``leaseTransitions`` the fencing token, ``renewTime`` +
``leaseDurationSeconds`` its expiry, and ``rose.io/timeslice-*`` annotations (the group, the
resident job, the switching flag, the group's namespace ``rose.io/timeslice-namespace`` — empty
outside Kubernetes — and its maximum hold). :func:`read` turns such a Lease into a :class:`GroupLease`;
the ElasticRLJob controller reflects it in each member job's status. The orchestrator's Lease is
the source of truth for who holds and who is resident: readers never write it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

from rose_common import names
from rose_common.timefmt import parse_rfc3339

LABEL_GROUP: Final = names.LABEL_TIMESLICE_GROUP
A_GROUP: Final = "rose.io/timeslice-group"
A_RESIDENT: Final = "rose.io/timeslice-resident"
A_SWITCHING: Final = "rose.io/timeslice-switching"
A_TTL: Final = "rose.io/timeslice-lease-ttl"  # the exact TTL (leaseDurationSeconds is whole seconds)
A_NAMESPACE: Final = "rose.io/timeslice-namespace"  # the namespace the group belongs to ("" outside Kubernetes)
A_MAX_HOLD: Final = "rose.io/timeslice-max-hold"  # seconds one grant may last, Renew or not (0: no limit)
A_GRANTED: Final = "rose.io/timeslice-granted"  # epoch seconds the holder's grant started


def lease_name(group: str, namespace: str = "") -> str:
    """The name of group ``group``'s Lease in ``namespace``: ``ts-<namespace>-<group>`` shortened, and
    a hash of ``namespace/group`` so that no two groups share one (``a-b``/``c`` vs ``a``/``b-c``)."""
    key = f"{namespace}/{group}" if namespace else group
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    readable = "".join(c if c.isalnum() or c == "-" else "-" for c in key.lower().replace("/", "-")).strip("-")
    return f"ts-{readable[:48].strip('-')}-{digest}"


@dataclass(frozen=True)
class GroupLease:
    group: str  # the group's name (``spec.timesliceGroup`` of its member jobs)
    holder: str  # "" when nobody holds the group
    resident: str  # the job whose state is on the devices ("" when none); stays after a Yield (lazy eviction)
    token: int  # the fencing token: +1 on every grant
    switching: bool  # a hand-over to ``holder`` is in flight
    expires: float  # epoch seconds the holder's lease ends (0: no holder)
    namespace: str = ""  # the namespace the group belongs to ("" outside Kubernetes)

    @property
    def key(self) -> str:
        """``namespace/group`` (the orchestrator's key of the group)."""
        return f"{self.namespace}/{self.group}" if self.namespace else self.group

    def holds(self, job: str, now: float) -> bool:
        return bool(self.holder) and self.holder == job and now < self.expires


def read(doc: dict[str, Any]) -> GroupLease | None:
    """The group of an orchestrator Lease; None for a Lease that is not one (no group annotation).

    Raises ValueError naming the Lease and the field when a group Lease is unreadable."""
    meta = doc.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = doc.get("spec") or {}
    group = ann.get(A_GROUP)
    if not group:
        return None
    try:
        token = int(spec.get("leaseTransitions") or 0)
        renewed = parse_rfc3339(spec["renewTime"]).timestamp() if spec.get("renewTime") else 0.0
        ttl = float(ann.get(A_TTL) or spec.get("leaseDurationSeconds") or 0)
        max_hold = float(ann.get(A_MAX_HOLD) or 0)
        granted = float(ann.get(A_GRANTED) or renewed)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Lease {meta.get('name')!r} of time-slice group {group!r} is unreadable: {e}") from None
    holder = str(spec.get("holderIdentity") or "")
    switching = ann.get(A_SWITCHING) == "true"
    expires = renewed + ttl if holder and renewed else 0.0
    if expires and max_hold > 0 and not switching:
        expires = min(expires, granted + max_hold)
    return GroupLease(
        str(group), holder, str(ann.get(A_RESIDENT) or ""), token, switching, expires, str(ann.get(A_NAMESPACE) or "")
    )
