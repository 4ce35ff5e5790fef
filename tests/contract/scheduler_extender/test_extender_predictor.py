"""The extender's http forecast backend against the real predictor process (``rose predictor
serve --replay generated``: the predictor's explicit demo source, no Prometheus needed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_cluster import free_port
from rose_common.forecast_client import ForecastError, HttpForecastSource
from scheduler_extender import policy
from scheduler_extender.forecast import ForecastCache
from scheduler_extender.model import PoolState
from tests.support.predictor_fixtures import wait_predictor_ready

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("predictor")
    (tmp / "pools.yaml").write_text("pools:\n  - name: pool-a\n    query: unused-in-replay\n    capacity: 64\n")
    port = free_port()
    log = (tmp / "predictor.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "predictor",
            "serve",
            f"--pools={tmp / 'pools.yaml'}",
            "--replay=generated",
            f"--listen=127.0.0.1:{port}",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_predictor_ready(url, proc, tmp / "predictor.log")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_real_predictor_reply_drives_the_idle_window(predictor: str) -> None:
    src = HttpForecastSource(predictor, timeout_s=2.0)
    resp = src.fetch("pool-a")
    assert resp.pool == "pool-a" and not resp.stale
    assert [p.horizon_seconds for p in resp.points] == [600, 1800, 3600]
    cache = ForecastCache(src, quantile="0.9", refresh_s=60, max_age_s=60)
    cache.want(["pool-a"])
    cache.refresh_once()
    fc = cache.get("pool-a")
    assert fc is not None and len(fc.points) == 3
    demand = max(d for _, d in fc.points)
    # a pool big enough for the predicted demand is idle for the whole hour, a small one is not
    big = PoolState(capacity=int(demand) + 10, serving_used=0, lent=0)
    small = PoolState(capacity=max(1, int(min(d for _, d in fc.points)) - 1), serving_used=0, lent=0)
    assert policy.idle_window_s(big, fc, 1, policy.PolicyConfig()) == (3600.0, False)
    assert policy.idle_window_s(small, fc, 1, policy.PolicyConfig())[0] < 3600.0
    with pytest.raises(ForecastError):
        src.fetch("no-such-pool")
