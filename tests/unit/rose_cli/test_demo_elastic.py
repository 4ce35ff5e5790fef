"""`rose demo` act 4 without a cluster: the three forecasts the act writes, read as the controller
reads them and planned by the controller's planner, give the story the act checks (grow to max,
shrink to min, gang suspend, regrow); and the timeline's one-line view of the job's workers."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from elastic_controller.planner import Job, PlanInput, Pool, Settings, Worker, plan
from elastic_controller.pools import to_forecast
from rose_cli import demo_elastic
from rose_common import names
from rose_common.forecast_api import ForecastResponse

CAP = 16  # the lent pool of `rose demo`'s default cluster: 2 nodes of 8 GPUs
NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


def _plan(quiet_need: float, states: list[str]) -> Any:
    doc = demo_elastic.forecast_doc({"pool-b": quiet_need, "pool-a": float(CAP)}, NOW)
    fc = {f["pool"]: to_forecast(ForecastResponse.model_validate(f), "0.9") for f in doc["forecasts"]}
    spec = demo_elastic.job_manifest("ns")["spec"]
    job = Job(
        "ns/j",
        spec["minGPUs"],
        spec["maxGPUs"],
        grace_s=spec["gracefulShutdownPeriod"],
        min_useful_run_s=spec["minUsefulRunSeconds"],
        state_bytes=spec["stateBytesPerWorker"],
    )
    workers = tuple(Worker(f"w{i}", "ns/j", s, "pool-b") for i, s in enumerate(states))  # type: ignore[arg-type]
    pools = tuple(Pool(p, CAP, fc[p]) for p in ("pool-a", "pool-b"))
    return plan(PlanInput(NOW.timestamp() + 1, pools, (job,), workers, Settings(dwell_s=0, interval_s=1)))


def test_the_acts_forecasts_grow_shrink_suspend_and_regrow_the_job() -> None:
    grow = _plan(0.0, []).targets["ns/j"]
    assert grow.add == ("pool-b",) * 4  # to max, all in the idle pool
    shrink = _plan(CAP - 2, ["active"] * 4)
    assert [r.kind for r in shrink.reclaims] == ["shrink", "shrink"] and len(shrink.targets["ns/j"].suspend) == 2
    gang = _plan(CAP, ["active", "active", "suspended", "suspended"])
    assert {r.kind for r in gang.reclaims} == {"gang-suspend"} and set(gang.targets["ns/j"].suspend) == {"w0", "w1"}
    regrow = _plan(0.0, ["suspended"] * 4).targets["ns/j"]
    assert sorted(regrow.resume) == ["w0", "w1", "w2", "w3"] and not regrow.add  # the same pods, resumed


def _pod(name: str, phase: str, **ann: str) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name=name, annotations=ann), status=SimpleNamespace(phase=phase))


def test_the_timeline_shows_each_worker_its_suspend_state_and_the_controllers_request() -> None:
    req = {names.ANNOTATION_SUSPEND_REQUEST: "{}"}
    pods = [
        _pod("j-w0", "Pending"),
        _pod("j-w1", "Running"),
        _pod("j-w2", "Running", **req, **{names.ANNOTATION_SUSPEND_STATE: "Suspended"}),
        _pod("j-w3", "Running", **req),
    ]
    line = demo_elastic.summary({"phase": "Scaling", "activeGPUs": 2, "suspendedGPUs": 1}, pods)
    assert line == "job Scaling: 2 active, 1 suspended GPUs | w0:Pending w1:Running w2:Suspended+req w3:Running+req"
    assert demo_elastic._count(pods, "Suspended") == 1
    assert demo_elastic._count(pods, "Running") == 1  # a worker asked to suspend is not counted as running
    assert demo_elastic.summary({}, []) == "job (no status yet): 0 active, 0 suspended GPUs | no workers"


def test_progress_rate_is_per_second_between_the_first_and_the_last_report() -> None:
    # polls of a cumulative counter: nothing yet, a first report, then two more 5 s apart
    seen = [(0.0, 0.0), (0.2, 0.0), (1.0, 1.0), (1.2, 1.0), (6.0, 121.0), (11.0, 246.0), (11.2, 246.0)]
    assert demo_elastic.progress_rate(seen[:4]) is None  # one change: no interval yet
    assert demo_elastic.progress_rate(seen[:5]) == 120.0 / 5.0
    assert demo_elastic.progress_rate(seen) == 245.0 / 10.0
    assert demo_elastic.progress_rate([(0.0, 5.0), (3.0, 5.0)]) is None  # a counter that does not move


def test_the_trainer_gets_its_claims_socket_and_pod_and_no_other_rose_setting() -> None:
    pod = SimpleNamespace(metadata=SimpleNamespace(uid="u-1", namespace="ns", name="grpo-elastic-w0"))
    base = {"PATH": "/bin", "ROSE_AGENT_SOCKET": "/stale.sock", "ROSE_RESTORE": "latest"}
    env = demo_elastic.trainer_env(base, Path("/tmp/c/workload.sock"), pod, Path("/repo"))
    assert env == {
        "PATH": "/bin",
        "PYTHONPATH": "/repo",
        "ROSE_AGENT_SOCKET": "/tmp/c/workload.sock",
        "ROSE_POD_UID": "u-1",
        "ROSE_POD_NAMESPACE": "ns",
        "ROSE_POD_NAME": "grpo-elastic-w0",
    }


def test_the_share_step_asks_for_two_half_gpu_workers_pinned_to_one_node() -> None:
    """The act's share job, read by the CRD's model and the controller's planner-job view: a 0.5 GPU
    share of 141 GiB GPUs, so minGPUs = maxGPUs = 1 is two workers, pinned to the node given."""
    import yaml

    from elastic_controller.observe import planner_job
    from elastic_controller.workers import worker_bounds
    from rose_common.elasticrljob import ElasticRLJob

    example = yaml.safe_load((Path(demo_elastic.TRAINER).parent / "elasticrljob-gpu-share.yaml").read_text())
    body = demo_elastic.share_job_manifest("ns", example, "rose-node-1")
    job = ElasticRLJob.model_validate(body)
    share = planner_job(job, share_memory=141 * 2**30).share
    assert share == 0.5 and worker_bounds(job, share) == (2, 2)
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "rose-node-1"}
    assert example["spec"]["gpuShare"] == {"memory": "20Gi", "compute": 25}, "the example itself is untouched"
