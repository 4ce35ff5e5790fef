"""Fencing of time-slice hand-overs on the node: the last token seen per group. Pure: no I/O, no lock
(:class:`dra_driver.fencebook.FenceBook` is the thread-safe book around :func:`admit`).

The orchestrator's hand-over carries ``rose.io/fencing-token: "<namespace>/<group>:<token>"`` (on the pod's
suspend-request path, or in the agent's NodeControl request). :func:`admit` accepts a token not
older than the last one seen for its group and remembers it; an older one is refused, so an
orchestrator that lost its lease (a stale replica, a dead holder's late command) can never drive a
hand-over. The driver keeps the book in its crash-safe checkpoint (``state.py``).

The book is bounded, because what it is fed is not authority (docs/security.md, "Workload reports
are hints"): the annotation lives on a pod, and only the admission policy
(``manifests/policies/control-annotations.yaml``) keeps tenants from writing it. So a token is
admitted only when its group is a valid time-slice group key (the orchestrator's
``<namespace>/<group>``, each a DNS label as the ElasticRLJob CRD's ``spec.timesliceGroup``) and
its token fits in 63 bits, and the book holds at most :data:`MAX_GROUPS` groups: a new group past
the cap drops the least recently admitted group that has no pod on this node (``in_use``); when
every group has one, the new group is refused (nothing is dropped that a hand-over on this node
still needs). The book's order is its recency: a group admitted again moves to the end. A
checkpoint keeps the tokens, not the order (a restarted driver starts from the saved order).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from rose_common import names

MAX_GROUPS: Final = 64  # groups one node remembers; a node runs a handful (one per lent GPU at most)
MAX_TOKEN: Final = 2**63 - 1  # the orchestrator's tokens are Lease-backed counters, far below this
MAX_GROUP_LEN: Final = 63
GROUP_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # the CRD's timesliceGroup pattern

STALE: Final = "stale"
FULL: Final = "full"
NO_CLAIM: Final = "no-claim"  # the pod that carries it holds no lent claim prepared on this node


@dataclass(frozen=True)
class Verdict:
    ok: bool
    group: str
    token: int
    last: int  # the last token seen for the group before this one (0: none)
    reason: str = ""  # why not ok: STALE (an older token), FULL (MAX_GROUPS in use) or NO_CLAIM
    dropped: str = ""  # the groups the book forgot to make room for this one ("" when none)

    def message(self) -> str:
        if self.ok:
            return f"fencing token {self.token} of group {self.group!r} accepted"
        if self.reason == NO_CLAIM:
            return (
                f"fencing token {self.token} of group {self.group!r} refused: the pod that carries it holds no lent"
                " claim prepared on this node, so no hand-over here concerns it"
            )
        if self.reason == FULL:
            return (
                f"fencing token {self.token} of group {self.group!r} refused: this node already remembers "
                f"{MAX_GROUPS} time-slice groups, each with a pod on the node"
            )
        return (
            f"fencing token {self.token} of group {self.group!r} is older than {self.last}, the last this node saw:"
            " the command comes from a stale orchestrator and is refused"
        )


def parse(raw: str) -> tuple[str, int]:
    """``(group, token)`` of a ``rose.io/fencing-token`` value; ValueError says what is wrong:
    malformed, a group that is not a DNS label of at most 63 characters, or a token past 2^63-1."""
    group, token = names.parse_fencing_token(raw)
    if not all(len(part) <= MAX_GROUP_LEN and GROUP_RE.match(part) for part in group.split("/", 1)):
        raise ValueError(
            f"{names.ANNOTATION_FENCING_TOKEN}: group {group[:80]!r} is not a time-slice group key "
            f"('<namespace>/<group>' or '<group>': lower-case letters, digits and '-', at most {MAX_GROUP_LEN}"
            " characters each)"
        )
    if token > MAX_TOKEN:
        raise ValueError(f"{names.ANNOTATION_FENCING_TOKEN}: token {str(token)[:40]} of group {group!r} exceeds 2^63-1")
    return group, token


def judge(last_seen: dict[str, int], raw: str) -> Verdict:
    """The verdict on ``raw`` ("<group>:<token>") against ``last_seen``; ValueError if malformed."""
    group, token = parse(raw)
    last = last_seen.get(group, 0)
    return Verdict(token >= last, group, token, last, "" if token >= last else STALE)


def admit(last_seen: dict[str, int], raw: str, in_use: Collection[str] = ()) -> Verdict:
    """Judge ``raw`` and, when it is admitted, record it in ``last_seen`` (changed in place, most
    recently admitted last), keeping at most :data:`MAX_GROUPS` groups: a new group past the cap
    drops the least recent group not in ``in_use``, or is refused (:data:`FULL`) when all are."""
    v = judge(last_seen, raw)
    if not v.ok:
        return v
    dropped = ""
    if v.group not in last_seen and len(last_seen) >= MAX_GROUPS:
        # a checkpoint written before the cap may hold more: trim it down to the cap here
        spare = [g for g in last_seen if g not in in_use][: len(last_seen) - MAX_GROUPS + 1]
        if len(last_seen) - len(spare) >= MAX_GROUPS:
            return Verdict(False, v.group, v.token, v.last, FULL)
        for g in spare:
            del last_seen[g]
        dropped = ", ".join(spare)
    last_seen.pop(v.group, None)
    last_seen[v.group] = v.token
    return Verdict(True, v.group, v.token, v.last, dropped=dropped)
