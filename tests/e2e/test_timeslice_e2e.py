"""The orchestrator as real processes over the local cluster's real kube-apiserver (Leases).

A holder process SIGKILLed: the next waiter is granted once the holder's lease expires (the
waiter's own deadline is twice the TTL), and the dead holder's late Yield and Renew are refused
by fencing. The orchestrator SIGKILLed mid-hand-over and restarted: the hand-over is redone with
a newer token and one job holds. Two replicas: only the leader grants; the other answers
UNAVAILABLE and is not ready until the leader dies. Caller identity through the real TokenReview:
a ServiceAccount token admits its namespace's job and reads its group's Status; another namespace's
job, a missing or forged token, and another group's Status are refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from local_cluster import ClusterHandle, free_port
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
TTL = 3.0
HOLDER = """
import sys, grpc
from rose_common.proto import rose_timeslice_v1_pb2 as pb, rose_timeslice_v1_pb2_grpc as pb_grpc
stub = pb_grpc.TimeSliceOrchestratorStub(grpc.insecure_channel(sys.argv[1]))
r = stub.Acquire(pb.AcquireRequest(group=sys.argv[2], job=sys.argv[3], role="trainer"), timeout=60)
print(r.fencing_token, flush=True)
sys.stdin.read()  # holds (never renews) until killed
"""


class Orch:
    def __init__(self, cluster: ClusterHandle, tmp: Path, name: str, lease: str, *extra: str) -> None:
        self.port, self.mport = free_port(), free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log = tmp / f"{name}.log"
        self.args = [sys.executable, "-m", "timeslice", "serve", "--store", "kubernetes", "--kubeconfig",
                     str(cluster.kubeconfig), "--namespace", "default", "--lease-ttl", str(TTL), "--lease-name", lease,
                     "--lease-duration", "3", "--lease-renew", "0.5", "--identity", name, "--listen", self.target,
                     "--metrics-listen", f"127.0.0.1:{self.mport}", *extra]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Orch:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, stop: threading.Event | None = None) -> None:
        ev = stop or threading.Event()
        for _ in range(600):
            if self.ready():
                return
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
            ev.wait(0.05)
        raise AssertionError(f"orchestrator never became ready:\n{self.log.read_text()[-2000:]}")

    def stub(self) -> pb_grpc.TimeSliceOrchestratorStub:
        return pb_grpc.TimeSliceOrchestratorStub(grpc.insecure_channel(self.target))


@contextmanager
def orchestrators(*orchs: Orch) -> Iterator[None]:
    try:
        yield
    finally:
        for o in orchs:
            o.kill()


def _lease(api: Any, group: str) -> dict[str, Any]:
    from kubernetes import client

    lease = client.CoordinationV1Api(api).read_namespaced_lease(f"ts-{group}", "default")
    return {"holder": lease.spec.holder_identity or "", "token": lease.spec.lease_transitions or 0,
            "switching": (lease.metadata.annotations or {}).get("rose.io/timeslice-switching")}  # fmt: skip


def _group() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


def test_sigkilled_holder_is_fenced_and_the_waiter_granted(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    orch = Orch(cluster, tmp_path, "orch-a", f"ts-leader-{uuid.uuid4().hex[:6]}").start()
    group = _group()
    with orchestrators(orch):
        orch.wait_ready()
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, orch.target, group, "ns/dead"], cwd=REPO,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)  # fmt: skip
        assert holder.stdout is not None
        dead_token = int(holder.stdout.readline())
        stub = orch.stub()
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(stub.Acquire(
            pb.AcquireRequest(group=group, job="ns/next", role="sampler"), timeout=2 * TTL)))  # fmt: skip
        waiter.start()
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        holder.stdout.close()
        assert holder.stdin is not None
        holder.stdin.close()
        waiter.join(4 * TTL)
        assert got, (
            f"the waiter was not granted before its deadline (2 x the lease TTL)\n{orch.log.read_text()[-2000:]}"
        )
        assert got[0].fencing_token == dead_token + 1
        for call, req in ((stub.Yield, pb.YieldRequest), (stub.Renew, pb.RenewRequest)):
            with pytest.raises(grpc.RpcError) as e:
                call(req(group=group, job="ns/dead", fencing_token=dead_token), timeout=10)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"fencing token {dead_token} refused" in e.value.details()
        assert _lease(api, group) == {"holder": "ns/next", "token": dead_token + 1, "switching": "false"}
        with urllib.request.urlopen(f"http://127.0.0.1:{orch.mport}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert f'rose_timeslice_lease_expiries_total{{group="{group}"}} 1.0' in metrics
        assert f'rose_timeslice_fencing_rejections_total{{command="yield",group="{group}"}} 1.0' in metrics


def _acquire_retrying(stub_of: Any, group: str, job: str, timeout: float) -> Any:
    """What the SDK does: retry on UNAVAILABLE (an orchestrator restart)."""
    stop = threading.Event()
    for _ in range(400):
        try:
            return stub_of().Acquire(pb.AcquireRequest(group=group, job=job), timeout=timeout)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            stop.wait(0.1)
    raise AssertionError("the orchestrator never came back")


def _until(check: Any, what: str, tries: int = 400) -> Any:
    ev = threading.Event()
    for _ in range(tries):
        out = check()
        if out:
            return out
        ev.wait(0.05)
    raise AssertionError(f"never: {what}")


def test_orchestrator_killed_mid_hand_over_restarts_with_one_holder(cluster: ClusterHandle, api: Any,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    orch = Orch(cluster, tmp_path, "orch-1", f"ts-leader-{uuid.uuid4().hex[:6]}", "--handover", "delay",
                "--handover-delay", "2s").start()  # fmt: skip
    group = _group()
    with orchestrators(orch):
        orch.wait_ready()
        a = orch.stub().Acquire(pb.AcquireRequest(group=group, job="ns/a"), timeout=60)
        orch.stub().Yield(pb.YieldRequest(group=group, job="ns/a", fencing_token=a.fencing_token), timeout=10)
        got_b: list[Any] = []
        b = threading.Thread(target=lambda: got_b.append(_acquire_retrying(orch.stub, group, "ns/b", 60)))
        b.start()

        def switching_to_b() -> dict[str, Any] | None:
            x = _lease(api, group)
            return x if x["switching"] == "true" and x["holder"] == "ns/b" else None

        mid = _until(switching_to_b, "the hand-over to ns/b started")
        orch.kill()  # SIGKILL mid-hand-over
        orch.start()  # the same replica restarts
        orch.wait_ready()
        with pytest.raises(grpc.RpcError) as e:  # a may not be granted while b's hand-over is redone and held
            _acquire_retrying(orch.stub, group, "ns/a", TTL)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        b.join(60)
        assert got_b and got_b[0].fencing_token > mid["token"], "the redone hand-over has a newer token"
        final = _lease(api, group)
        assert final == {"holder": "ns/b", "token": got_b[0].fencing_token, "switching": "false"}


def test_two_replicas_only_the_leader_grants(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    lease = f"ts-leader-{uuid.uuid4().hex[:6]}"
    one = Orch(cluster, tmp_path, "replica-1", lease).start()
    two = Orch(cluster, tmp_path, "replica-2", lease)
    group = _group()
    with orchestrators(one, two):
        one.wait_ready()
        two.start()
        _until(lambda: two.proc is not None and _metrics_up(two), "replica-2 serves /metrics")
        assert not two.ready()
        with pytest.raises(grpc.RpcError) as e:
            two.stub().Acquire(pb.AcquireRequest(group=group, job="ns/x"), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "not the leader" in e.value.details()
        x = one.stub().Acquire(pb.AcquireRequest(group=group, job="ns/x"), timeout=30)
        one.kill()
        two.wait_ready()  # takes over once the leader Lease expires
        # the group record is the Lease: x still holds until its TTL, then y is granted with the next token
        y = two.stub().Acquire(pb.AcquireRequest(group=group, job="ns/y"), timeout=6 * TTL)
        assert y.fencing_token == x.fencing_token + 1
        assert _lease(api, group)["holder"] == "ns/y"


def _metrics_up(o: Orch) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{o.mport}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_callers_are_checked_by_token_review(cluster: ClusterHandle, api: Any, tmp_path: Path) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    sa = f"ts-caller-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account("default", {"metadata": {"name": sa}})
    req = {"spec": {"audiences": ["rose-timeslice"], "expirationSeconds": 600}}
    token = core.create_namespaced_service_account_token(sa, "default", req).status.token
    orch = Orch(cluster, tmp_path, "orch-auth", f"ts-leader-{uuid.uuid4().hex[:6]}", "--authenticate",
                "tokenreview", "--token-audience", "rose-timeslice").start()  # fmt: skip
    group = _group()
    with orchestrators(orch):
        orch.wait_ready()
        stub = orch.stub()
        ok = [("authorization", f"Bearer {token}")]
        r = stub.Acquire(pb.AcquireRequest(group=group, job="default/x"), timeout=30, metadata=ok)
        stub.Yield(pb.YieldRequest(group=group, job="default/x", fencing_token=r.fencing_token), metadata=ok)
        for job, metadata, code in (("other/x", ok, grpc.StatusCode.PERMISSION_DENIED),
                                    ("default/x", [], grpc.StatusCode.UNAUTHENTICATED),
                                    ("default/x", [("authorization", "Bearer forged")],
                                     grpc.StatusCode.UNAUTHENTICATED)):  # fmt: skip
            with pytest.raises(grpc.RpcError) as e:
                stub.Acquire(pb.AcquireRequest(group=group, job=job), timeout=30, metadata=metadata)
            assert e.value.code() == code, e.value.details()
        # Status and ListGroups: the same token; the group of a job of its namespace only
        assert stub.Status(pb.StatusRequest(group=group), timeout=30, metadata=ok).resident == "default/x"
        assert [g.group for g in stub.ListGroups(pb.ListGroupsRequest(), timeout=30, metadata=ok).groups] == [group]
        with pytest.raises(grpc.RpcError) as e:
            stub.Status(pb.StatusRequest(group=group), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Status(pb.StatusRequest(group=_group()), timeout=30, metadata=ok)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
