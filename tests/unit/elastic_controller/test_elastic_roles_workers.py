"""A job with ``spec.roles``: its role pods, the trainer's Service, the desired actions and status,
and the planner's view of it (issue 23 §3)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from elastic_controller import observe as obs
from elastic_controller import workers
from elastic_controller.desired import desired
from elastic_controller.planner import JobTarget
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob
from tests.support.erj_manifests import elastic_rl_job

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POD = {"spec": {"containers": [{"name": "c", "image": "i"}]}}


def make_job(placement: str = "Lent", **rollout: Any) -> ElasticRLJob:
    roles = {
        "trainer": {
            "workers": 2,
            "gpusPerWorker": 2,
            "placement": placement,
            "template": POD,
            "stateBytesPerWorker": 1 << 30,
        },
        "rollout": {"minWorkers": 1, "maxWorkers": 4, "template": POD, **rollout},
    }
    return ElasticRLJob.model_validate(
        {"metadata": {"name": "grpo", "namespace": "rl", "uid": "u-1", "generation": 1}, "spec": {"roles": roles}}
    )


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_role_pods_carry_their_role_index_size_and_the_trainer_address() -> None:
    job = make_job()
    t = workers.worker_pod(job, 1, "pool-a", None, "trainer")
    r = workers.worker_pod(job, 3, "pool-b", None, "rollout")
    assert (t["metadata"]["name"], r["metadata"]["name"]) == ("grpo-trainer-1", "grpo-rollout-3")
    assert t["metadata"]["labels"][workers.LABEL_RL_ROLE] == "trainer"
    assert r["metadata"]["labels"][workers.LABEL_RL_ROLE] == "rollout"
    assert r["metadata"]["labels"][names.LABEL_ROLE] == "rl-worker"  # the cluster-wide meaning is kept
    addr = "grpo-trainer-0.grpo-trainer.rl.svc:50051"
    keys = ("ROSE_ROLE", "ROSE_ROLE_INDEX", "ROSE_TRAINER_ADDR", "ROSE_MIN_WORKERS", "ROSE_MAX_WORKERS")
    assert [env(r)[k] for k in keys] == ["rollout", "3", addr, "1", "4"]
    assert (env(t)["ROSE_MIN_WORKERS"], env(t)["ROSE_MAX_WORKERS"]) == ("2", "2")
    assert (t["spec"]["hostname"], t["spec"]["subdomain"]) == ("grpo-trainer-1", "grpo-trainer")
    assert t["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "grpo-trainer-gpus"}]
    assert t["metadata"]["annotations"][names.ANNOTATION_STATE_BYTES] == str(1 << 30)
    assert workers.claim_template(job, "trainer")["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    svc = workers.trainer_service(job)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"][workers.LABEL_RL_ROLE] == "trainer"


def test_names_parse_back_to_role_and_index() -> None:
    assert workers.worker_role_index("grpo", "grpo-rollout-12") == ("rollout", 12)
    assert workers.worker_role_index("grpo", "grpo-w3") == (None, 3)
    assert workers.worker_role_index("grpo", "grpo-x-trainer-0") is None
    assert workers.worker_role_index("grpo-trainer", "grpo-trainer-0") is None


def test_a_dedicated_trainer_keeps_its_own_gpus_and_is_not_planned() -> None:
    job = make_job("Dedicated")
    t = workers.worker_pod(job, 0, None, None, "trainer")
    assert "resourceClaims" not in t["spec"] and "schedulerName" not in t["spec"]
    assert workers.lent_roles(job) == ("rollout",)
    assert [j.key for j in obs.role_planner_jobs(job, [])] == ["rl/grpo#rollout"]
    assert obs.role_planner_jobs(job, [])[0].requires is None
    d = desired(job, [], None, NOW)  # the planner has not spoken: the dedicated trainer starts anyway
    assert [p["metadata"]["name"] for p in d.create] == ["grpo-trainer-0", "grpo-trainer-1"]


def test_desired_creates_each_new_worker_in_its_role_and_reports_per_role() -> None:
    job = make_job(reclaim="Suspend")
    target = JobTarget(
        "rl/grpo",
        6,
        add=("a", "a", "b", "b"),
        add_roles=("trainer", "trainer", "rollout", "rollout"),
        role_workers=(("trainer", 2), ("rollout", 2)),
    )
    d = desired(job, [], target, NOW)
    assert [p["metadata"]["name"] for p in d.create] == [
        "grpo-trainer-0",
        "grpo-trainer-1",
        "grpo-rollout-0",
        "grpo-rollout-1",
    ]
    assert [t["metadata"]["name"] for t in d.templates] == ["grpo-trainer-gpus", "grpo-rollout-gpus"]
    assert d.service is not None and d.claim_template is None
    assert d.status.roles is not None and d.status.roles.trainer is not None
    assert (d.status.roles.trainer.desired_workers, d.status.roles.trainer.active_workers) == (2, 0)
    pods = [*d.create]
    for p in pods:
        p["metadata"]["uid"] = "uid-" + p["metadata"]["name"]
        p["status"] = {"phase": "Running"}
    seen = [w for w in (obs.observe("grpo", p) for p in pods) if w is not None]
    assert [w.role for w in seen] == ["trainer", "trainer", "rollout", "rollout"]
    planned = obs.role_planner_jobs(job, seen)
    assert [(j.key, j.min_gpus, j.max_gpus, j.remove_on_shrink) for j in planned] == [
        ("rl/grpo#trainer", 4, 4, False),
        ("rl/grpo#rollout", 1, 4, False),
    ]
    again = desired(job.model_copy(update={"status": d.status}), seen, target, NOW)
    assert again.status.active_gpus == 6 and again.status.phase == "Running"
    assert again.status.roles is not None and again.status.roles.rollout is not None
    assert again.status.roles.rollout.active_workers == 2


def test_a_roles_job_with_a_top_level_size_is_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match=r"spec\.roles replaces minGPUs"):
        ElasticRLJob.model_validate({"spec": {"minGPUs": 1, **make_job().spec.model_dump(exclude_none=True)}})


def test_rose_simulate_plans_a_job_with_roles_per_lent_role() -> None:
    """``rose simulate`` takes a job with roles (tests/unit/rose_sim/test_rose_sim_roles.py simulates one): one
    view per lent role, keyed as the planner keys it, with that role's state bytes; a Dedicated
    trainer is not lent, so not planned."""
    from rose_sim.inputs import parse_jobs, role_views

    for placement, want in (
        ("Lent", [("default/grpo#trainer", 1 << 30), ("default/grpo#rollout", 0)]),
        ("Dedicated", [("default/grpo#rollout", 0)]),
    ):
        doc = elastic_rl_job("grpo", **make_job(placement).spec.model_dump(exclude_none=True))
        (job,) = parse_jobs([("jobs.yaml", doc)])
        assert [(v.key, v.state_bytes) for v in role_views(job)] == want


def test_each_role_has_its_own_world() -> None:
    """A rollout joining or leaving does not change the trainer's world (its global batch)."""
    job = make_job()
    pods = [workers.worker_pod(job, 0, "a", None, "trainer")]
    pods += [workers.worker_pod(job, i, "a", None, "rollout") for i in range(3)]
    for p, phase in zip(pods, ("Running", "Running", "Running", "Pending"), strict=True):
        p["metadata"]["uid"], p["status"] = "uid-" + p["metadata"]["name"], {"phase": phase}
    seen = [w for w in (obs.observe("grpo", p) for p in pods) if w is not None]
    got = {w.name: value for w, value in obs.role_world_updates(seen)}
    assert got == {"grpo-trainer-0": "1/1", "grpo-rollout-0": "2/3", "grpo-rollout-1": "2/3"}
    plain = [obs.ObservedWorker(f"j-w{i}", f"u{i}", i, "Running", None, "a") for i in range(2)]
    assert [(w.name, v) for w, v in obs.role_world_updates(plain)] == [("j-w0", "2/2"), ("j-w1", "2/2")]


def test_a_roles_job_whose_name_cannot_name_a_service_is_refused_in_one_line() -> None:
    spec = make_job().spec.model_dump(exclude_none=True)
    for bad in ("grpo.v2", "2grpo", "g" * 51):
        with pytest.raises(ValidationError, match="its name must be a DNS label of at most 50 characters"):
            ElasticRLJob.model_validate({"metadata": {"name": bad}, "spec": spec})
    ElasticRLJob.model_validate({"metadata": {"name": "g" * 50}, "spec": spec})
