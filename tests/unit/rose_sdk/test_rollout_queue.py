"""The rollout queue's lease logic (rose_sdk.rollout_queue): pure, no clock, no I/O."""

from __future__ import annotations

import random

import pytest

from rose_sdk.rollout_queue import Completion, Prompt, PromptQueue, QueueError, completion_from_json, prompt_seed


def prompts(n: int, version: int = 0) -> list[Prompt]:
    return [Prompt(f"p{i}", f"text{i}", prompt_seed(7, f"p{i}", version)) for i in range(n)]


def done(q: PromptQueue, leases: list, text: str = "x") -> dict[str, int]:
    return q.complete(Completion(ls.prompt.id, ls.version, (1, 2), text) for ls in leases)


def test_seed_depends_on_job_prompt_and_version_only() -> None:
    s = prompt_seed(7, "g3-5", 3)
    assert s == prompt_seed(7, "g3-5", 3)
    assert 0 <= s < 2**63
    assert len({s, prompt_seed(8, "g3-5", 3), prompt_seed(7, "g3-6", 3), prompt_seed(7, "g3-5", 4)}) == 4


def test_lease_complete_take() -> None:
    q = PromptQueue(lease_s=10)
    q.submit(0, prompts(5))
    a = q.lease("a", 2, now=0)
    b = q.lease("b", 10, now=0)
    assert [ls.prompt.id for ls in a] == ["p0", "p1"] and [ls.prompt.id for ls in b] == ["p2", "p3", "p4"]
    assert q.lease("c", 1, now=0) == []
    assert done(q, a + b) == {"accepted": 5, "duplicate": 0, "stale": 0}
    assert q.round_done(0)
    assert sorted(q.take(0)) == [f"p{i}" for i in range(5)]
    c = q.counters
    assert (c.submitted, c.leased, c.accepted, c.duplicate, c.stale) == (5, 5, 5, 0, 0)


def test_second_completion_is_a_duplicate_and_a_taken_round_stale() -> None:
    q = PromptQueue()
    q.submit(0, prompts(2))
    a = q.lease("a", 2, now=0)
    assert done(q, a[:1]) == {"accepted": 1, "duplicate": 0, "stale": 0}
    assert done(q, a) == {"accepted": 1, "duplicate": 1, "stale": 0}
    q.take(0)
    assert done(q, a) == {"accepted": 0, "duplicate": 0, "stale": 2}
    assert q.complete([Completion("p0", 9, (), "")]) == {"accepted": 0, "duplicate": 0, "stale": 1}
    assert q.counters.accepted == 2 and q.counters.duplicate == 1 and q.counters.stale == 3


def test_release_requeues_at_the_front_in_order() -> None:
    q = PromptQueue()
    q.submit(0, prompts(4))
    a = q.lease("a", 2, now=0)
    q.lease("b", 1, now=0)
    assert q.release("a") == 2 and q.leases_of("a") == []
    assert [ls.prompt.id for ls in q.lease("c", 4, now=1)] == ["p0", "p1", "p3"]
    assert q.counters.requeued_release == 2
    assert a[0].prompt.seed == prompt_seed(7, "p0", 0)  # the same seed whoever leases it next


def test_disconnect_requeues_only_that_connections_leases() -> None:
    q = PromptQueue()
    q.submit(0, prompts(4))
    q.lease("a", 2, now=0, conn=1)
    q.lease("a", 1, now=0, conn=2)  # the same worker, reconnected
    assert q.disconnect(1) == 2
    assert q.leased_now == 1 and q.counters.requeued_disconnect == 2
    assert q.disconnect(1) == 0


def test_expiry_and_a_late_answer_from_the_expired_worker() -> None:
    q = PromptQueue(lease_s=5)
    q.submit(0, prompts(1))
    a = q.lease("a", 1, now=0)
    assert q.expire(now=4.9) == 0
    assert q.lease("b", 1, now=5.0)[0].prompt.id == "p0"  # expired at 5.0, leased again
    assert q.counters.requeued_expired == 1
    assert done(q, a)["accepted"] == 1  # the first answer wins, even from the expired lease
    assert q.lease("c", 1, now=6) == []
    assert done(q, a)["duplicate"] == 1  # b's answer, later: refused


def test_late_answer_while_requeued_removes_it_from_the_queue() -> None:
    q = PromptQueue()
    q.submit(0, prompts(2))
    a = q.lease("a", 2, now=0)
    q.release("a")
    done(q, a[:1])
    assert [ls.prompt.id for ls in q.lease("b", 5, now=1)] == ["p1"]


def test_a_lease_is_one_version() -> None:
    q = PromptQueue()
    q.submit(0, prompts(1, 0))
    q.submit(1, prompts(2, 1))
    got = q.lease("a", 5, now=0)
    assert [(ls.version, ls.prompt.id) for ls in got] == [(0, "p0")]
    assert {ls.version for ls in q.lease("a", 5, now=0)} == {1}
    assert q.outstanding() == {0: 1, 1: 2}


@pytest.mark.parametrize("seed", range(20))
def test_random_interleavings_lose_nothing_and_count_nothing_twice(seed: int) -> None:
    """Workers lease, answer (sometimes twice, sometimes late), release, die and hang at random:
    every prompt is accepted exactly once, and the counters add up."""
    rng = random.Random(seed)
    q = PromptQueue(lease_s=3)
    q.submit(0, prompts(40))
    held: dict[str, list] = {}
    answered: list = []
    now = 0.0
    while not q.round_done(0):
        now += rng.random()
        w = rng.choice("abcd")
        act = rng.random()
        if act < 0.4:
            held.setdefault(w, []).extend(q.lease(w, rng.randint(1, 4), now, conn=ord(w)))
        elif act < 0.7 and held.get(w):
            ls = held[w].pop(rng.randrange(len(held[w])))
            q.complete([Completion(ls.prompt.id, ls.version, (1,), "x", w)])
            answered.append(ls)
        elif act < 0.8:
            q.release(w)
            held[w] = []
        elif act < 0.9:
            q.disconnect(ord(w))
            held[w] = []
        elif answered:  # an answer sent again (a retried request)
            ls = rng.choice(answered)
            q.complete([Completion(ls.prompt.id, ls.version, (1,), "x")])
        q.expire(now)
    got = q.take(0)
    assert sorted(got) == sorted(p.id for p in prompts(40))
    c = q.counters
    assert c.accepted == 40 and c.submitted == 40
    requeued = c.requeued_release + c.requeued_disconnect + c.requeued_expired
    assert 40 <= c.leased <= 40 + requeued  # each requeue allows one more lease, no more
    assert c.duplicate + c.stale >= 0 and q.outstanding() == {}


def test_bad_input_is_refused_clearly() -> None:
    q = PromptQueue()
    with pytest.raises(QueueError, match="unique"):
        q.submit(0, [Prompt("a", "", 1), Prompt("a", "", 2)])
    with pytest.raises(QueueError, match="at least one"):
        q.submit(0, [])
    q.submit(0, prompts(1))
    with pytest.raises(QueueError, match="already has a round"):
        q.submit(0, prompts(1))
    with pytest.raises(QueueError, match="not done"):
        q.take(0)
    with pytest.raises(QueueError, match="at least 1"):
        q.lease("a", 0, now=0)
    with pytest.raises(QueueError, match="lease_s"):
        PromptQueue(lease_s=0)
    with pytest.raises(QueueError, match="'token_ids'"):
        completion_from_json({"id": "p0", "version": 0}, "w")
    with pytest.raises(QueueError, match="list of integers"):
        completion_from_json({"id": "p0", "version": 0, "token_ids": ["1"]}, "w")
