"""Issue 14 §3 against the real predictor process serving risks (``rose predictor serve --risks
0.01,0.05 --replay generated`` with a capacity per GPU): the extender's and the planner's readers
take its ``gpus_needed`` at the configured risk, and decide differently from the quantile."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_controller import pools
from elastic_controller.planner import Forecast, Job, PlanInput, Pool, Settings, Worker, plan
from local_cluster import free_port
from rose_common.forecast_api import ForecastResponse
from rose_common.forecast_client import HttpForecastSource
from scheduler_extender import policy
from scheduler_extender.forecast import ForecastCache, reduce
from scheduler_extender.model import PoolState
from tests.support.predictor_fixtures import wait_predictor_ready

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def reply(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForecastResponse]:
    tmp = tmp_path_factory.mktemp("predictor-risks")
    pools_yaml = "pools:\n  - name: pool-a\n    query: unused-in-replay\n    capacity: 64\n    capacity_per_gpu: 1.0\n"
    (tmp / "pools.yaml").write_text(pools_yaml)
    port = free_port()
    log = (tmp / "predictor.log").open("wb")
    cmd = [
        sys.executable,
        "-m",
        "predictor",
        "serve",
        f"--pools={tmp / 'pools.yaml'}",
        "--replay=generated",
        "--risks=0.01,0.05",
        f"--listen=127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_predictor_ready(url, proc, tmp / "predictor.log")
        yield HttpForecastSource(url, timeout_s=5.0).fetch("pool-a")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


class _Replay:
    name = "replay"

    def __init__(self, resp: ForecastResponse) -> None:
        self.resp = resp

    def fetch(self, pool: str) -> ForecastResponse:
        return self.resp


def _needed(resp: ForecastResponse, risk: str) -> list[tuple[int, float]]:
    return [(p.horizon_seconds, float((p.gpus_needed or {})[risk])) for p in resp.points]


def test_the_real_reply_carries_gpus_needed_and_both_readers_take_it(reply: ForecastResponse) -> None:
    assert not reply.stale and [p.horizon_seconds for p in reply.points] == [600, 1800, 3600]
    needed = _needed(reply, "0.01")
    cache = ForecastCache(_Replay(reply), quantile="0.9", risk="0.01", refresh_s=60, max_age_s=60)
    cache.want(["pool-a"])
    cache.refresh_once()
    extender = cache.get("pool-a")
    assert extender is not None and extender.basis == "risk 0.01" and list(extender.points) == needed
    planner = pools.to_forecast(reply, "0.9", risk="0.01")
    assert planner.quantile == "at risk 0.01"
    assert (planner.upper[0], planner.upper[-1]) == (needed[0][1], needed[-1][1])
    # a risk it does not serve: the quantile, as before
    assert pools.to_forecast(reply, "0.9", risk="0.02") == pools.to_forecast(reply, "0.9")


def test_the_extender_lends_less_at_risk_than_at_the_quantile(reply: ForecastResponse) -> None:
    cfg = policy.PolicyConfig()
    at_q, at_r = reduce(reply, "0.9"), reduce(reply, "0.9", risk="0.01")
    # a pool just big enough for the p90 over the hour, plus one GPU to lend
    pool = PoolState(capacity=math.ceil(max(d for _, d in at_q.points)) + 1, serving_used=0, lent=0)
    assert max(d for _, d in at_r.points) > pool.capacity - 1, "precondition: the window bound exceeds the p90"
    assert policy.idle_window_s(pool, at_q, 1, cfg) == (3600.0, False)
    assert policy.idle_window_s(pool, at_r, 1, cfg)[0] < 3600.0


GRACE_S = 1800.0  # a job that needs half an hour's notice


def test_the_planner_reclaims_at_risk_where_the_quantile_keeps_lending(reply: ForecastResponse) -> None:
    def target(fc: Forecast, cap: int) -> int:
        job = Job("ns/a", 1, 1, grace_s=GRACE_S, suspend_s=5.0, min_useful_run_s=60.0)
        inp = PlanInput(
            fc.start + 1,
            (Pool("pool-a", cap, fc),),
            (job,),
            (Worker("a-w0", "ns/a", "active", "pool-a"),),
            Settings(dwell_s=300),
        )
        return plan(inp).targets["ns/a"].active_gpus

    q, r = pools.to_forecast(reply, "0.9"), pools.to_forecast(reply, "0.9", risk="0.01")
    # what serving may need before the job's lead time (grace + suspend) runs out: a 1 % window
    # bound over half an hour, against the p90 of single points (the first 10-minute step alone can
    # round to the same whole GPU, depending on the hour the generated history is replayed at)
    lead = GRACE_S + 5.0
    need_q, need_r = math.ceil(q.peak(q.start, q.start + lead)), math.ceil(r.peak(r.start, r.start + lead))
    assert need_r > need_q, f"precondition: at risk 0.01 serving needs more ({need_r}) than at p90 ({need_q})"
    cap = need_q + 1  # room for the one lent GPU at p90 only
    assert target(q, cap) == 1 and target(r, cap) == 0
