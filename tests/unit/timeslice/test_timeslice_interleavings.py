"""Never two holders, monotonic fencing: 1,000 seeded random interleavings of the orchestrator.

Two replicas (both believing they lead: the worst case leader election can leave for a lease
duration) share one store with the API server's compare-and-swap; clients acquire (in two steps,
so a crash can fall mid-hand-over), yield, renew, die silently, send late commands with their old
token; the clock jumps past leases; replicas crash (their memory is lost) and restart; hand-overs
fail and roll back. After every step: at most one client holds an unexpired grant, delivered
tokens strictly increase, and a command with a stale token is refused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from timeslice.orchestrator import (
    DeadlineExceeded,
    HandoverFailed,
    NoopOutcome,
    Orchestrator,
    Settings,
    StoreContention,
)
from timeslice.state import Grant, Group, Refused
from timeslice.store import MemoryStore

TTL = 5.0
JOBS = ("ns/a", "ns/b", "ns/c")
GROUP = "g"


@dataclass
class Clock:
    t: float = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FlakyHandover:
    rng: random.Random
    calls: list[tuple[int, str | None, str]] = field(default_factory=list)

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> NoopOutcome:
        self.calls.append((token, out_job, in_job))
        return NoopOutcome(ok=self.rng.random() > 0.1, error="node n2 refused", suspend_s=0.01, restore_s=0.01)


@dataclass
class Client:
    job: str
    token: int = 0  # the last token it was granted (kept after it lost the group: late commands)
    held_until: float = -1.0  # its own view: holds while now <= held_until
    pending: tuple[int, Grant] | None = None  # (replica, switching grant not finished)
    dead: bool = False


def _replica(store: MemoryStore, handover: FlakyHandover, clock: Clock) -> Orchestrator:
    return Orchestrator(store, handover, settings=Settings(lease_ttl_s=TTL, switch_timeout_s=TTL), clock=clock)


def _run(seed: int, steps: int = 80, store: MemoryStore | None = None) -> int:
    rng = random.Random(seed)
    clock = Clock()
    store = store or MemoryStore()
    handover = FlakyHandover(rng)
    replicas = [_replica(store, handover, clock) for _ in range(2)]
    clients = {j: Client(j) for j in JOBS}
    delivered: list[int] = []

    def deliver(c: Client, token: int) -> None:
        assert not delivered or token > delivered[-1], f"seed {seed}: token {token} after {delivered[-1]}"
        delivered.append(token)
        c.token, c.held_until, c.pending = token, clock.t + TTL, None

    for _ in range(steps):
        c = clients[rng.choice(JOBS)]
        r = rng.randrange(2)
        orch = replicas[r]
        op = rng.random()
        try:
            if op < 0.15:
                clock.t += rng.uniform(0, TTL * 1.2)
            elif op < 0.2:
                replicas[r] = _replica(store, handover, clock)  # crash and restart: memory lost
                for other in clients.values():
                    if other.pending and other.pending[0] == r:
                        other.pending = None  # its Acquire call failed with the connection
            elif c.dead:
                if op < 0.3:  # a dead holder's late command
                    _late(orch, c, store, seed)
            elif c.pending is not None:
                pr, grant = c.pending
                try:
                    replicas[pr].finish(GROUP, grant, clock.t + TTL)
                except HandoverFailed:
                    c.pending = None
                    continue
                deliver(c, grant.token)
            elif c.held_until >= clock.t:
                if op < 0.45:
                    orch.yield_(GROUP, c.job, c.token)
                    c.held_until = -1.0
                elif op < 0.7:
                    orch.renew(GROUP, c.job, c.token)
                    c.held_until = clock.t + TTL
                elif op < 0.75:
                    c.dead = True  # SIGKILL: it never speaks again with a live token
                    c.held_until = -1.0
            else:
                grant = orch.try_begin(GROUP, c.job, "trainer", rng.choice((0, 0, 1)))
                if grant is not None and grant.was_resident:
                    deliver(c, grant.token)
                elif grant is not None:
                    c.pending = (r, grant)
        except (Refused, StoreContention, DeadlineExceeded):
            c.held_until = -1.0 if c.held_until < clock.t else c.held_until
        holders = [x.job for x in clients.values() if x.held_until >= clock.t]
        assert len(holders) <= 1, f"seed {seed}: two holders at t={clock.t}: {holders}"
    return len(delivered)


def _late(orch: Orchestrator, c: Client, store: MemoryStore, seed: int) -> None:
    g, _ = store.load(GROUP)
    if g is None or c.token == 0 or (g.holder == c.job and g.token == c.token and not g.expired(orch.clock())):
        return
    with pytest.raises(Refused):
        orch.yield_(GROUP, c.job, c.token)
    with pytest.raises(Refused):
        orch.renew(GROUP, c.job, c.token)


def test_never_two_holders_over_1000_interleavings() -> None:
    grants = sum(_run(seed) for seed in range(1000))
    assert grants > 5000  # the interleavings do grant, not only refuse


class _NoCompareAndSwap(MemoryStore):
    """A broken store that writes over whatever version is there (last writer wins)."""

    def save(self, g: Group, version: str) -> str | None:
        _, current = self.load(g.name)
        return super().save(g, current)


def test_a_store_without_compare_and_swap_is_caught() -> None:
    """The check can fail: the same interleavings over a store without compare-and-swap find two holders."""
    failures = 0
    for seed in range(200):
        try:
            _run(seed, store=_NoCompareAndSwap())
        except (AssertionError, pytest.fail.Exception):  # two holders, or a stale command obeyed
            failures += 1
    assert failures > 0
