"""The time-slice state machine of one group: holder, lease, fencing token, queue, resident.

I/O boundary: none. Every function maps (a :class:`Group`, the request, ``now`` in epoch seconds)
to a new :class:`Group` (frozen) or raises :class:`Refused`. The orchestrator
(:mod:`timeslice.orchestrator`) keeps the durable copy in a store and writes each new state with
compare-and-swap before it answers.

Rules:

- **One holder.** A job holds the group from its grant until it yields or its lease expires
  (``renewed + lease_ttl_s < now``, or ``granted + max_hold_s < now``: a grant has a maximum hold,
  Renew does not extend it); nobody else is granted meanwhile.
- **One namespace.** A group's key is ``namespace/name`` (:func:`group_key`): a group belongs to
  the namespace of the jobs that acquire it, and a name is a DNS-1123 label (``Team_A`` is refused,
  not aliased to ``team-a``).
- **Fencing.** Every grant increments ``token``; Yield and Renew must carry the current token and
  come from the holder, anything else is :class:`Refused` (a dead holder's late command).
- **Queue.** Waiters are ordered by ``priority + waited_s / aging_s`` (ties: first come), so a
  higher priority goes first but every waiter ages up and none starves; equal priorities are FIFO.
- **Lazy eviction.** A yield leaves the job's state ``resident``; its next grant with the devices
  still its own needs no hand-over (``out_job`` None, ``was_resident``).
- **Switching.** A grant that moves state is written first with ``switching=True`` (the token is
  then fixed, and the nodes fence on it); :func:`settle` marks the hand-over done. A grant found
  still switching after a restart is redone with a new token.
- **Orphans.** A record read from the store may queue waiters whose callers are connected to
  another (or a dead) replica: :func:`adopt` keeps them as ``live=False`` with their place until
  ``orphan_until``, so a caller that retries after a restart is not sent to the back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

DEFAULT_AGING_S = 10.0
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class Refused(Exception):
    """A command the group's state does not allow (stale fencing token, not the holder)."""


@dataclass(frozen=True)
class Waiter:
    job: str
    role: str = ""
    since: float = 0.0
    priority: int = 0
    live: bool = True
    orphan_until: float = 0.0

    def rank(self, now: float, aging_s: float) -> float:
        return self.priority + max(0.0, now - self.since) / aging_s


@dataclass(frozen=True)
class Group:
    name: str
    lease_ttl_s: float = 10.0
    holder: str = ""
    holder_role: str = ""
    token: int = 0
    renewed: float = 0.0
    resident: str = ""
    previous: str = ""  # the resident before the current switch (what a redone switch suspends)
    switching: bool = False
    switch_deadline: float = 0.0  # while switching, the lease runs until this plus the TTL
    waiters: tuple[Waiter, ...] = field(default_factory=tuple)
    max_hold_s: float = 0.0  # the longest one grant lasts, Renew or not (0: no limit)
    granted: float = 0.0  # when the holder's grant started (settled, for a grant that moved state)
    hold_ended: str = ""  # "<job>:<token>" of the last grant that reached its maximum hold (for its refusal)

    def expired(self, now: float) -> bool:
        return bool(self.holder) and now > self.expiry()

    def hold_ends(self) -> float:
        """When the holder's grant reaches its maximum hold (+inf without one)."""
        return self.granted + self.max_hold_s if self.holder and self.max_hold_s > 0 else float("inf")

    def held_too_long(self, now: float) -> bool:
        """The holder lost the group to its maximum hold (not to a missing Renew)."""
        return bool(self.holder) and not self.switching and now > self.hold_ends()

    def holds(self, job: str, now: float) -> bool:
        return self.holder == job and not self.expired(now)

    def expiry(self) -> float:
        """When the holder's lease expires (epoch seconds); +inf with no holder."""
        if not self.holder:
            return float("inf")
        base = self.renewed + self.lease_ttl_s
        if self.switching:
            return max(base, self.switch_deadline + self.lease_ttl_s)
        return min(base, self.hold_ends())

    def waiting(self, job: str) -> Waiter | None:
        return next((w for w in self.waiters if w.job == job), None)


@dataclass(frozen=True)
class Grant:
    job: str
    token: int
    out_job: str | None  # whose state to suspend first (None: nothing else is resident)
    was_resident: bool


def validate_name(kind: str, value: str) -> None:
    if not value or len(value) > 253 or any(c.isspace() for c in value):
        raise ValueError(f"{kind} must be 1-253 characters without spaces, got {value!r}")


def validate_label(kind: str, value: str) -> None:
    """A DNS-1123 label: lower-case letters, digits and '-', 1-63 characters (a Kubernetes name)."""
    if len(value) > 63 or not _LABEL.match(value):
        raise ValueError(
            f"{kind} must be a DNS-1123 label (1-63 characters of a-z, 0-9 and '-', starting and "
            f"ending with a letter or digit), got {value!r}"
        )


def validate_label_value(kind: str, value: str) -> None:
    """A Kubernetes label value, not empty (a job's name is its workers' rose.io/elastic-rl-job label)."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValueError(
            f"{kind} must be 1-63 characters of letters, digits, '-', '_' and '.', starting and "
            f"ending with a letter or digit, got {value!r}"
        )


def group_key(group: str, namespace: str) -> str:
    """The key of ``group`` in ``namespace``: ``namespace/name`` (just ``name`` outside Kubernetes, with
    no namespace). ``group`` may be ``name`` or ``namespace/name``; a namespace other than
    ``namespace`` is refused (a group belongs to one namespace). ValueError naming what to fix."""
    ns, sep, name = group.rpartition("/")
    if sep and ns != namespace:
        raise PermissionError(
            f"group {group!r} belongs to namespace {ns!r}, not the caller's namespace "
            f"{namespace or '(none)'!r}: a job acquires only its own namespace's groups"
        )
    validate_label("group", name)
    if not namespace:
        return name
    validate_label("namespace", namespace)
    return f"{namespace}/{name}"


def split_key(key: str) -> tuple[str, str]:
    """``(namespace, name)`` of a group key (namespace "" outside Kubernetes)."""
    ns, _, name = key.rpartition("/")
    return ns, name


def enqueue(g: Group, job: str, role: str, priority: int, now: float) -> Group:
    """Put ``job`` in the queue (a waiting or orphaned entry keeps its place; the holder is not queued)."""
    if g.holds(job, now):
        return g
    old = g.waiting(job)
    if old is not None:
        if old.live:
            return g
        revived = replace(old, live=True, role=role or old.role, priority=priority)
        return replace(g, waiters=tuple(revived if w.job == job else w for w in g.waiters))
    return replace(g, waiters=(*g.waiters, Waiter(job, role, now, priority)))


def withdraw(g: Group, job: str) -> Group:
    """Remove ``job`` from the queue (its caller gave up)."""
    return replace(g, waiters=tuple(w for w in g.waiters if w.job != job))


def expire(g: Group, now: float) -> Group:
    """Drop a holder whose lease expired (its state stays resident until someone else is granted)."""
    if not g.expired(now):
        return g
    ended = f"{g.holder}:{g.token}" if g.held_too_long(now) else g.hold_ended
    return replace(g, holder="", holder_role="", switching=False, hold_ended=ended)


def check_token(g: Group, job: str, token: int, now: float, what: str) -> None:
    if g.hold_ended == f"{job}:{token}" and (token != g.token or g.holder != job):
        raise Refused(
            f"{what} by {job} with fencing token {token} refused: its grant of {g.name} reached the "
            f"maximum hold of {g.max_hold_s:g}s (--max-hold) and the group went on; Yield at the end of "
            "each phase and Acquire again"
        )
    if token != g.token or g.holder != job:
        holder = f"{g.holder} with token {g.token}" if g.holder else f"nobody (token {g.token})"
        raise Refused(f"{what} by {job} with fencing token {token} refused: group {g.name} is held by {holder}")
    if g.held_too_long(now):
        raise Refused(
            f"{what} by {job} with fencing token {token} refused: its grant of {g.name} reached the "
            f"maximum hold of {g.max_hold_s:g}s (--max-hold); Yield at the end of each phase and Acquire "
            "again (the state stays resident when nobody waits)"
        )
    if g.expired(now):
        raise Refused(f"{what} by {job} with fencing token {token} refused: its lease on {g.name} expired")


def yield_(g: Group, job: str, token: int, now: float) -> Group:
    """The holder gives the group up; its state stays resident (lazy eviction)."""
    check_token(g, job, token, now, "yield")
    return replace(g, holder="", holder_role="", switching=False)


def renew(g: Group, job: str, token: int, now: float) -> Group:
    check_token(g, job, token, now, "renew")
    return replace(g, renewed=now)


def pick(g: Group, now: float, aging_s: float = DEFAULT_AGING_S) -> Waiter | None:
    """The live waiter to grant next, or None (the group is held, or nobody live waits)."""
    if g.holder and not g.expired(now):
        return None
    live = [w for w in g.waiters if w.live]
    if not live:
        return None
    return max(live, key=lambda w: (w.rank(now, aging_s), -w.since))


def grant(g: Group, job: str, now: float, switch_deadline: float = 0.0) -> tuple[Group, Grant]:
    """Give the free group to ``job`` with the next token; ``switching`` (until ``switch_deadline``) if state moves."""
    if g.holder and not g.expired(now):
        raise Refused(f"group {g.name} is held by {g.holder}; cannot grant to {job}")
    token = g.token + 1
    if g.resident == job:
        out = None
        was_resident = True
    else:
        out = g.resident or None
        was_resident = False
    waiter = g.waiting(job)
    waiters = tuple(w for w in g.waiters if w.job != job and (w.live or w.orphan_until >= now))
    new = replace(
        g,
        holder=job,
        holder_role=waiter.role if waiter else g.holder_role,
        token=token,
        renewed=now,
        granted=now,
        previous=g.resident,
        resident=job,
        switching=not was_resident,
        switch_deadline=switch_deadline,
        waiters=waiters,
    )
    return new, Grant(job, token, out, was_resident)


def redo(g: Group, now: float, switch_deadline: float = 0.0) -> tuple[Group, Grant]:
    """A grant found still switching (its orchestrator died mid-hand-over): the same job, a new token."""
    if not g.switching or not g.holder:
        raise Refused(f"group {g.name} is not mid-hand-over")
    token = g.token + 1
    new = replace(g, token=token, renewed=now, granted=now, switch_deadline=switch_deadline)
    return new, Grant(g.holder, token, g.previous or None, False)


def settle(g: Group, job: str, token: int, now: float) -> Group:
    """The hand-over of grant ``token`` to ``job`` is done; its lease starts now."""
    if g.holder != job or g.token != token:
        raise Refused(f"hand-over of {g.name} to {job} (token {token}) superseded by token {g.token}")
    return replace(g, switching=False, switch_deadline=0.0, renewed=now, granted=now)


def fail_switch(g: Group, job: str, token: int) -> Group:
    """The hand-over failed and was rolled back: nobody holds, the previous resident is back."""
    if g.holder != job or g.token != token:
        return g
    return replace(g, holder="", holder_role="", switching=False, switch_deadline=0.0, resident=g.previous)


def adopt(g: Group, live: frozenset[str], now: float, grace_s: float) -> Group:
    """A record just read from the store: waiters without a caller here are orphans kept ``grace_s``."""

    def one(w: Waiter) -> Waiter:
        if w.job in live:
            return replace(w, live=True)
        return replace(w, live=False, orphan_until=w.orphan_until or now + grace_s)

    return replace(g, waiters=tuple(one(w) for w in g.waiters))
