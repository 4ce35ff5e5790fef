"""An ElasticRLJob of GPU shares (``spec.gpuShare``, issue 27 §3): the model's validation, the claim
its workers get (read back by the extender's own claim reader), the fraction the planner is given
(the one ``rose_common.slices.share_fraction``), the workers' bounds and the status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from elastic_controller import observe, workers
from elastic_controller.desired import desired
from elastic_controller.planner import Forecast, PlanInput, Pool, Settings, plan
from elastic_controller.status import compute_status
from rose_common import elasticrljob as erj
from rose_common import names
from rose_common.slices import share_fraction
from scheduler_extender.model import ShareRequest
from scheduler_extender.shares import claim_share_requests
from scheduler_extender.shares import share_fraction as extender_share_fraction

GIB = 2**30
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "w", "image": "w:1"}]}}


def make_job(share: dict[str, Any] | None = None, **spec: Any) -> erj.ElasticRLJob:
    base: dict[str, Any] = {"minGPUs": 1, "maxGPUs": 2, "template": TEMPLATE}
    if share is not None:
        base["gpuShare"] = share
    base.update(spec)
    meta = {"name": "sj", "namespace": "rl", "uid": "u-1", "generation": 1}
    return erj.ElasticRLJob.model_validate({"metadata": meta, "spec": base})


@pytest.mark.parametrize(
    ("share", "message"),
    [
        ({"memory": "lots", "compute": 25}, erj.MSG_SHARE_MEMORY),
        ({"memory": "0", "compute": 25}, erj.MSG_SHARE_MEMORY),
        ({"memory": "-1Gi", "compute": 25}, erj.MSG_SHARE_MEMORY),
        ({"memory": "257Gi", "compute": 25}, erj.MSG_SHARE_MEMORY_MAX),
        ({"memory": "20Gi", "compute": 0}, "greater than or equal to 1"),
        ({"memory": "20Gi", "compute": 101}, "less than or equal to 100"),
        ({"memory": "20Gi"}, "compute"),
    ],
)
def test_a_bad_share_is_refused_with_a_clear_message(share: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        make_job(share)


def test_a_share_does_not_combine_with_several_gpus_roles_or_a_timeslice_group() -> None:
    with pytest.raises(ValidationError, match=erj.MSG_SHARE_GPW):
        make_job({"memory": "20Gi", "compute": 25}, minGPUs=2, gpusPerWorker=2)
    with pytest.raises(ValidationError, match=erj.MSG_SHARE_EXCLUSIVE):
        make_job({"memory": "20Gi", "compute": 25}, timesliceGroup="g")


def test_without_a_share_the_claim_is_the_whole_gpu_one() -> None:
    (req,) = workers.claim_template(make_job())["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"] == {
        "deviceClassName": names.DEVICE_CLASS_LENDABLE,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    assert observe.job_share(make_job().spec, 80 * GIB) == 0.0
    assert observe.planner_job(make_job(), share_memory=80 * GIB).share == 0.0


def test_a_share_workers_claim_asks_the_share_class_for_its_capacities() -> None:
    t = workers.claim_template(make_job({"memory": "20Gi", "compute": 25}))
    assert t["metadata"]["name"] == "sj-gpus"
    (req,) = t["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == names.DEVICE_CLASS_SHARE
    assert req["exactly"]["count"] == 1
    assert req["exactly"]["capacity"] == {"requests": {"memory": "20Gi", "compute": "25"}}
    # the extender reads the claim the controller writes as the share it was asked for
    assert claim_share_requests(t["spec"]["spec"]) == (ShareRequest(20 * GIB, 25),)


@pytest.mark.parametrize(
    ("memory", "compute", "gpu_memory", "want"),
    [
        ("20Gi", 25, 80 * GIB, 0.25),  # both a quarter
        ("40Gi", 10, 80 * GIB, 0.5),  # memory is the larger fraction
        ("8Gi", 30, 80 * GIB, 0.3),  # compute is the larger fraction
        ("20Gi", 12, 80 * GIB, 0.25),  # compute rounded up to 15 % (driver's step); memory larger
        ("19.5Gi", 5, 80 * GIB, 0.25),  # memory rounded up to whole GiB: 20 GiB
        ("40Gi", 25, None, 0.25),  # GPU memory unknown: only compute counts
        ("80Gi", 100, 80 * GIB, observe.MAX_PLANNED_SHARE),  # a whole GPU's worth: planned just below one
    ],
)
def test_the_planner_gets_the_shares_fraction(memory: str, compute: int, gpu_memory: int | None, want: float) -> None:
    job = make_job({"memory": memory, "compute": compute})
    pj = observe.planner_job(job, share_memory=gpu_memory)
    assert pj.share == pytest.approx(want)
    assert (pj.min_gpus, pj.max_gpus, pj.gpus_per_worker) == (1, 2, 1)


def test_the_fraction_is_the_extenders_definition() -> None:
    """One function: the extender's share size is rose_common's for every request."""
    for mem, comp, gpu in [(20 * GIB, 25, 80 * GIB), (41 * GIB, 5, 80 * GIB), (GIB, 95, 24 * GIB)]:
        assert extender_share_fraction(ShareRequest(mem, comp), gpu) == share_fraction(mem, comp, gpu)


def test_min_and_max_count_the_shares_fractions_in_the_plan() -> None:
    """minGPUs 1, maxGPUs 2 in quarter shares on 4 idle GPUs: 8 workers (2 GPUs of shares)."""
    pj = observe.planner_job(make_job({"memory": "20Gi", "compute": 25}), share_memory=80 * GIB)
    pool = Pool("p", 4, Forecast(start=0.0, step=60.0, upper=(0.0,) * 60))
    t = plan(PlanInput(0.0, (pool,), (pj,), (), Settings())).targets[pj.key]
    assert (len(t.add), t.active_gpus, t.active_share, t.share) == (8, 0, pytest.approx(2.0), 0.25)
    assert any("a 0.25 GPU share" in r for r in t.reasons), t.reasons


def test_share_workers_bounds_and_desired_pods() -> None:
    job = make_job({"memory": "20Gi", "compute": 30}, minGPUs=1, maxGPUs=2)
    assert workers.worker_bounds(job, 0.3) == (4, 6)  # 4 x 0.3 reaches 1 GPU; 6 x 0.3 fits 2
    assert workers.worker_bounds(job, 0.25) == (4, 8)
    pj = observe.planner_job(job, share_memory=80 * GIB)
    pool = Pool("p", 4, Forecast(start=0.0, step=60.0, upper=(0.0,) * 60))
    target = plan(PlanInput(0.0, (pool,), (pj,), (), Settings())).targets[pj.key]
    d = desired(job, [], target, NOW)
    assert len(d.create) == 6
    env = {e["name"]: e.get("value") for e in d.create[0]["spec"]["containers"][0]["env"]}
    assert (env["ROSE_MIN_WORKERS"], env["ROSE_MAX_WORKERS"]) == ("4", "6")
    assert d.claim_template is not None
    assert d.claim_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        names.DEVICE_CLASS_SHARE
    )


def _observed(n: int) -> list[observe.ObservedWorker]:
    return [observe.ObservedWorker(f"sj-w{i}", f"u{i}", i, "Running", "n1", "p") for i in range(n)]


def test_status_says_the_share_and_counts_workers() -> None:
    job = make_job({"memory": "20Gi", "compute": 25})
    pj = observe.planner_job(job, share_memory=80 * GIB)
    pool = Pool("p", 1, Forecast(start=0.0, step=60.0, upper=(0.0,) * 60))
    target = plan(PlanInput(0.0, (pool,), (pj,), (), Settings())).targets[pj.key]  # 1 GPU: 4 quarter shares
    status, _ = compute_status(job, _observed(4), target, None, NOW)
    assert (status.gpu_share, status.active_share_gpus, status.target_share_gpus) == (0.25, 1.0, 1.0)
    assert (status.active_gpus, status.target_gpus, status.phase) == (0, 0, "Running")
    ready = next(c for c in status.conditions or [] if c.type == "Ready")
    assert ready.status == "True" and ready.message == "4 of 4 target workers with a 0.25 GPU share each active"
    partial, _ = compute_status(job, _observed(2), target, status, NOW)
    assert (partial.phase, partial.active_share_gpus) == ("Scaling", 0.5)
    # before the planner speaks again, the last status's share and target stand
    kept, _ = compute_status(job, _observed(4), None, status, NOW)
    assert (kept.gpu_share, kept.target_share_gpus, kept.phase) == (0.25, 1.0, "Running")
    # the status is one the CRD's model takes
    erj.ElasticRLJobStatus.model_validate(status.model_dump(by_alias=True, exclude_none=True))
