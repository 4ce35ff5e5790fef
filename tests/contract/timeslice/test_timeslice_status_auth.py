"""Status and ListGroups with caller identity on, over real gRPC on loopback (memory store).

The TokenReview is the one stand-in: ``review`` maps two fixed tokens to ServiceAccount
usernames, as the API server's TokenReview would (tests/e2e/timeslice/test_timeslice_e2e.py uses the real
one). An anonymous Status or ListGroups is UNAUTHENTICATED; a caller reads only the groups one of
its namespace's jobs is in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from timeslice.identity import ReviewCache, Unauthenticated
from timeslice.orchestrator import NoopHandover, Orchestrator
from timeslice.server import grpc_server
from timeslice.store import MemoryStore

USERS = {"tok-a": "system:serviceaccount:team-a:trainer", "tok-b": "system:serviceaccount:team-b:trainer"}
A = [("authorization", "Bearer tok-a")]
B = [("authorization", "Bearer tok-b")]


def _review(token: str) -> str:
    if token not in USERS:
        raise Unauthenticated("the API server refused the token")
    return USERS[token]


@pytest.fixture
def stub() -> Iterator[pb_grpc.TimeSliceOrchestratorStub]:
    orch = Orchestrator(MemoryStore(), NoopHandover())
    server, port = grpc_server(orch, "127.0.0.1:0", 16, ReviewCache(_review, time.monotonic))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.TimeSliceOrchestratorStub(channel)  # type: ignore[no-untyped-call]
    channel.close()
    server.stop(grace=None).wait()


def _code(call: object, request: object, metadata: list[tuple[str, str]]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=10, metadata=metadata)  # type: ignore[operator]
    return e.value.code(), e.value.details()


def test_anonymous_status_and_list_groups_are_refused(stub: pb_grpc.TimeSliceOrchestratorStub) -> None:
    stub.Acquire(pb.AcquireRequest(group="g", job="team-a/grpo"), timeout=10, metadata=A)
    for call, req in ((stub.Status, pb.StatusRequest(group="g")), (stub.ListGroups, pb.ListGroupsRequest())):
        code, details = _code(call, req, [])
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "no 'authorization: Bearer <token>' metadata" in details
        code, details = _code(call, req, [("authorization", "Bearer forged")])
        assert (code, details) == (grpc.StatusCode.UNAUTHENTICATED, "the API server refused the token")


def test_a_caller_reads_only_its_namespaces_groups(stub: pb_grpc.TimeSliceOrchestratorStub) -> None:
    stub.Acquire(pb.AcquireRequest(group="g-a", job="team-a/grpo"), timeout=10, metadata=A)
    stub.Acquire(pb.AcquireRequest(group="g-b", job="team-b/ppo"), timeout=10, metadata=B)
    st = stub.Status(pb.StatusRequest(group="g-a"), timeout=10, metadata=A)
    assert (st.group, st.holder, st.fencing_token) == ("team-a/g-a", "team-a/grpo", 1)
    code, details = _code(stub.Status, pb.StatusRequest(group="g-b"), A)  # team-a's g-b: nobody acquired it
    assert code == grpc.StatusCode.NOT_FOUND and "group team-a/g-b has no record" in details
    code, details = _code(stub.Status, pb.StatusRequest(group="team-b/g-b"), A)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "group 'team-b/g-b' belongs to namespace 'team-b'" in details
    listed = stub.ListGroups(pb.ListGroupsRequest(), timeout=10, metadata=A)
    assert [g.group for g in listed.groups] == ["team-a/g-a"]
    assert [g.group for g in stub.ListGroups(pb.ListGroupsRequest(), timeout=10, metadata=B).groups] == ["team-b/g-b"]
