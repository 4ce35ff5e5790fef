"""The pure group state machine and the Lease codec."""

from __future__ import annotations

import pytest

from rose_common.timeslice_lease import lease_name
from timeslice import state
from timeslice.state import Group, Refused
from timeslice.store import MemoryStore, from_lease, lease_of, to_lease


def _queued(*jobs: tuple[str, int, float]) -> Group:
    g = Group("g", holder="x", token=1, renewed=0.0, lease_ttl_s=1000)
    for job, prio, t in jobs:
        g = state.enqueue(g, job, "", prio, t)
    return state.yield_(g, "x", 1, 1.0)


def test_fifo_among_equal_priorities() -> None:
    g = _queued(("a", 0, 1.0), ("b", 0, 2.0))
    assert state.pick(g, 3.0).job == "a"  # type: ignore[union-attr]


def test_priority_first_but_aging_prevents_starvation() -> None:
    g = _queued(("old", 0, 0.0), ("vip", 2, 5.0))
    assert state.pick(g, 6.0, aging_s=10.0).job == "vip"  # type: ignore[union-attr]
    # after 30 s of waiting the old request outranks a fresh priority-2 one
    g = state.enqueue(state.withdraw(g, "vip"), "vip", "", 2, 30.0)
    assert state.pick(g, 30.0, aging_s=10.0).job == "old"  # type: ignore[union-attr]


def test_lazy_eviction_and_a_token_per_grant() -> None:
    g = Group("g")
    g, first = state.grant(state.enqueue(g, "a", "", 0, 0.0), "a", 0.0)
    assert (first.token, first.out_job, first.was_resident) == (1, None, False)
    g = state.settle(g, "a", 1, 0.0)
    g = state.yield_(g, "a", 1, 1.0)
    assert g.resident == "a" and not g.holder
    g, again = state.grant(state.enqueue(g, "a", "", 0, 2.0), "a", 2.0)
    assert (again.token, again.out_job, again.was_resident) == (2, None, True)
    g = state.yield_(g, "a", 2, 3.0)
    g, other = state.grant(state.enqueue(g, "b", "", 0, 4.0), "b", 4.0)
    assert (other.token, other.out_job, other.was_resident) == (3, "a", False)


def test_expired_holder_is_fenced() -> None:
    g = Group("g", lease_ttl_s=5.0, holder="a", token=4, renewed=10.0, resident="a")
    assert state.pick(state.enqueue(g, "b", "", 0, 11.0), 12.0) is None
    with pytest.raises(Refused, match="lease on g expired"):
        state.renew(g, "a", 4, 15.5)
    with pytest.raises(Refused, match="fencing token 3 refused"):
        state.yield_(g, "a", 3, 11.0)
    assert state.expire(g, 15.5).holder == ""


def test_rollback_restores_the_previous_resident() -> None:
    g = Group("g", token=2, resident="a")
    g, gr = state.grant(state.enqueue(g, "b", "", 0, 1.0), "b", 1.0)
    g = state.fail_switch(g, "b", gr.token)
    assert (g.holder, g.resident, g.token) == ("", "a", 3)


def test_lease_codec_round_trip() -> None:
    g = Group(
        "ns/trainer-group",
        lease_ttl_s=2.5,
        holder="ns/a",
        holder_role="trainer",
        token=9,
        renewed=1.7e9 + 0.25,
        resident="ns/a",
        previous="ns/b",
        switching=True,
        switch_deadline=1.7e9 + 60,
        waiters=(state.Waiter("ns/c", "sampler", 1.7e9, 1),),
        max_hold_s=600.0,
        granted=1.7e9,
    )
    doc = to_lease(g, "rose-system")
    assert doc["spec"]["leaseTransitions"] == 9 and doc["spec"]["leaseDurationSeconds"] == 3
    assert doc["metadata"]["name"] == lease_name("trainer-group", "ns") == lease_of("ns/trainer-group")
    assert doc["metadata"]["name"].startswith("ts-ns-trainer-group-")
    assert doc["metadata"]["labels"] == {"rose.io/timeslice-group": "trainer-group"}
    assert from_lease(doc) == g


def test_group_names_are_labels_and_leases_never_collide() -> None:
    """Low of issue 22: ``Team_A`` is refused (before: aliased to team-a's Lease), a name over 63
    characters is refused (before: it broke the Lease's label), and two groups whose readable
    names coincide get two Leases (a hash of the key)."""
    assert state.group_key("team-a", "ns") == "ns/team-a"
    for bad in ("Team_A", "a" * 64, "-a", "a b"):
        with pytest.raises(ValueError, match="DNS-1123 label"):
            state.group_key(bad, "ns")
    with pytest.raises(PermissionError, match="belongs to namespace 'other'"):
        state.group_key("other/g", "ns")
    assert lease_of("a-b/c") != lease_of("a/b-c")
    longest = lease_of(f"{'n' * 63}/{'g' * 63}")
    assert len(longest) <= 63 and longest != lease_of(f"{'n' * 63}/{'g' * 62}h")
    assert len(to_lease(Group(f"{'n' * 63}/{'g' * 63}"), "x")["metadata"]["labels"]["rose.io/timeslice-group"]) == 63


def test_max_hold_ends_a_grant_however_often_it_is_renewed() -> None:
    g, _ = state.grant(state.enqueue(Group("g", lease_ttl_s=10.0, max_hold_s=30.0), "a", "", 0, 0.0), "a", 0.0)
    g = state.settle(g, "a", 1, 0.0)  # the hold counts from the settled hand-over
    for t in range(5, 30, 5):
        g = state.renew(g, "a", 1, float(t))
    assert g.holds("a", 29.0) and not g.holds("a", 30.5) and g.held_too_long(30.5)
    with pytest.raises(state.Refused, match="maximum hold of 30s"):
        state.renew(g, "a", 1, 31.0)


def test_unreadable_lease_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not a timeslice group"):
        from_lease({"metadata": {"name": "other"}, "spec": {}})


def test_memory_store_refuses_a_stale_version() -> None:
    s = MemoryStore()
    v1 = s.save(Group("g"), "")
    assert v1 and s.save(Group("g", token=1), v1)
    assert s.save(Group("g", token=2), v1) is None
    assert s.save(Group("g"), "") is None
