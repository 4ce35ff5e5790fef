"""The orchestrator over real gRPC on loopback (memory store, the explicit no-op hand-over). A
group is resolved in its job's namespace: group "g" of job "ns/a" has the key "ns/g"."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from timeslice.orchestrator import NoopOutcome, Orchestrator, Settings
from timeslice.server import grpc_server, http_server
from timeslice.store import MemoryStore


class RecordingHandover:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str | None, str]] = []
        self.fail = False

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> NoopOutcome:
        self.calls.append((token, out_job, in_job))
        if self.fail:
            return NoopOutcome(ok=False, error="node kwok-1 did not suspend")
        return NoopOutcome(suspend_s=0.002, restore_s=0.003, bytes_moved=1 << 20)


@pytest.fixture
def served() -> Iterator[tuple[pb_grpc.TimeSliceOrchestratorStub, Orchestrator, RecordingHandover]]:
    handover = RecordingHandover()
    orch = Orchestrator(MemoryStore(), handover, settings=Settings(lease_ttl_s=30.0))
    server, port = grpc_server(orch, "127.0.0.1:0", 32)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.TimeSliceOrchestratorStub(channel), orch, handover
    channel.close()
    server.stop(grace=None).wait()


def _acquire(stub: pb_grpc.TimeSliceOrchestratorStub, job: str, timeout: float = 10.0) -> pb.AcquireResponse:
    resp: pb.AcquireResponse = stub.Acquire(pb.AcquireRequest(group="g", job=job, role="trainer"), timeout=timeout)
    return resp


def test_acquire_yield_hand_over_and_lazy_eviction(served) -> None:  # type: ignore[no-untyped-def]
    stub, _, handover = served
    a1 = _acquire(stub, "ns/a")
    assert (a1.fencing_token, a1.was_resident) == (1, False)
    got: list[pb.AcquireResponse] = []
    t = threading.Thread(target=lambda: got.append(_acquire(stub, "ns/b")))
    t.start()
    # b waits: the status shows it queued behind the holder
    for _ in range(200):
        st = stub.Status(pb.StatusRequest(group="ns/g"))
        if st.waiters:
            break
        threading.Event().wait(0.01)
    assert st.holder == "ns/a" and [w.job for w in st.waiters] == ["ns/b"]
    stub.Yield(pb.YieldRequest(group="g", job="ns/a", fencing_token=1))
    t.join(10)
    assert got and got[0].fencing_token == 2 and not got[0].was_resident
    assert got[0].suspend_s == pytest.approx(0.002) and got[0].restore_s == pytest.approx(0.003)
    assert handover.calls[-1] == (2, "ns/a", "ns/b")
    stub.Yield(pb.YieldRequest(group="g", job="ns/b", fencing_token=2))
    again = _acquire(stub, "ns/b")  # nobody else waited: b's state is still resident
    assert again.was_resident and again.fencing_token == 3
    assert len(handover.calls) == 2


def test_stale_token_is_refused_with_a_clear_message(served) -> None:  # type: ignore[no-untyped-def]
    stub, _, _ = served
    _acquire(stub, "ns/a")
    with pytest.raises(grpc.RpcError) as e:
        stub.Yield(pb.YieldRequest(group="g", job="ns/a", fencing_token=7))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "fencing token 7 refused" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Renew(pb.RenewRequest(group="g", job="ns/b", fencing_token=1))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_deadline_withdraws_the_request(served) -> None:  # type: ignore[no-untyped-def]
    stub, orch, _ = served
    _acquire(stub, "ns/a")
    with pytest.raises(grpc.RpcError) as e:
        _acquire(stub, "ns/b", timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(200):  # the server side withdraws once it sees the deadline
        if not orch.status("ns/g").waiters:
            break
        threading.Event().wait(0.01)
    assert orch.status("ns/g").waiters == ()


def test_failed_hand_over_rolls_back_and_reports(served) -> None:  # type: ignore[no-untyped-def]
    stub, orch, handover = served
    _acquire(stub, "ns/a")
    stub.Yield(pb.YieldRequest(group="g", job="ns/a", fencing_token=1))
    handover.fail = True
    with pytest.raises(grpc.RpcError) as e:
        _acquire(stub, "ns/b")
    assert e.value.code() == grpc.StatusCode.ABORTED and "did not suspend" in e.value.details()
    g = orch.status("ns/g")
    assert (g.holder, g.resident) == ("", "ns/a")


def test_bad_names_are_invalid_argument(served) -> None:  # type: ignore[no-untyped-def]
    stub, _, _ = served
    with pytest.raises(grpc.RpcError) as e:
        stub.Acquire(pb.AcquireRequest(group="", job="ns/a"), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "group must be" in e.value.details()


def test_not_leader_is_unavailable_and_not_ready() -> None:
    orch = Orchestrator(MemoryStore(), leading=lambda: False)
    server, port = grpc_server(orch, "127.0.0.1:0", 8)
    http = http_server(orch, ("127.0.0.1", 0))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError) as e:
            pb_grpc.TimeSliceOrchestratorStub(ch).Acquire(pb.AcquireRequest(group="g", job="a"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(urllib.error.HTTPError) as h:
            urllib.request.urlopen(f"http://127.0.0.1:{http.server_address[1]}/readyz", timeout=5)
        assert h.value.code == 503
        h.value.close()
    finally:
        http.shutdown()
        http.server_close()
        server.stop(grace=None).wait()


def test_metrics_count_grants_and_fencing(served) -> None:  # type: ignore[no-untyped-def]
    stub, orch, _ = served
    _acquire(stub, "ns/a")
    with pytest.raises(grpc.RpcError):
        stub.Yield(pb.YieldRequest(group="g", job="ns/a", fencing_token=9))
    reg = orch.metrics.registry
    assert reg.get_sample_value("rose_timeslice_grants_total", {"group": "ns/g", "kind": "switch"}) == 1
    assert reg.get_sample_value("rose_timeslice_fencing_rejections_total", {"group": "ns/g", "command": "yield"}) == 1
    assert reg.get_sample_value("rose_timeslice_bytes_moved_total", {"group": "ns/g"}) == 1 << 20
