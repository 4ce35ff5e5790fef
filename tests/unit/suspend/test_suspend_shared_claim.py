"""Issue 22 finding 8, the pure parts: the registry maps a claim to all its pods, a result over
several members of a shared claim, and where the driver reads a job's checkpointPath."""

from __future__ import annotations

from dra_driver.engine_api import SuspendReason, SuspendResult
from dra_driver.kube import pod_checkpoint_path
from dra_driver.suspend.engine import combine_results
from dra_driver.suspend.model import Registration
from dra_driver.suspend.registry import ClaimScope, TrustedPod, WorkloadRegistry

A, B = TrustedPod("rl", "a-0", "uid-a"), TrustedPod("rl", "b-0", "uid-b")
SCOPE = ClaimScope("claim-x", (A, B), 1 << 30)


def reg(uid: str, claims: tuple[str, ...] = ()) -> Registration:
    return Registration(uid, 4242, 1, frozenset({"cooperative"}), claim_uids=frozenset(claims))


def test_a_shared_claim_maps_to_every_pod_registered_or_bound_on_it() -> None:
    r = WorkloadRegistry()
    r.register(reg("uid-a"), scope=SCOPE)
    r.register(reg("uid-b"), scope=SCOPE)
    assert r.pods_for_claim("claim-x") == ["uid-a", "uid-b"]
    r.register(reg("uid-evil", ("claim-x",)))  # a body on a shared socket cannot join a trusted claim
    assert r.pods_for_claim("claim-x") == ["uid-a", "uid-b"]
    r.remove("uid-a")
    assert r.pods_for_claim("claim-x") == ["uid-b"] and r.pod_for_claim("claim-x") == "uid-b"
    r.remove("uid-b")
    assert r.pods_for_claim("claim-x") == []


def test_the_drivers_binding_replaces_what_bodies_said_then_adds_each_pod() -> None:
    r = WorkloadRegistry()
    r.register(reg("uid-evil", ("claim-y",)))
    assert r.pods_for_claim("claim-y") == ["uid-evil"]
    r.bind_claim("claim-y", "uid-a")
    r.bind_claim("claim-y", "uid-b")
    r.bind_claim("claim-y", "uid-a")
    assert r.pods_for_claim("claim-y") == ["uid-a", "uid-b"]


def _res(ok: bool, fallback: str | None = None, reason: SuspendReason = SuspendReason.DONE) -> SuspendResult:
    return SuspendResult(ok, "cooperative", 10, 0.5 if ok else 2.0, fallback, "m", reason)


def test_one_result_for_several_members() -> None:
    both = combine_results([("a", _res(True)), ("b", _res(True))])
    assert both.ok and both.bytes_moved == 20 and both.fallback is None and both.reason is SuspendReason.DONE
    assert both.message == "pod a: m; pod b: m"
    one_failed = combine_results([("a", _res(True)), ("b", _res(False, reason=SuspendReason.DEADLINE_EXCEEDED))])
    assert not one_failed.ok and one_failed.reason is SuspendReason.DEADLINE_EXCEEDED and one_failed.seconds == 2.0
    mixed = combine_results([("a", _res(True, "checkpoint-evict")), ("b", _res(True))])
    assert mixed.ok and mixed.fallback is None  # b's state is in host memory: the claim is resumed later
    evicted = combine_results([("a", _res(True, "checkpoint-evict")), ("b", _res(True, "checkpoint-evict"))])
    assert evicted.fallback == "checkpoint-evict" and evicted.reason is SuspendReason.FALLBACK


def test_the_jobs_checkpoint_path_is_the_pods_literal_env_value() -> None:
    def pod(*envs: dict[str, object]) -> dict[str, object]:
        return {"spec": {"containers": [{"name": "main", "env": list(envs)}]}}

    assert pod_checkpoint_path(pod({"name": "ROSE_CHECKPOINT_PATH", "value": "/ckpt/job"})) == "/ckpt/job"
    assert pod_checkpoint_path(pod({"name": "ROSE_CHECKPOINT_PATH", "valueFrom": {"fieldRef": {}}})) is None
    assert pod_checkpoint_path(pod({"name": "OTHER", "value": "/x"})) is None
    assert pod_checkpoint_path({"spec": {}}) is None
