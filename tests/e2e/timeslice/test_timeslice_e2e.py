"""The orchestrator as real processes over the local cluster's real kube-apiserver (Leases), run as
in a cluster: TLS, callers authenticated by the real TokenReview, jobs checked against their real
worker pods (each test's jobs have member pods in a namespace of its own).

A holder process SIGKILLed: the next waiter is granted once the holder's lease expires (the
waiter's own deadline is twice the TTL), and the dead holder's late Yield and Renew are refused
by fencing. The orchestrator SIGKILLed mid-hand-over and restarted: the hand-over is redone with
a newer token and one job holds. Two replicas: only the leader grants; the other answers
UNAVAILABLE and is not ready until the leader dies. Caller identity through the real TokenReview:
a ServiceAccount token admits its namespace's job and reads its group's Status; another namespace's
job, a missing or forged token, and another group's Status are refused. Issue 22: two namespaces'
groups of one name are two groups (two Leases), a job without pods takes no place, the request's
priority is ignored for the pods' PriorityClass, and the plaintext port of an old client gets nowhere.
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
from local_cluster.objects import delete_namespace, new_namespace
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from rose_common.timeslice_lease import lease_name
from tests.support import timeslice_secure as sec

REPO = Path(__file__).resolve().parents[3]
TTL = 3.0
HOLDER = """
import sys, grpc
from rose_common.proto import rose_timeslice_v1_pb2 as pb, rose_timeslice_v1_pb2_grpc as pb_grpc
creds = grpc.ssl_channel_credentials(root_certificates=open(sys.argv[4], "rb").read())
stub = pb_grpc.TimeSliceOrchestratorStub(grpc.secure_channel(sys.argv[1], creds))
r = stub.Acquire(pb.AcquireRequest(group=sys.argv[2], job=sys.argv[3], role="trainer"), timeout=60,
                 metadata=[("authorization", "Bearer " + sys.argv[5])])
print(r.fencing_token, flush=True)
sys.stdin.read()  # holds (never renews) until killed
"""


class Tenant:
    """A namespace of the test's own, a ServiceAccount token of it, and member pods of its jobs."""

    def __init__(self, api: Any, prefix: str = "ts") -> None:
        self.api = api
        self.ns = new_namespace(api, prefix)
        self.token = sec.sa_token(api, self.ns)
        self.md = sec.bearer(self.token)

    def job(self, name: str, group: str, priority_class: str = "") -> str:
        sec.member_pod(self.api, self.ns, name, group, priority_class)
        return f"{self.ns}/{name}"

    def close(self) -> None:
        delete_namespace(self.api, self.ns)


@pytest.fixture
def tenant(api: Any) -> Iterator[Tenant]:
    t = Tenant(api)
    yield t
    t.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sec.tls_files(tmp_path_factory.mktemp("ts-tls"))


class Orch:
    def __init__(self, cluster: ClusterHandle, tmp: Path, name: str, lease: str, *extra: str, tls: Any) -> None:
        self.port, self.mport = free_port(), free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.tls = tls
        self.log = tmp / f"{name}.log"
        self.args = [sys.executable, "-m", "timeslice", "serve", "--store", "kubernetes", "--kubeconfig",
                     str(cluster.kubeconfig), "--namespace", "default", "--lease-ttl", str(TTL), "--lease-name", lease,
                     "--lease-duration", "3", "--lease-renew", "0.5", "--identity", name, "--listen", self.target,
                     "--metrics-listen", f"127.0.0.1:{self.mport}", *sec.tls_flags(tls), *extra]  # fmt: skip
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
        return sec.stub(self.target, self.tls)


@contextmanager
def orchestrators(*orchs: Orch) -> Iterator[None]:
    try:
        yield
    finally:
        for o in orchs:
            o.kill()


def _lease(api: Any, group: str, ns: str) -> dict[str, Any]:
    from kubernetes import client

    lease = client.CoordinationV1Api(api).read_namespaced_lease(lease_name(group, ns), "default")
    return {
        "holder": lease.spec.holder_identity or "",
        "token": lease.spec.lease_transitions or 0,
        "switching": (lease.metadata.annotations or {}).get("rose.io/timeslice-switching"),
    }


def _group() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


def test_sigkilled_holder_is_fenced_and_the_waiter_granted(
    cluster: ClusterHandle, api: Any, tmp_path: Path, tenant: Tenant, tls: Any
) -> None:
    orch = Orch(cluster, tmp_path, "orch-a", f"ts-leader-{uuid.uuid4().hex[:6]}", tls=tls).start()
    group = _group()
    dead, nxt, md = tenant.job("dead", group), tenant.job("next", group), tenant.md
    with orchestrators(orch):
        orch.wait_ready()
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, orch.target, group, dead, str(tls.ca), tenant.token],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert holder.stdout is not None
        dead_token = int(holder.stdout.readline())
        stub = orch.stub()
        got: list[Any] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                stub.Acquire(pb.AcquireRequest(group=group, job=nxt, role="sampler"), timeout=2 * TTL, metadata=md)
            )
        )
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
                call(req(group=group, job=dead, fencing_token=dead_token), timeout=10, metadata=md)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"fencing token {dead_token} refused" in e.value.details()
        assert _lease(api, group, tenant.ns) == {"holder": nxt, "token": dead_token + 1, "switching": "false"}
        with urllib.request.urlopen(f"http://127.0.0.1:{orch.mport}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        key = f"{tenant.ns}/{group}"
        assert f'rose_timeslice_lease_expiries_total{{group="{key}"}} 1.0' in metrics
        assert f'rose_timeslice_fencing_rejections_total{{command="yield",group="{key}"}} 1.0' in metrics


def _acquire_retrying(stub_of: Any, group: str, job: str, timeout: float, md: Any) -> Any:
    """What the SDK does: retry on UNAVAILABLE (an orchestrator restart)."""
    stop = threading.Event()
    for _ in range(400):
        try:
            return stub_of().Acquire(pb.AcquireRequest(group=group, job=job), timeout=timeout, metadata=md)
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


def test_orchestrator_killed_mid_hand_over_restarts_with_one_holder(
    cluster: ClusterHandle, api: Any, tmp_path: Path, tenant: Tenant, tls: Any
) -> None:
    orch = Orch(cluster, tmp_path, "orch-1", f"ts-leader-{uuid.uuid4().hex[:6]}", "--handover", "delay",
                "--handover-delay", "2s", tls=tls).start()  # fmt: skip
    group = _group()
    ja, jb, md = tenant.job("a", group), tenant.job("b", group), tenant.md
    with orchestrators(orch):
        orch.wait_ready()
        a = orch.stub().Acquire(pb.AcquireRequest(group=group, job=ja), timeout=60, metadata=md)
        orch.stub().Yield(pb.YieldRequest(group=group, job=ja, fencing_token=a.fencing_token), timeout=10, metadata=md)
        got_b: list[Any] = []
        b = threading.Thread(target=lambda: got_b.append(_acquire_retrying(orch.stub, group, jb, 60, md)))
        b.start()

        def switching_to_b() -> dict[str, Any] | None:
            x = _lease(api, group, tenant.ns)
            return x if x["switching"] == "true" and x["holder"] == jb else None

        mid = _until(switching_to_b, "the hand-over to ns/b started")
        orch.kill()  # SIGKILL mid-hand-over
        orch.start()  # the same replica restarts
        orch.wait_ready()
        with pytest.raises(grpc.RpcError) as e:  # a may not be granted while b's hand-over is redone and held
            _acquire_retrying(orch.stub, group, ja, TTL, md)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        b.join(60)
        assert got_b and got_b[0].fencing_token > mid["token"], "the redone hand-over has a newer token"
        final = _lease(api, group, tenant.ns)
        assert final == {"holder": jb, "token": got_b[0].fencing_token, "switching": "false"}


def test_two_replicas_only_the_leader_grants(
    cluster: ClusterHandle, api: Any, tmp_path: Path, tenant: Tenant, tls: Any
) -> None:
    lease = f"ts-leader-{uuid.uuid4().hex[:6]}"
    one = Orch(cluster, tmp_path, "replica-1", lease, tls=tls).start()
    two = Orch(cluster, tmp_path, "replica-2", lease, tls=tls)
    group = _group()
    jx, jy, md = tenant.job("x", group), tenant.job("y", group), tenant.md
    with orchestrators(one, two):
        one.wait_ready()
        two.start()
        _until(lambda: two.proc is not None and _metrics_up(two), "replica-2 serves /metrics")
        assert not two.ready()
        with pytest.raises(grpc.RpcError) as e:
            two.stub().Acquire(pb.AcquireRequest(group=group, job=jx), timeout=10, metadata=md)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "not the leader" in e.value.details()
        x = one.stub().Acquire(pb.AcquireRequest(group=group, job=jx), timeout=30, metadata=md)
        one.kill()
        two.wait_ready()  # takes over once the leader Lease expires
        # the group record is the Lease: x still holds until its TTL, then y is granted with the next token
        y = two.stub().Acquire(pb.AcquireRequest(group=group, job=jy), timeout=6 * TTL, metadata=md)
        assert y.fencing_token == x.fencing_token + 1
        assert _lease(api, group, tenant.ns)["holder"] == jy


def _metrics_up(o: Orch) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{o.mport}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_callers_are_checked_by_token_review(
    cluster: ClusterHandle, api: Any, tmp_path: Path, tenant: Tenant, tls: Any
) -> None:
    orch = Orch(cluster, tmp_path, "orch-auth", f"ts-leader-{uuid.uuid4().hex[:6]}", tls=tls).start()
    group = _group()
    jx, ok = tenant.job("x", group), tenant.md
    with orchestrators(orch):
        orch.wait_ready()
        stub = orch.stub()
        r = stub.Acquire(pb.AcquireRequest(group=group, job=jx), timeout=30, metadata=ok)
        stub.Yield(pb.YieldRequest(group=group, job=jx, fencing_token=r.fencing_token), metadata=ok)
        for job, metadata, code in (
            ("other/x", ok, grpc.StatusCode.PERMISSION_DENIED),
            (jx, [], grpc.StatusCode.UNAUTHENTICATED),
            (jx, [("authorization", "Bearer forged")], grpc.StatusCode.UNAUTHENTICATED),
        ):
            with pytest.raises(grpc.RpcError) as e:
                stub.Acquire(pb.AcquireRequest(group=group, job=job), timeout=30, metadata=metadata)
            assert e.value.code() == code, e.value.details()
        # Status and ListGroups: the same token; the groups of its namespace only
        assert stub.Status(pb.StatusRequest(group=group), timeout=30, metadata=ok).resident == jx
        listed = stub.ListGroups(pb.ListGroupsRequest(), timeout=30, metadata=ok).groups
        assert [g.group for g in listed] == [f"{tenant.ns}/{group}"]
        with pytest.raises(grpc.RpcError) as e:
            stub.Status(pb.StatusRequest(group=group), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Status(pb.StatusRequest(group=_group()), timeout=30, metadata=ok)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()


def test_tenants_are_isolated_by_namespace_pods_and_priority_class(
    cluster: ClusterHandle, api: Any, tmp_path: Path, tls: Any
) -> None:
    """Issue 22, finding 3 and 7 on the real API server: team-b's job in a group named like team-a's
    gets a group (and a Lease) of its own and cannot name team-a's; a job without worker pods is
    refused before it takes a place; a waiter's priority is its pods' spec.priority, from their
    PriorityClass, not the 2^31-1 it asks for; the plaintext port an old client expects is not there."""
    from kubernetes import client

    pc = f"ts-e2e-{uuid.uuid4().hex[:6]}"
    sched = client.SchedulingV1Api(api)
    sched.create_priority_class({"metadata": {"name": pc}, "value": 50, "preemptionPolicy": "Never"})
    team_a, team_b = Tenant(api, "ts-a"), Tenant(api, "ts-b")
    orch = Orch(cluster, tmp_path, "orch-tenants", f"ts-leader-{uuid.uuid4().hex[:6]}", tls=tls).start()
    group = _group()
    try:
        holder, low, high = team_a.job("holder", group), team_a.job("low", group), team_a.job("high", group, pc)
        b_job = team_b.job("ppo", group)
        with orchestrators(orch):
            orch.wait_ready()
            stub = orch.stub()
            a = stub.Acquire(pb.AcquireRequest(group=group, job=holder), timeout=30, metadata=team_a.md)
            b = stub.Acquire(pb.AcquireRequest(group=group, job=b_job), timeout=10, metadata=team_b.md)
            assert (a.fencing_token, b.fencing_token) == (1, 1)  # two groups of one name
            assert (
                _lease(api, group, team_a.ns)["holder"] == holder and _lease(api, group, team_b.ns)["holder"] == b_job
            )
            for req, code in (
                (pb.AcquireRequest(group=f"{team_a.ns}/{group}", job=b_job), grpc.StatusCode.PERMISSION_DENIED),
                (pb.AcquireRequest(group=group, job=f"{team_b.ns}/fake"), grpc.StatusCode.PERMISSION_DENIED),
            ):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Acquire(req, timeout=10, metadata=team_b.md)
                assert e.value.code() == code, e.value.details()
            got: list[str] = []

            def wait(job: str, priority: int) -> None:
                stub.Acquire(pb.AcquireRequest(group=group, job=job, priority=priority), timeout=60, metadata=team_a.md)
                got.append(job)

            threads = [
                threading.Thread(target=wait, args=(low, 2**31 - 1)),
                threading.Thread(target=wait, args=(high, 0)),
            ]
            for t in threads:
                t.start()
            _until(
                lambda: len(stub.Status(pb.StatusRequest(group=group), timeout=10, metadata=team_a.md).waiters) == 2,
                "both team-a waiters queued",
            )
            stub.Yield(pb.YieldRequest(group=group, job=holder, fencing_token=a.fencing_token), metadata=team_a.md)
            _until(lambda: got, "a grant")
            assert got == [high], "the PriorityClass decides, not the request's priority"
            st = stub.Status(pb.StatusRequest(group=group), timeout=10, metadata=team_a.md)
            stub.Yield(pb.YieldRequest(group=group, job=high, fencing_token=st.fencing_token), metadata=team_a.md)
            for t in threads:
                t.join(30)
            with grpc.insecure_channel(orch.target) as plain, pytest.raises(grpc.RpcError) as e:
                pb_grpc.TimeSliceOrchestratorStub(plain).Status(
                    pb.StatusRequest(group=group), timeout=5, metadata=team_a.md
                )
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        team_a.close()
        team_b.close()
        sched.delete_priority_class(pc)
