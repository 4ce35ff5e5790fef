"""The orchestrator: the state machine of each group over a compare-and-swap store, event-driven.

I/O boundary: a :class:`~timeslice.store.Store` (the API server's Leases, or memory) and a
:class:`Handover` (the node side). Each group's decisions are :mod:`timeslice.state`'s pure
functions; every new state is written with compare-and-swap over the version this replica read
(a conflict reloads the record and decides again), and nothing is answered before its write
succeeded, so a restarted or a second replica never grants one token twice.

No polling: an Acquire waits on its group's condition, woken by a Yield, a withdrawal, a failed
hand-over or a leadership change, with its timeout set to its own deadline or the holder's lease
expiry, whichever is first. A Yield writes the release and the grant to the next waiter
(:func:`timeslice.state.pick`) in one compare-and-swap (``switching`` when state must move, which
fixes the fencing token); on an expiry the chosen waiter writes its grant itself. The waiter runs
the hand-over outside the group's lock and writes it settled (or rolled back).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from timeslice import state
from timeslice.metrics import TimesliceMetrics
from timeslice.state import Grant, Group, Refused
from timeslice.store import Store

log = logging.getLogger("timeslice")
T = TypeVar("T")


class NotLeader(Exception):
    """This replica is not the active one."""


class Busy(Exception):
    """The group's queue is full."""


class DeadlineExceeded(Exception):
    """The caller's deadline passed before the grant (its request was withdrawn)."""


class Cancelled(Exception):
    """The caller went away before the grant (its request was withdrawn)."""


class HandoverFailed(Exception):
    """The hand-over failed on some node and was rolled back."""


class StoreContention(Exception):
    """Compare-and-swap kept failing (another writer)."""


class HandoverOutcome(Protocol):
    @property
    def ok(self) -> bool: ...
    @property
    def error(self) -> str: ...
    @property
    def suspend_s(self) -> float: ...
    @property
    def restore_s(self) -> float: ...


class Handover(Protocol):
    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverOutcome:
        """Suspend ``out_job`` on every node of the group, then restore ``in_job``; all or nothing."""
        ...


@dataclass(frozen=True)
class NoopOutcome:
    ok: bool = True
    error: str = ""
    suspend_s: float = 0.0
    restore_s: float = 0.0
    bytes_moved: int = 0
    suspended_bytes: int = 0


class NoopHandover:
    """Explicit hand-over that moves nothing: for use without nodes (CPU jobs, tests, the benchmark)."""

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverOutcome:
        return NoopOutcome()


@dataclass(frozen=True)
class DelayHandover:
    """Explicit stand-in that moves nothing but takes ``delay_s`` (a hand-over in flight, for crash tests)."""

    delay_s: float

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> HandoverOutcome:
        time.sleep(max(0.0, min(self.delay_s, deadline - time.time())))
        return NoopOutcome(suspend_s=self.delay_s / 2, restore_s=self.delay_s / 2)


@dataclass(frozen=True)
class Settings:
    lease_ttl_s: float = 10.0
    aging_s: float = state.DEFAULT_AGING_S
    max_waiters: int = 256
    switch_timeout_s: float = 60.0
    orphan_grace_s: float = 10.0
    cas_attempts: int = 5
    max_hold_s: float = 0.0  # the longest one grant lasts, Renew or not (0: no limit)

    def __post_init__(self) -> None:
        if self.max_hold_s < 0:
            raise ValueError(f"max-hold must be >= 0 (0: no limit), got {self.max_hold_s}")
        for name in ("lease_ttl_s", "aging_s", "switch_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name.removesuffix('_s').replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.max_waiters < 1:
            raise ValueError(f"max-waiters must be >= 1, got {self.max_waiters}")


@dataclass(frozen=True)
class AcquireResult:
    token: int
    lease_ttl_s: float
    was_resident: bool
    wait_s: float
    suspend_s: float = 0.0
    restore_s: float = 0.0
    grant_overhead_s: float = 0.0
    bytes_moved: int = 0


@dataclass
class _Slot:
    g: Group
    version: str
    freed_at: float
    cond: threading.Condition = field(default_factory=threading.Condition)
    live: Counter[str] = field(default_factory=Counter)
    pending: dict[str, Grant] = field(default_factory=dict)  # written by a Yield, not yet taken by its waiter


class Orchestrator:
    def __init__(
        self,
        store: Store,
        handover: Handover | None = None,
        metrics: TimesliceMetrics | None = None,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.time,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.handover: Handover = handover or NoopHandover()
        self.metrics = metrics or TimesliceMetrics()
        self.settings = settings or Settings()
        self.clock = clock
        self.leading = leading
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ slots and the store

    def _slot(self, group: str) -> _Slot:
        """The group's slot, created (from its record, or empty) if this replica has none: only an
        Acquire, whose job was checked, creates one."""
        with self._lock:
            slot = self._slots.get(group)
            if slot is None:
                now = self.clock()
                g, version = self.store.load(group)
                g = (
                    self._limits(state.adopt(g, frozenset(), now, self.settings.orphan_grace_s))
                    if g
                    else self._new(group)
                )
                slot = self._slots[group] = _Slot(g, version, freed_at=now)
            return slot

    def _known(self, group: str) -> _Slot:
        """The slot of a group that has a record; Refused (nothing created) for one that has none."""
        with self._lock:
            slot = self._slots.get(group)
        if slot is not None:
            return slot
        g, _ = self.store.load(group)
        if g is None:
            raise Refused(f"group {group} has no record: nobody has acquired it (Acquire it first)")
        return self._slot(group)

    def _new(self, group: str) -> Group:
        return Group(group, lease_ttl_s=self.settings.lease_ttl_s, max_hold_s=self.settings.max_hold_s)

    def _limits(self, g: Group) -> Group:
        """The record with this replica's maximum hold (the flag wins over what the record says)."""
        return (
            g
            if g.max_hold_s == self.settings.max_hold_s
            else dataclasses.replace(g, max_hold_s=self.settings.max_hold_s)
        )

    def _reload(self, s: _Slot) -> None:
        g, version = self.store.load(s.g.name)
        live = frozenset(j for j, n in s.live.items() if n > 0)
        s.g = (
            self._limits(state.adopt(g, live, self.clock(), self.settings.orphan_grace_s)) if g else self._new(s.g.name)
        )
        s.version = version

    def check_leader(self) -> None:
        if not self.leading():
            raise NotLeader("this orchestrator replica is not the leader; retry (the Service routes to the leader)")

    def wake(self, group: str) -> None:
        """Wake the group's waiters (a caller went away)."""
        with self._lock:
            s = self._slots.get(group)
        if s is not None:
            with s.cond:
                s.cond.notify_all()

    def _mutate(self, s: _Slot, fn: Callable[[Group], tuple[Group, T]], confirm: bool = False) -> T:
        """Apply ``fn`` and write the result over the version read; on a conflict reload and decide again.

        A refusal is re-decided once on a fresh read (the cache may be stale). With ``confirm`` an
        unchanged state is written too when ``fn`` returns something (a grant is never answered from
        a cache alone: the write checks the version).
        """
        fresh = False
        for _ in range(self.settings.cas_attempts):
            self.check_leader()
            try:
                new, out = fn(s.g)
            except Refused:
                if fresh:
                    raise
                self._reload(s)
                fresh = True
                continue
            if new == s.g and not (confirm and out is not None):
                return out
            version = self.store.save(new, s.version)
            if version is not None:
                s.g, s.version = new, version
                return out
            self._reload(s)
            fresh = True
        raise StoreContention(f"group {s.g.name}: {self.settings.cas_attempts} compare-and-swap conflicts in a row")

    def drop(self) -> None:
        """Forget every cached group (leadership lost) and wake every waiter."""
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for s in slots:
            with s.cond:
                s.cond.notify_all()

    # ------------------------------------------------------------------ steps

    def _expire(self, s: _Slot, g: Group, now: float) -> Group:
        out = state.expire(g, now)
        if out is not g and out.holder != g.holder:
            if g.held_too_long(now):
                self.metrics.max_hold_reached.labels(g.name).inc()
                log.info(
                    "maximum hold reached",
                    extra={"group": g.name, "job": g.holder, "token": g.token, "maxHoldS": g.max_hold_s},
                )
            else:
                self.metrics.lease_expiries.labels(g.name).inc()
                log.info("lease expired", extra={"group": g.name, "job": g.holder, "token": g.token})
            self.metrics.released(g.name, g.expiry())
            s.freed_at = g.expiry()
        return out

    def try_begin(self, group: str, job: str, role: str = "", priority: int = 0) -> Grant | None:
        """Queue ``job`` and grant it if it is next; the grant is written (``switching`` if state moves)."""
        s = self._slot(group)
        with s.cond:
            return self._begin(s, job, role, priority)

    def _begin(self, s: _Slot, job: str, role: str, priority: int) -> Grant | None:
        handed = s.pending.pop(job, None)
        if handed is not None and s.g.holder == job and s.g.token == handed.token:
            return handed  # the Yield that freed the group wrote this grant (compare-and-swap) already
        now = self.clock()
        switch_deadline = now + self.settings.switch_timeout_s

        def step(g: Group) -> tuple[Group, Grant | None]:
            g = self._expire(s, g, now)
            if g.holds(job, now):  # a retry by the holder (e.g. after an orchestrator restart)
                if g.switching:
                    return state.redo(g, now, switch_deadline)
                return state.renew(g, job, g.token, now), Grant(job, g.token, None, True)
            if g.waiting(job) is None and sum(w.live for w in g.waiters) >= self.settings.max_waiters:
                raise Busy(f"group {g.name} has {self.settings.max_waiters} waiters (--max-waiters); retry later")
            g = state.enqueue(g, job, role, priority, now)
            w = state.pick(g, now, self.settings.aging_s)
            if w is None or w.job != job:
                return g, None
            return state.grant(g, job, now, switch_deadline)

        return self._mutate(s, step, confirm=True)

    def finish(self, group: str, grant: Grant, deadline: float) -> HandoverOutcome:
        """Run the hand-over of a switching grant and write it settled, or rolled back (HandoverFailed)."""
        if grant.was_resident:
            return NoopOutcome()
        outcome = self.handover.switch(group, grant.token, grant.out_job, grant.job, deadline)
        s = self._slot(group)
        with s.cond:
            if outcome.ok:
                now = self.clock()
                self._mutate(s, lambda g: (state.settle(g, grant.job, grant.token, now), None))
                held = int(getattr(outcome, "suspended_bytes", 0) or 0)
                self.metrics.switched(group, grant.out_job, grant.job, held)
                return outcome
            self.metrics.handover_failures.labels(group).inc()
            self._mutate(s, lambda g: (state.fail_switch(g, grant.job, grant.token), None))
            s.freed_at = self.clock()
            s.cond.notify_all()
        raise HandoverFailed(
            f"hand-over of group {group} to {grant.job} (token {grant.token}) failed and was "
            f"rolled back: {outcome.error}"
        )

    # ------------------------------------------------------------------ the API

    def acquire(
        self,
        group: str,
        job: str,
        role: str = "",
        priority: int = 0,
        deadline: float | None = None,
        alive: Callable[[], bool] = lambda: True,
    ) -> AcquireResult:
        """Block until ``job`` holds ``group`` (DeadlineExceeded at ``deadline``, epoch seconds; Cancelled
        once ``alive()`` turns false)."""
        state.validate_name("group", group)
        state.validate_name("job", job)
        t0 = self.clock()
        end = deadline if deadline is not None else float("inf")
        s = self._slot(group)
        with s.cond:
            s.live[job] += 1
            self.metrics.waiters.labels(group).inc()
        try:
            grant, ready = self._wait_for_grant(group, job, role, priority, end, alive)
        finally:
            with s.cond:
                s.live[job] -= 1
                self.metrics.waiters.labels(group).dec()
        outcome = self.finish(group, grant, end)
        return self._delivered(group, job, role, grant, outcome, t0, ready)

    def _wait_for_grant(
        self, group: str, job: str, role: str, priority: int, end: float, alive: Callable[[], bool]
    ) -> tuple[Grant, float]:
        t0 = self.clock()
        while True:
            self.check_leader()
            s = self._slot(group)
            with s.cond:
                if not alive():
                    self._mutate(s, lambda g: (state.withdraw(g, job), None))
                    raise Cancelled(f"{job} went away while waiting for group {group}")
                grant = self._begin(s, job, role, priority)
                if grant is not None:
                    return grant, max(t0, s.freed_at)
                now = self.clock()
                if now >= end:
                    self._mutate(s, lambda g: (state.withdraw(g, job), None))
                    raise DeadlineExceeded(f"{job} was not granted group {group} before its deadline")
                s.cond.wait(timeout=max(0.0, min(end, s.g.expiry()) - now) + 0.001)

    def _delivered(
        self, group: str, job: str, role: str, grant: Grant, outcome: HandoverOutcome, t0: float, ready: float
    ) -> AcquireResult:
        now = self.clock()
        moved = int(getattr(outcome, "bytes_moved", 0) or 0)
        overhead = max(0.0, now - ready - outcome.suspend_s - outcome.restore_s)
        m = self.metrics
        m.wait.labels(group, job, role or "-").observe(now - t0)
        m.switch.labels(group, "suspend").observe(outcome.suspend_s)
        m.switch.labels(group, "restore").observe(outcome.restore_s)
        m.switch.labels(group, "grant_overhead").observe(overhead)
        m.bytes_moved.labels(group).inc(moved)
        m.grants.labels(group, "resident" if grant.was_resident else "switch").inc()
        m.held(group, now)
        log.info(
            "granted",
            extra={
                "group": group,
                "job": job,
                "token": grant.token,
                "outJob": grant.out_job,
                "wasResident": grant.was_resident,
                "waitS": round(now - t0, 4),
            },
        )
        return AcquireResult(
            grant.token,
            self._slot(group).g.lease_ttl_s,
            grant.was_resident,
            now - t0,
            outcome.suspend_s,
            outcome.restore_s,
            overhead,
            moved,
        )

    def yield_(self, group: str, job: str, token: int) -> None:
        """Give the group up; the next live waiter's grant is written in the same compare-and-swap."""
        s = self._known(group)
        with s.cond:
            now = self.clock()
            switch_deadline = now + self.settings.switch_timeout_s

            def step(g: Group) -> tuple[Group, Grant | None]:
                g = state.yield_(self._expire(s, g, now), job, token, now)
                w = state.pick(g, now, self.settings.aging_s)
                return state.grant(g, w.job, now, switch_deadline) if w is not None else (g, None)

            try:
                handed = self._mutate(s, step)
            except Refused:
                self.metrics.fencing_rejections.labels(group, "yield").inc()
                raise
            if handed is not None:
                s.pending[handed.job] = handed
            s.freed_at = now
            self.metrics.released(group, now)
            s.cond.notify_all()

    def renew(self, group: str, job: str, token: int) -> float:
        """Keep the holder's lease (never past the grant's maximum hold); the TTL left to it."""
        s = self._known(group)
        with s.cond:
            now = self.clock()
            try:
                self._mutate(s, lambda g: (state.renew(self._expire(s, g, now), job, token, now), None))
            except Refused:
                self.metrics.fencing_rejections.labels(group, "renew").inc()
                s.cond.notify_all()  # a hold that ended frees the group for its waiters now
                raise
            return min(s.g.lease_ttl_s, max(0.0, s.g.hold_ends() - now))

    def status(self, group: str) -> Group | None:
        """The group's record (an expired holder dropped); None for a group nobody acquired (nothing is
        created for it)."""
        with self._lock:
            s = self._slots.get(group)
        if s is None:
            g, _ = self.store.load(group)
            return state.expire(g, self.clock()) if g is not None else None
        with s.cond:
            return state.expire(s.g, self.clock())

    def groups(self) -> list[Group]:
        names = set(self.store.groups())
        with self._lock:
            names |= set(self._slots)
        return [g for g in (self.status(n) for n in sorted(names)) if g is not None]
