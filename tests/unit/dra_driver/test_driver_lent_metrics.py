"""rose_driver_lent_gpus{pool} / rose_driver_lent_gpu_seconds_total{pool}: what the dashboard's
"GPUs lent" panels read (a GPU counts only while an RL occupant runs on it, not while suspended)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from dra_driver.metrics import DriverMetrics, LentClock


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def sample(reg: CollectorRegistry, name: str, pool: str) -> float | None:
    return reg.get_sample_value(name, {"pool": pool})


def test_lent_clock_integrates_lent_gpus_over_time() -> None:
    c = LentClock(now=0.0)
    c.set(2, now=10.0)
    c.set(1, now=20.0)
    assert c.advance(30.0) == 2 * 10 + 1 * 10
    assert c.advance(25.0) == 30.0  # a clock going back adds nothing


def test_lent_gpus_and_seconds_follow_residency_with_the_node_pool() -> None:
    clock, reg = FakeClock(), CollectorRegistry()
    m = DriverMetrics([0, 1, 2], registry=reg, pool="pool-a", clock=clock)
    assert sample(reg, "rose_driver_lent_gpus", "pool-a") == 0
    m.set_residency(0, "lent")
    m.set_residency(1, "serving")
    clock.t += 10
    m.set_residency(2, "lent")
    clock.t += 5
    assert sample(reg, "rose_driver_lent_gpus", "pool-a") == 2
    assert sample(reg, "rose_driver_lent_gpu_seconds_total", "pool-a") == 1 * 10 + 2 * 5
    m.set_residency(0, "serving")  # serving took the GPU back (the occupant is suspended)
    m.set_residency(2, "none")
    clock.t += 100
    assert sample(reg, "rose_driver_lent_gpus", "pool-a") == 0
    assert sample(reg, "rose_driver_lent_gpu_seconds_total", "pool-a") == 20
    text = generate_latest(reg).decode()
    assert "# TYPE rose_driver_lent_gpu_seconds_total counter" in text
    assert 'rose_driver_lent_gpus{pool="pool-a"} 0.0' in text
