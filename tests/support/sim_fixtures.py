"""``rose simulate``'s test inputs: ElasticRLJob objects as ``--jobs`` reads them, seeded
demand series, a forecast cache that holds whatever the test puts in it, and one run of a
policy; shared by the simulator's tests and the replay benchmark's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from elastic_controller import planner
from elastic_controller.planner import Forecast
from rose_sim.engine import Policy, SimConfig, Simulation
from rose_sim.inputs import CostModel, Demand, parse_jobs
from rose_sim.report import bounds_for
from tests.support.erj_manifests import elastic_rl_job

GIB16 = 16 * 2**30
STEP = 600  # the demand series' resolution, seconds


def raw_job(name: str = "grpo", lo: int = 2, hi: int = 4, **spec: Any) -> dict[str, Any]:
    """An ElasticRLJob in namespace ``rl``: ``lo``..``hi`` GPUs, one per worker, 16 GiB of state each."""
    fields = {
        "minGPUs": lo,
        "maxGPUs": hi,
        "gpusPerWorker": 1,
        "stateBytesPerWorker": GIB16,
        "template": {"spec": {"containers": [{"name": "t", "image": "t"}]}},
        **spec,
    }
    return elastic_rl_job(name, "rl", {"uid": f"u-{name}", "generation": 1, "resourceVersion": "1"}, **fields)


def run_policy(
    policy: Policy,
    demand: Demand,
    jobs: list[dict[str, Any]] | None = None,
    pool: int = 8,
    record: bool = False,
    host_memory: int | None = None,
) -> Simulation:
    sims = parse_jobs([("t", j) for j in (jobs or [raw_job()])])
    cfg = SimConfig(pool_gpus=pool, host_memory_bytes=host_memory)
    bounds = bounds_for(demand, cfg, (policy.forecaster,) if policy.forecaster else ())
    s = Simulation(demand, sims, CostModel(), cfg, policy, bounds, record=record)
    s.run()
    return s


def wavy(days: int, seed: int) -> np.ndarray:
    """A daily sine of busy GPUs (20 ± 12) with seeded noise, one point per :data:`STEP`."""
    rng = np.random.default_rng(seed)
    t = np.arange(days * 144)
    base = 20 + 12 * np.sin(2 * np.pi * t / 144) + rng.normal(0, 2, len(t))
    return np.clip(base, 0, None)


def decisions(s: Simulation, before: float) -> list[tuple[float, str, dict[str, planner.JobTarget]]]:
    """The recorded decisions taken before ``before`` (simulated seconds)."""
    return [x for x in s.decisions if x[0] < before]


class FixedForecast:
    """The controller's forecast cache, holding whatever ``forecast`` the test set."""

    def __init__(self) -> None:
        self.forecast: Forecast | None = None

    def get(self, pool: str) -> Forecast | None:
        return self.forecast


def series_csv(path: Path, values: list[float]) -> Path:
    """``values`` as the ``--series`` CSV (``t_seconds,value``, one row per :data:`STEP`)."""
    path.write_text("t_seconds,value\n" + "".join(f"{i * STEP},{v}\n" for i, v in enumerate(values)))
    return path
