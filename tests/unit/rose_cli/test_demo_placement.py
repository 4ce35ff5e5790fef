"""`rose demo` act 2 without a cluster: its forecast does not depend on the time of day, and the
extender's policy, fed that forecast and the demo's pools, puts a worker in the roomier pool."""

from __future__ import annotations

import json
import time

import pytest

from rose_cli import demo_placement
from rose_common.forecast_api import ForecastResponse
from scheduler_extender.forecast import reduce
from scheduler_extender.model import PoolForecast
from scheduler_extender.server import Extender
from tests.support.extender_fixtures import args_body, cluster_cache, pod

# `rose demo`'s defaults: 4 nodes of 8 GPUs, 2 pools (local_cluster alternates them)
POOLS = {"rose-node-0": "pool-a", "rose-node-1": "pool-b", "rose-node-2": "pool-a", "rose-node-3": "pool-b"}
GPUS_PER_NODE = 8
DAY = 86400


class _Forecasts:
    def __init__(self, fcs: dict[str, PoolForecast]) -> None:
        self.by_pool = fcs

    def get(self, pool: str) -> PoolForecast | None:
        return self.by_pool.get(pool)


def _forecasts_at(monkeypatch: pytest.MonkeyPatch, wall_clock: float) -> list[str]:
    monkeypatch.setattr(time, "time", lambda: wall_clock)
    try:
        return [f.model_dump_json() for f in demo_placement.forecasts(POOLS, GPUS_PER_NODE)]
    finally:
        monkeypatch.undo()


@pytest.mark.slow
def test_act_two_is_the_same_at_any_hour_and_prefers_the_roomier_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 10 §4: the act forecast from the wall clock, so its outcome changed with the hour.
    Two runs 12 hours apart (03:00 and 15:00 UTC) must give byte-identical forecasts, and the
    extender must rank every pool-a node strictly above every pool-b node with them."""
    midnight = 1_780_000_000 - 1_780_000_000 % DAY
    night = _forecasts_at(monkeypatch, midnight + 3 * 3600)
    afternoon = _forecasts_at(monkeypatch, midnight + 15 * 3600)
    assert night == afternoon
    fcs = {f["pool"]: reduce(ForecastResponse.model_validate(f), "0.9") for f in map(json.loads, afternoon)}
    by_pool: dict[str, list[str]] = {}
    for node, pool in POOLS.items():
        by_pool.setdefault(pool, []).append(node)
    ext = Extender(
        cluster_cache(by_pool, gpus=GPUS_PER_NODE),
        forecasts=_Forecasts(fcs),
        clock=lambda: float(demo_placement.ORIGIN),
    )
    worker = pod("grpo-worker-0", "u-0", ns="demo", job="grpo")
    nodes = sorted(POOLS)
    _, body = ext.handle("filter", args_body(worker, nodes))
    assert json.loads(body)["NodeNames"] == nodes, "both pools fit the worker: only headroom decides"
    _, body = ext.handle("prioritize", args_body(worker, nodes))
    scores = {h["Host"]: h["Score"] for h in json.loads(body)}
    assert min(scores[n] for n in by_pool["pool-a"]) > max(scores[n] for n in by_pool["pool-b"]), (scores, fcs)
