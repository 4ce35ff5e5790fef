"""Caller identity: ServiceAccount token → namespace → the jobs it may name."""

from __future__ import annotations

import pytest

from timeslice.identity import (
    Forbidden,
    ReviewCache,
    Unauthenticated,
    bearer,
    check_job,
    check_member,
    member,
    namespace_of,
)


def test_bearer_token_from_metadata() -> None:
    assert bearer([("x", "y"), ("authorization", "Bearer abc")]) == "abc"
    with pytest.raises(Unauthenticated, match="projected ServiceAccount token"):
        bearer([("authorization", "Basic abc")])


def test_only_service_accounts_and_their_namespace() -> None:
    assert namespace_of("system:serviceaccount:team-a:trainer") == "team-a"
    with pytest.raises(Unauthenticated, match="not a ServiceAccount"):
        namespace_of("alice")
    check_job("team-a/grpo", "team-a")
    with pytest.raises(Forbidden, match="outside the caller's namespace 'team-a'"):
        check_job("team-b/grpo", "team-a")
    with pytest.raises(Forbidden, match="namespace/name"):
        check_job("grpo", "team-a")


def test_review_cache_keeps_verdicts_for_its_ttl() -> None:
    calls: list[str] = []
    now = [0.0]

    def review(token: str) -> str:
        calls.append(token)
        if token == "bad":
            raise Unauthenticated("refused")
        return "system:serviceaccount:ns:sa"

    cache = ReviewCache(review, lambda: now[0], ttl_s=10.0, size=2)
    assert cache.namespace("t") == cache.namespace("t") == "ns"
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            cache.namespace("bad")
    assert calls == ["t", "bad"]
    now[0] = 11.0
    cache.namespace("t")
    assert calls == ["t", "bad", "t"]


def test_membership_is_by_the_jobs_namespace() -> None:
    assert member(["team-a/grpo", ""], "team-a")
    assert not member(["team-b/grpo", "team-a"], "team-a")  # a plain name is in no namespace
    check_member("g", ["team-b/x", "team-a/y"], "team-a")
    with pytest.raises(Forbidden, match="group 'g' has no job of the caller's namespace 'team-a'"):
        check_member("g", ["team-b/x"], "team-a")
